"""``hpcnas run``: the composition root of a search (one process, or every MPI rank).

``launch(config, resume=...)`` is ``hpcnas run`` / ``hpcnas resume`` on every rank: the
storage checked first, the metrics server and the progress, then ``run_search(config)``,
which wires the study and its budget, the evaluation core (``optuna_hpcnas.evaluation``), the
MPI groups and engines (``optuna_hpcnas.distributed``), each leader's ``LeaderQueue`` (every
storage call of a leader through one ``StudyCalls``) and the checkpoints around a
``GroupLoop``; ``configure_threads`` gives each process its share of the cores, and
``relaunch_command`` re-runs ``hpcnas run`` under ``mpirun`` for ``[distributed] processes``.
"""

from __future__ import annotations

from optuna_hpcnas._records import utilisation_from_study
from optuna_hpcnas._threads import configure_threads
from optuna_hpcnas._threads import thread_share
from optuna_hpcnas.run._launch import launch
from optuna_hpcnas.run._launch import Launched
from optuna_hpcnas.run._launch import LaunchError
from optuna_hpcnas.run._launch import StorageLost
from optuna_hpcnas.run._processes import follow_launcher
from optuna_hpcnas.run._processes import local_processes
from optuna_hpcnas.run._processes import relaunch_command
from optuna_hpcnas.run._processes import run_relaunched
from optuna_hpcnas.run._search import build_objective
from optuna_hpcnas.run._search import run_search

__all__ = [
    "LaunchError",
    "Launched",
    "StorageLost",
    "build_objective",
    "configure_threads",
    "follow_launcher",
    "launch",
    "local_processes",
    "relaunch_command",
    "run_relaunched",
    "run_search",
    "thread_share",
    "utilisation_from_study",
]
