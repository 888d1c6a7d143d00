"""The weight-sharing supernet: shared candidate operators, subnets and pipeline layers.

``SupernetTrainingConfig`` imports no torch; everything else loads torch on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna_hpcnas._lazy import lazy_attributes
from optuna_hpcnas.supernet._config import PathSampling
from optuna_hpcnas.supernet._config import Precision
from optuna_hpcnas.supernet._config import SupernetTrainingConfig

if TYPE_CHECKING:
    from optuna_hpcnas.supernet._few_shot import decision_disagreement
    from optuna_hpcnas.supernet._few_shot import FewShotSuperNet
    from optuna_hpcnas.supernet._layers import CellLayer
    from optuna_hpcnas.supernet._ops import SharedOp
    from optuna_hpcnas.supernet._supernet import layer_recipes
    from optuna_hpcnas.supernet._supernet import LayerRecipe
    from optuna_hpcnas.supernet._supernet import RecipeLayer
    from optuna_hpcnas.supernet._supernet import SuperNet
    from optuna_hpcnas.supernet._training import cosine_lr
    from optuna_hpcnas.supernet._training import recalibrate_batch_norm
    from optuna_hpcnas.supernet._training import StepResult
    from optuna_hpcnas.supernet._training import SupernetTrainer
    from optuna_hpcnas.supernet._training import train_step

# Names whose modules import torch, loaded on first use: the torch-free configuration
# classes above can then be imported (by a run configuration) without torch.
_LAZY = {
    "decision_disagreement": "optuna_hpcnas.supernet._few_shot",
    "FewShotSuperNet": "optuna_hpcnas.supernet._few_shot",
    "CellLayer": "optuna_hpcnas.supernet._layers",
    "SharedOp": "optuna_hpcnas.supernet._ops",
    "layer_recipes": "optuna_hpcnas.supernet._supernet",
    "LayerRecipe": "optuna_hpcnas.supernet._supernet",
    "RecipeLayer": "optuna_hpcnas.supernet._supernet",
    "SuperNet": "optuna_hpcnas.supernet._supernet",
    "cosine_lr": "optuna_hpcnas.supernet._training",
    "recalibrate_batch_norm": "optuna_hpcnas.supernet._training",
    "StepResult": "optuna_hpcnas.supernet._training",
    "SupernetTrainer": "optuna_hpcnas.supernet._training",
    "train_step": "optuna_hpcnas.supernet._training",
}
__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "CellLayer",
    "FewShotSuperNet",
    "LayerRecipe",
    "PathSampling",
    "Precision",
    "RecipeLayer",
    "SharedOp",
    "StepResult",
    "SuperNet",
    "SupernetTrainer",
    "SupernetTrainingConfig",
    "cosine_lr",
    "decision_disagreement",
    "layer_recipes",
    "recalibrate_batch_norm",
    "train_step",
]
