"""``hpcnas storage-proxy``: one gRPC server in front of an RDB storage for many workers.

Optuna's gRPC proxy lets many workers share one database through one process: workers open
``grpc://host:port`` (see :func:`open_storage`), the proxy holds the database connections and
Optuna's storage cache. The CLI registers the sub-command in one line with
:func:`add_storage_proxy_arguments` and :func:`storage_proxy_command`.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING
import warnings

from optuna_hpcnas._records import grpc_proxy_server
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_str
from optuna_hpcnas.storages._open import describe_storage
from optuna_hpcnas.storages._open import open_storage
from optuna_hpcnas.storages._open import StorageError
from optuna_hpcnas.storages._urls import mask_url
from optuna_hpcnas.storages._urls import storage_kind

if TYPE_CHECKING:
    import grpc

_logger = logging.getLogger(__name__)

DEFAULT_PROXY_HOST = "127.0.0.1"
DEFAULT_PROXY_PORT = 13000


def start_storage_proxy(
    url: str, *, host: str = DEFAULT_PROXY_HOST, port: int = DEFAULT_PROXY_PORT
) -> grpc.Server:
    """Start serving the RDB storage ``url`` over gRPC on ``host:port``; returns the server.

    The server runs in background threads until ``server.stop(grace)``;
    :func:`run_storage_proxy` is the blocking form the CLI uses.

    Raises:
        StorageError: ``url`` cannot be opened, is not an RDB storage, or the port is taken.
    """
    import optuna
    from optuna.exceptions import ExperimentalWarning

    check_int("port", port, 1, maximum=65535)
    check_str("host", host, what="a host name or address", nonempty=True)
    if storage_kind(url) in ("journal-file", "journal-redis", "grpc"):
        raise StorageError(
            f"Cannot proxy {describe_storage(url)}: the gRPC proxy serves RDB storages only "
            "(Optuna's proxy does not support journals, optuna/optuna#6084; a journal is "
            "shared without a server)."
        )
    try:
        import grpc  # noqa: F401
    except ImportError:
        raise StorageError(
            "hpcnas storage-proxy needs the Python package 'grpcio'; install optuna-hpcnas[grpc]"
        ) from None

    # get_storage adds Optuna's in-process cache, which its docs ask for behind a proxy.
    storage = optuna.storages.get_storage(open_storage(url))
    # This is optuna.storages.run_grpc_proxy_server (make_server, start, wait) split in two,
    # with one change: gRPC binds with SO_REUSEPORT by default, so a second proxy on a taken
    # port would silently share it with the first. Without it a taken port is an error here.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            server = grpc_proxy_server(storage, host, port)
    except RuntimeError as e:
        raise StorageError(f"Cannot serve {describe_storage(url)} on {host}:{port}: {e}") from None
    server.start()
    _logger.info("gRPC storage proxy for %s listening on %s:%d", mask_url(url), host, port)
    return server


def run_storage_proxy(
    url: str, *, host: str = DEFAULT_PROXY_HOST, port: int = DEFAULT_PROXY_PORT
) -> None:
    """Serve the RDB storage ``url`` over gRPC on ``host:port`` until SIGINT/SIGTERM.

    Binds 127.0.0.1 unless told otherwise: the proxy has no authentication, so expose it only
    on a trusted network. Journal storages are refused (see :func:`start_storage_proxy`).

    Examples:
        .. code-block:: console

            $ hpcnas storage-proxy --storage postgresql+psycopg://nas@db/optuna --host 0.0.0.0
            $ hpcnas run --storage grpc://proxy-node:13000 ...   # on every worker
    """
    import signal
    import threading

    server = start_storage_proxy(url, host=host, port=port)
    done = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (Slurm, Kubernetes) stops the proxy cleanly, as Ctrl-C does.
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        server.stop(grace=5).wait()
        _logger.info("gRPC storage proxy on %s:%d stopped", host, port)


def add_storage_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcnas storage-proxy``: ``--storage URL [--host H] [--port P]``."""
    parser.add_argument(
        "--storage",
        default=None,
        help="RDB URL to serve (default: $OPTUNA_STORAGE, so the password stays out of ps).",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_PROXY_HOST,
        help=f"address to listen on (default {DEFAULT_PROXY_HOST}; the proxy has no "
        "authentication).",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PROXY_PORT, help=f"port (default {DEFAULT_PROXY_PORT})"
    )


def storage_proxy_command(args: argparse.Namespace) -> int:
    """Run ``hpcnas storage-proxy``; returns the exit status (2 and one line on a bad storage)."""
    import sys

    url = args.storage or os.environ.get("OPTUNA_STORAGE")
    if not url:
        print("hpcnas storage-proxy: give --storage URL or set OPTUNA_STORAGE", file=sys.stderr)
        return 2
    try:
        run_storage_proxy(url, host=args.host, port=args.port)
    except (StorageError, TypeError, ValueError) as e:
        print(f"hpcnas storage-proxy: {mask_url(str(e))}", file=sys.stderr)
        return 2
    return 0
