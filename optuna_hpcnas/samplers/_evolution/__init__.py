from __future__ import annotations

from optuna_hpcnas.samplers._evolution._sampler import EvolutionarySampler

__all__ = ["EvolutionarySampler"]
