"""The default independent sampler of both samplers: uniform draws from a stream per trial.

Optuna's ``RandomSampler(seed)`` draws from one stream per process, so workers built with the
same seed draw the same values for their first trials (those asked before any trial has
finished, when the relative search space is still empty): a duplicate that no claim can
prevent, since such parameters are drawn one by one. Here each trial number gets its own
``RandomSampler``, seeded by ``(seed, number)``; trial 0 keeps ``RandomSampler(seed)``'s
draws, so a single-process study is unchanged.
"""

from __future__ import annotations

from typing import Any
from typing import TYPE_CHECKING

import numpy as np
from optuna.samplers import BaseSampler
from optuna.samplers import RandomSampler

if TYPE_CHECKING:
    from collections.abc import Sequence

    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial
    from optuna.trial import TrialState

# Trials whose streams are kept (parameters of one trial are drawn from one stream).
_KEEP = 64


class PerTrialRandomSampler(BaseSampler):
    """``RandomSampler`` with a stream per trial number, seeded by ``(seed, number)``."""

    def __init__(self, seed: int) -> None:
        self._seed = int(seed) % 2**32
        self._streams: dict[int, RandomSampler] = {}

    def reseed_rng(self) -> None:
        self._seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._streams.clear()

    def _stream(self, number: int) -> RandomSampler:
        stream = self._streams.get(number)
        if stream is None:
            seed = self._seed
            if number:
                seed = int(np.random.SeedSequence([self._seed, number]).generate_state(1)[0])
            stream = self._streams[number] = RandomSampler(seed=seed)
            if len(self._streams) > _KEEP:
                del self._streams[min(self._streams)]
        return stream

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        stream = self._stream(trial.number)
        return stream.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._streams.pop(trial.number, None)
