"""Hierarchical search spaces: topology, operators, micro parameters and cluster layout."""

from __future__ import annotations

from optuna_hpcnas.search_space._architecture import Architecture
from optuna_hpcnas.search_space._architecture import CellConfig
from optuna_hpcnas.search_space._architecture import ClusterConfig
from optuna_hpcnas.search_space._input_fit import fit_to_input
from optuna_hpcnas.search_space._input_fit import InputFit
from optuna_hpcnas.search_space._input_fit import MAX_POSITIONS
from optuna_hpcnas.search_space._input_fit import pooling_factor
from optuna_hpcnas.search_space._input_fit import stem_positions
from optuna_hpcnas.search_space._operators import OperatorRegistry
from optuna_hpcnas.search_space._operators import OperatorSpec
from optuna_hpcnas.search_space._presets import reference_models
from optuna_hpcnas.search_space._presets import SIGNAL_1D_BASELINES
from optuna_hpcnas.search_space._presets import SIGNAL_1D_PAPER_MODELS
from optuna_hpcnas.search_space._presets import SIGNAL_ELASTIC_BASELINES
from optuna_hpcnas.search_space._space import Decision
from optuna_hpcnas.search_space._space import HierarchicalSearchSpace
from optuna_hpcnas.search_space._space import Level
from optuna_hpcnas.search_space._targets import target_names
from optuna_hpcnas.search_space._targets import target_profile
from optuna_hpcnas.search_space._targets import TargetProfile

__all__ = [
    "Architecture",
    "CellConfig",
    "ClusterConfig",
    "Decision",
    "HierarchicalSearchSpace",
    "InputFit",
    "Level",
    "MAX_POSITIONS",
    "OperatorRegistry",
    "OperatorSpec",
    "SIGNAL_1D_BASELINES",
    "SIGNAL_ELASTIC_BASELINES",
    "SIGNAL_1D_PAPER_MODELS",
    "TargetProfile",
    "fit_to_input",
    "pooling_factor",
    "reference_models",
    "stem_positions",
    "target_names",
    "target_profile",
]
