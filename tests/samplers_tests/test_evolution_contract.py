"""Optuna's shipped sampler contract suites, run against ``EvolutionarySampler``."""

from __future__ import annotations

from collections.abc import Callable

from optuna.samplers import BaseSampler
from optuna.testing.pytest_samplers import BasicSamplerTestCase
from optuna.testing.pytest_samplers import MultiObjectiveSamplerTestCase
from optuna.testing.pytest_samplers import RelativeSamplerTestCase
import pytest

from optuna_hpcnas.samplers import EvolutionarySampler


class TestEvolutionarySampler(
    BasicSamplerTestCase, RelativeSamplerTestCase, MultiObjectiveSamplerTestCase
):
    @pytest.fixture(params=["evolving", "default"])
    def sampler(self, request: pytest.FixtureRequest) -> Callable[[], BaseSampler]:
        if request.param == "default":
            return lambda: EvolutionarySampler(seed=0)
        # Evolution starts after one finished trial, so the relative suites exercise mutation
        # and crossover on every distribution, not only the random start.
        return lambda: EvolutionarySampler(
            population_size=4, tournament_size=2, n_startup_trials=1, crossover_prob=0.5, seed=0
        )
