"""The default independent sampler draws from a stream per trial (issue 14): same-seeded
workers asking before any trial finished do not draw the same first architectures."""

from __future__ import annotations

import optuna
import pytest

from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler


def _suggest(trial: optuna.Trial) -> tuple[int, ...]:
    return tuple(trial.suggest_categorical(f"x{i}", [0, 1, 2, 3]) for i in range(6))


def _running_asks(make: type, n: int) -> list[tuple[int, ...]]:
    """``n`` workers (sampler objects built with the same seed, as processes would build
    them) on one storage ask at once: no trial has finished, so nothing is relative."""
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(study_name="s", storage=storage)
    workers = [optuna.load_study(study_name="s", storage=storage, sampler=make(seed=0))]
    workers += [
        optuna.load_study(study_name="s", storage=storage, sampler=make(seed=0))
        for _ in range(n - 1)
    ]
    return [_suggest(w.ask()) for w in workers]


@pytest.mark.parametrize("make", [EvolutionarySampler, QUBOSampler])
def test_concurrent_first_trials_draw_different_architectures(make: type) -> None:
    codes = _running_asks(make, 8)
    assert len(set(codes)) == 8  # one process-wide RandomSampler(0) per worker: 1 code


@pytest.mark.parametrize("make", [EvolutionarySampler, QUBOSampler])
def test_trial_zero_draws_as_random_sampler_with_the_same_seed(make: type) -> None:
    ours = _running_asks(make, 1)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    assert ours == [_suggest(study.ask())]
