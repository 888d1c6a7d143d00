"""Pruners: ``StagedPruner`` (quick / medium / full stages, promotion, early stopping)."""

from __future__ import annotations

from optuna_hpcnas.pruners._staged import Stage
from optuna_hpcnas.pruners._staged import StagedPruner
from optuna_hpcnas.pruners._staged import StagePlan

__all__ = ["Stage", "StagePlan", "StagedPruner"]
