"""``EvolutionarySampler`` of optuna-hpcnas: this package re-exports it, so the sampler has one
implementation, released and tested with the library (``pip install optuna-hpcnas``)."""

from __future__ import annotations


try:
    from optuna_hpcnas.samplers import EvolutionarySampler
except ImportError as e:
    raise ImportError(
        "samplers/hpcnas_evolutionary needs optuna-hpcnas: pip install optuna-hpcnas"
    ) from e


__all__ = ["EvolutionarySampler"]
