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

__all__ = [
    "CellLayer",
    "LayerRecipe",
    "RecipeLayer",
    "SharedOp",
    "SuperNet",
    "layer_recipes",
]
