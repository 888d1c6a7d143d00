"""The weight-sharing supernet: shared candidate operators, subnets and pipeline layers.

Importing this package imports torch.
"""

from __future__ import annotations

from optuna_hpcnas.supernet._layers import CellLayer
from optuna_hpcnas.supernet._ops import SharedOp
from optuna_hpcnas.supernet._supernet import layer_recipes
from optuna_hpcnas.supernet._supernet import LayerRecipe
from optuna_hpcnas.supernet._supernet import RecipeLayer
from optuna_hpcnas.supernet._supernet import SuperNet
from optuna_hpcnas.supernet._training import PathSampling
from optuna_hpcnas.supernet._training import Precision
from optuna_hpcnas.supernet._training import recalibrate_batch_norm
from optuna_hpcnas.supernet._training import StepResult
from optuna_hpcnas.supernet._training import SupernetTrainer
from optuna_hpcnas.supernet._training import SupernetTrainingConfig
from optuna_hpcnas.supernet._training import train_step

__all__ = [
    "CellLayer",
    "LayerRecipe",
    "RecipeLayer",
    "SharedOp",
    "PathSampling",
    "Precision",
    "StepResult",
    "SuperNet",
    "SupernetTrainer",
    "SupernetTrainingConfig",
    "recalibrate_batch_norm",
    "train_step",
    "layer_recipes",
]
