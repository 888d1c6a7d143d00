"""A worker that dies with SIGKILL at a chosen moment of its trial (run as a module)."""

from __future__ import annotations

import os
import signal
import sys

import optuna

from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import TrialLease


def main() -> None:
    url, study_name, moment = sys.argv[1:4]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=open_storage(url))
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    trial.set_user_attr("worker", os.getpid())
    if moment == "in-lease":
        lease = TrialLease(trial, interval=0.3, grace_period=1.0)
        lease.__enter__()
    print(trial.number, flush=True)
    # The moment the issue names: the trial is RUNNING, nothing else happened yet.
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
