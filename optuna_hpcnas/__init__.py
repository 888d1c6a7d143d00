"""optuna-hpcnas: neural architecture search for Optuna, from a laptop to an HPC cluster.

Importing this package loads neither torch, deepspeed nor mpi4py; those come with the
components that need them. It sets ``OMP_WAIT_POLICY=passive`` unless the environment says
otherwise (as the ``hpcnas`` command does), so torch's OpenMP threads, if torch is loaded
after it, sleep instead of spinning while they wait.
"""

from __future__ import annotations

from optuna_hpcnas._lazy import lazy_attributes
from optuna_hpcnas._openmp import passive_openmp
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import CellConfig
from optuna_hpcnas.search_space import ClusterConfig
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.search_space import Level
from optuna_hpcnas.search_space import OperatorRegistry
from optuna_hpcnas.search_space import OperatorSpec

passive_openmp()  # none of the imports above loads torch

__version__ = "0.1.0"

__all__ = [
    "Architecture",
    "CellConfig",
    "ClusterConfig",
    "HierarchicalSearchSpace",
    "Level",
    "OperatorRegistry",
    "OperatorSpec",
    "__version__",
]


# Lazy public names backed by torch (``import optuna_hpcnas`` must not import torch).
_LAZY = {
    "SuperNet": "optuna_hpcnas.supernet",
    "SupernetObjective": "optuna_hpcnas.evaluation",
}
__getattr__ = lazy_attributes(__name__, _LAZY)
