"""``main``: parse, set up logging, dispatch to the command, turn user errors into one
line and exit status 2."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import logging
import signal
import sys
from typing import TYPE_CHECKING

from optuna_hpcnas._cli_util import MaskingFilter
from optuna_hpcnas.cli._common import CLIError
from optuna_hpcnas.cli._common import quiet_exporter_logs
from optuna_hpcnas.cli._export import cmd_dashboard
from optuna_hpcnas.cli._export import cmd_deploy
from optuna_hpcnas.cli._export import cmd_export
from optuna_hpcnas.cli._export import cmd_serve
from optuna_hpcnas.cli._export import cmd_storage_proxy
from optuna_hpcnas.cli._init import cmd_init
from optuna_hpcnas.cli._init import cmd_template
from optuna_hpcnas.cli._parser import build_parser
from optuna_hpcnas.cli._reading import cmd_best
from optuna_hpcnas.cli._reading import cmd_status
from optuna_hpcnas.cli._run import cmd_run
from optuna_hpcnas.cli._run import exit_on_signals
from optuna_hpcnas.distributed import launched_rank_and_size
from optuna_hpcnas.storages import mask_url

if TYPE_CHECKING:
    pass


_logger = logging.getLogger("optuna_hpcnas.cli")


def _setup_logging(verbose: int, quiet: bool, rank: int) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if rank != 0 and not verbose:
        level = logging.WARNING  # rank 0 speaks for the job
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(MaskingFilter())
    prefix = f"[rank {rank}] " if rank else ""
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if verbose < 2:
        quiet_exporter_logs()
    import optuna

    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    optuna.logging.set_verbosity(level if verbose else max(level, logging.WARNING))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hpcnas`` and ``python -m optuna_hpcnas``; returns the exit status."""
    from optuna_hpcnas._openmp import passive_openmp

    passive_openmp()  # before anything loads torch: its OpenMP reads the variable once
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `processes` re-runs
    if args.command is None:
        parser.print_help()
        return 2
    previous = exit_on_signals() if args.command in ("run", "resume") else {}
    try:
        return _dispatch(args)
    finally:  # main() called in a process that goes on (tests, notebooks)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _dispatch(args: argparse.Namespace) -> int:
    rank, _ = launched_rank_and_size()
    _setup_logging(args.verbose, args.quiet, rank)
    commands = {
        "init": cmd_init,
        "run": lambda a: cmd_run(a, resume=False),
        "resume": lambda a: cmd_run(a, resume=True),
        "status": cmd_status,
        "best": cmd_best,
        "export": cmd_export,
        "deploy": cmd_deploy,
        "serve": cmd_serve,
        "storage-proxy": cmd_storage_proxy,
        "dashboard": cmd_dashboard,
        "template": cmd_template,
    }
    try:
        return commands[args.command](args)
    except CLIError as e:
        print(f"hpcnas {args.command}: error: {mask_url(str(e))}", file=sys.stderr)
        if args.command in ("run", "resume") and launched_rank_and_size()[1] > 1:
            from optuna_hpcnas.distributed import finalize_mpi

            sys.stderr.flush()
            finalize_mpi(2)  # exit 2 on every rank, not python -m mpi4py's MPI_Abort
        return 2
    except KeyboardInterrupt:
        print("hpcnas: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpcnas best | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
