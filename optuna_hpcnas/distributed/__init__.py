"""Distributed evaluation: MPI evaluation groups, DeepSpeed engines, scheduling, averaging.

The parts ``optuna_hpcnas.run`` composes for ``hpcnas run``; launch with
``mpirun -n N python -m mpi4py -m optuna_hpcnas run --config nas.toml``. Never imports the run
configuration. Importing this package imports neither torch, deepspeed nor mpi4py; the
functions that need them import them.
"""

from __future__ import annotations

from optuna_hpcnas.distributed._config import DistributedConfig
from optuna_hpcnas.distributed._groups import assign_groups
from optuna_hpcnas.distributed._groups import Comm
from optuna_hpcnas.distributed._groups import EvaluationGroup
from optuna_hpcnas.distributed._groups import finalize_mpi
from optuna_hpcnas.distributed._groups import form_groups
from optuna_hpcnas.distributed._groups import launched_rank_and_size
from optuna_hpcnas.distributed._groups import Placement
from optuna_hpcnas.distributed._groups import rank_context
from optuna_hpcnas.distributed._groups import RankContext
from optuna_hpcnas.distributed._protocol import GroupChannel
from optuna_hpcnas.distributed._protocol import GroupError
from optuna_hpcnas.distributed._protocol import Stop
from optuna_hpcnas.distributed._protocol import TrialTask
from optuna_hpcnas.distributed._scheduler import DynamicScheduler
from optuna_hpcnas.distributed._scheduler import Task
from optuna_hpcnas.distributed._utilisation import CATEGORIES
from optuna_hpcnas.distributed._utilisation import RankUtilisation
from optuna_hpcnas.distributed._utilisation import UtilisationTracker

__all__ = [
    "CATEGORIES",
    "Comm",
    "DistributedConfig",
    "DynamicScheduler",
    "EvaluationGroup",
    "GroupChannel",
    "GroupError",
    "Placement",
    "RankContext",
    "RankUtilisation",
    "Stop",
    "Task",
    "TrialTask",
    "UtilisationTracker",
    "assign_groups",
    "finalize_mpi",
    "form_groups",
    "launched_rank_and_size",
    "rank_context",
]
