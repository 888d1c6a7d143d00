"""Serving ``/metrics``: one HTTP endpoint on 127.0.0.1, merging all MPI ranks when asked.

``prometheus_client`` chooses single- or multi-process storage once, when it is first
imported, from ``PROMETHEUS_MULTIPROC_DIR``. ``enable_multiprocess`` sets that variable before
that import (and refuses once it is too late), so every rank writes its values to files in one
directory and the rank that serves merges them at scrape time.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
import os
from pathlib import Path
import sys
import threading
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas._validation import check_int

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from optuna_hpcnas.metrics._metrics import SearchMetrics

_logger = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9464
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def enable_multiprocess(directory: str | os.PathLike[str], *, clean: bool = False) -> Path:
    """Store metric values as files in ``directory`` so that several processes add up.

    Call it on every rank before anything imports ``prometheus_client`` (before the first
    ``SearchMetrics`` or ``serve_metrics``), or export ``PROMETHEUS_MULTIPROC_DIR`` in the job
    script. ``clean=True`` (rank 0, before the other ranks start) removes the files a previous
    job left.

    Raises:
        RuntimeError: ``prometheus_client`` was imported before, with another directory or
            none: its metrics would stay in memory and never reach the merged ``/metrics``.
    """
    path = Path(directory)
    if "prometheus_client" in sys.modules and not _same_dir(multiprocess_dir(), path):
        raise RuntimeError(
            f"`enable_multiprocess` must run before prometheus_client is imported, but it "
            f"was imported with {MULTIPROC_ENV}={multiprocess_dir()!r}, not {str(path)!r}: "
            f"call it first in the process, or export {MULTIPROC_ENV} before Python starts."
        )
    path.mkdir(parents=True, exist_ok=True)
    if clean:
        for f in path.glob("*.db"):
            f.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def _same_dir(current: str | None, path: Path) -> bool:
    return current is not None and os.path.abspath(current) == os.path.abspath(path)


def multiprocess_dir() -> str | None:
    """The multi-process directory in use, or ``None``."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(
    source: SearchMetrics | CollectorRegistry | None = None,
    *,
    port: int = DEFAULT_METRICS_PORT,
    host: str = "127.0.0.1",
) -> MetricsServer:
    """Serve ``/metrics`` in a background thread, bound to ``host`` (loopback by default).

    With ``PROMETHEUS_MULTIPROC_DIR`` set the values of every process writing there are
    merged (``source`` is then ignored); otherwise ``source``'s registry is served. ``port=0``
    picks a free port (see ``MetricsServer.port``).
    """
    import prometheus_client as pc
    from prometheus_client import multiprocess

    from optuna_hpcnas.metrics._metrics import SearchMetrics

    check_int("port", port, 0, maximum=65535)
    directory = multiprocess_dir()
    if directory is not None:
        registry = pc.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
    elif isinstance(source, SearchMetrics):
        registry = source.registry
    elif source is None:
        registry = pc.REGISTRY
    elif isinstance(source, pc.CollectorRegistry):
        registry = source
    else:
        raise TypeError(
            f"`source` must be a SearchMetrics or CollectorRegistry, but got {source!r}."
        )
    if host not in ("127.0.0.1", "localhost", "::1"):
        _logger.warning("Serving metrics on %s: reachable from other machines.", host)
    server, thread = pc.start_http_server(port, addr=host, registry=registry)
    actual = int(server.server_address[1])
    _logger.info("Prometheus metrics on http://%s:%d/metrics", host, actual)
    return MetricsServer(host=host, port=actual, _server=server, _thread=thread)
