"""Optuna samplers for neural architecture search."""

from __future__ import annotations

from optuna_hpcnas.samplers._evolution import EvolutionarySampler

__all__ = [
    "EvolutionarySampler",
]
