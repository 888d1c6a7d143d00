"""Optuna samplers for architecture search."""

from __future__ import annotations

from optuna_hpcnas.samplers._qubo import QUBOSampler

__all__ = [
    "QUBOSampler",
]
