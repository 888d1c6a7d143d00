"""``hpcnas run`` and ``hpcnas resume``: a search from a TOML config, on every rank, and the
signals that end it before its trials start or after they end."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas.cli._common import CLIError
from optuna_hpcnas.cli._common import read_config
from optuna_hpcnas.cli._common import STORAGE_ENV
from optuna_hpcnas.storages import mask_url

if TYPE_CHECKING:
    from optuna_hpcnas.config import RunConfig


_logger = logging.getLogger("optuna_hpcnas.cli")


# ---------------------------------------------------------------------------- run / resume
def _run_config(args: argparse.Namespace) -> RunConfig:
    """``--config`` with ``--set`` and the typed flags on top."""
    flags = {
        "study.n_trials": args.n_trials,
        "study.storage": args.storage or None,
        "study.name": args.study_name or None,
    }
    return read_config(args.config, args.set, {k: v for k, v in flags.items() if v is not None})


def cmd_run(args: argparse.Namespace, *, resume: bool) -> int:
    from optuna_hpcnas.distributed import finalize_mpi
    from optuna_hpcnas.run import follow_launcher
    from optuna_hpcnas.run import launch
    from optuna_hpcnas.run import LaunchError
    from optuna_hpcnas.run import relaunch_command
    from optuna_hpcnas.run import run_relaunched
    from optuna_hpcnas.run import StorageLost

    follow_launcher()  # a rank that `hpcnas run` started stops when that process is gone
    config = _run_config(args)
    try:
        command = relaunch_command(config, args.argv)
        if command is not None:  # [distributed] processes: this machine's ranks, as mpirun
            return run_relaunched(command)
        done = launch(config, resume=resume, progress=not args.no_progress)
    except StorageLost as e:  # every rank, each in its own time: no MPI_Abort
        print(f"hpcnas {args.command}: error: {mask_url(str(e))}", file=sys.stderr, flush=True)
        finalize_mpi(e.exit_status)
        return e.exit_status
    except LaunchError as e:
        raise CLIError(str(e)) from None
    if done.rank != 0:
        return 0
    name, storage = done.study_name, done.storage
    if not done.ran:
        print(f"study {name!r} has no trial left to run; see `hpcnas status`")
        return 0
    info = done.status or {}
    states = ", ".join(f"{v} {k.lower()}" for k, v in info.get("by_state", {}).items() if v)
    print(f"study {name!r}: {states}")
    waiting = info.get("by_state", {}).get("WAITING", 0)
    if waiting:
        print(f"{waiting} waiting trials are the budget's rest: `hpcnas resume` runs them")
    if "best" in info:
        b = info["best"]
        print(f"best: trial {b['trial']} {b['values'][0]:.6g}  {b['architecture']}")
    flag = "" if os.environ.get(STORAGE_ENV) == storage else f" --storage {mask_url(storage)}"
    print(f"next: hpcnas best{flag} --study-name {name}")
    print(f"      hpcnas dashboard{flag}")
    return 0


def load_data(config: Any) -> Any:
    """The task of ``[data]`` (every rank loads its own), or its ``DataError`` as one
    ``CLIError`` line."""
    from optuna_hpcnas.data import DataError

    try:
        return config.load()
    except DataError as e:
        raise CLIError(f"[data] {e}") from None


def exit_on_signals() -> dict[signal.Signals, Any]:
    """``hpcnas run``/``resume``: SIGTERM and SIGUSR1 end the process with 128 + signal from
    its first moment, before the run's ``PreemptionGuard`` takes over around the trials (the
    data loading, the study's creation, the supernet warm-up: no trial is taken yet) and after
    it (the last checkpoint, the plots). Without it they would kill the process outright.
    Returns the handlers it replaced."""

    import threading

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return {}  # handlers can only be set there (main() run by a caller's thread)
    return {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGUSR1)}
