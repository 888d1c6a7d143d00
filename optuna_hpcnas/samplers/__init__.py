"""Optuna samplers for neural architecture search."""

from __future__ import annotations

from optuna_hpcnas.samplers._config import SamplerConfig
from optuna_hpcnas.samplers._evolution import EvolutionarySampler
from optuna_hpcnas.samplers._qubo import QUBOSampler

__all__ = [
    "EvolutionarySampler",
    "QUBOSampler",
    "SamplerConfig",
]
