"""Evaluation of architectures: stand-alone training, FLOPs, parameters, latency.

Importing this package imports torch.
"""

from __future__ import annotations

from optuna_hpcnas.evaluation._latency import LatencyPredictor
from optuna_hpcnas.evaluation._measure import count_flops
from optuna_hpcnas.evaluation._measure import count_parameters
from optuna_hpcnas.evaluation._measure import measure_latency
from optuna_hpcnas.evaluation._objective import ObjectiveConfig
from optuna_hpcnas.evaluation._objective import SupernetObjective
from optuna_hpcnas.evaluation._train import evaluate
from optuna_hpcnas.evaluation._train import ScratchTrainingConfig
from optuna_hpcnas.evaluation._train import train_from_scratch

__all__ = [
    "LatencyPredictor",
    "ObjectiveConfig",
    "SupernetObjective",
    "ScratchTrainingConfig",
    "count_flops",
    "count_parameters",
    "evaluate",
    "measure_latency",
    "train_from_scratch",
]
