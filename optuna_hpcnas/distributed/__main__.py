"""``python -m mpi4py -m optuna_hpcnas.distributed --config nas.toml [--set key=value ...]``.

The same entry as ``hpcnas run``; every rank runs it. An exception on any rank aborts the
whole job (``MPI.Abort``) instead of leaving the other ranks waiting in a collective.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mpi4py -m optuna_hpcnas.distributed",
        description="Run an architecture search on every rank of an MPI job.",
    )
    parser.add_argument("--config", required=True, help="TOML run configuration")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one configuration key (TOML value); repeatable",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)

    from optuna_hpcnas.config import load_config
    from optuna_hpcnas.distributed import run_search
    from optuna_hpcnas.distributed._groups import world_comm

    comm = world_comm()
    rank = comm.Get_rank()
    logging.basicConfig(
        level=args.log_level.upper() if rank == 0 else logging.WARNING,
        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config, args.overrides)
        run_search(config, comm=comm)
    except BaseException:
        if comm.Get_size() > 1:
            logging.getLogger(__name__).exception("Rank %d failed; aborting the job.", rank)
            sys.stderr.flush()
            comm.Abort(1)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
