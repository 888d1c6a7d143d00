"""The one place that imports Optuna internals the samplers rely on."""

from __future__ import annotations

# ``constraints_func`` is evaluated and stored exactly as TPESampler, GPSampler and
# NSGAIISampler do it, so ``FrozenTrial.constraints`` reads it back for every sampler.
from optuna.samplers._base import (
    _process_constraints_after_trial as process_constraints_after_trial,
)

__all__ = ["process_constraints_after_trial"]
