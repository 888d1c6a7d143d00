"""``QUBOSampler`` of optuna-hpcnas: this package re-exports it, so the sampler has one
implementation, released and tested with the library (``pip install optuna-hpcnas``, which
brings dimod and dwave-samplers for the annealing)."""

from __future__ import annotations


try:
    from optuna_hpcnas.samplers import QUBOSampler
except ImportError as e:
    raise ImportError("samplers/hpcnas_qubo needs optuna-hpcnas: pip install optuna-hpcnas") from e


__all__ = ["QUBOSampler"]
