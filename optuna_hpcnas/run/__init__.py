"""``hpcnas run``: the composition root of a search (one process, or every MPI rank).

``run_search(config)`` wires the study and its budget, the evaluation core
(``optuna_hpcnas.evaluation``), the MPI groups and engines (``optuna_hpcnas.distributed``)
and the checkpoints; ``configure_threads`` gives each process its share of the cores.
"""

from __future__ import annotations

from optuna_hpcnas._records import utilisation_from_study
from optuna_hpcnas.run._search import build_objective
from optuna_hpcnas.run._search import run_search
from optuna_hpcnas.run._threads import configure_threads
from optuna_hpcnas.run._threads import thread_share

__all__ = [
    "build_objective",
    "configure_threads",
    "run_search",
    "thread_share",
    "utilisation_from_study",
]
