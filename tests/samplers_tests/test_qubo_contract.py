"""Optuna's shipped sampler contract suites, run against QUBOSampler."""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.testing.pytest_samplers import BasicSamplerTestCase
from optuna.testing.pytest_samplers import MultiObjectiveSamplerTestCase
from optuna.testing.pytest_samplers import RelativeSamplerTestCase
import pytest

from optuna_hpcnas.samplers import QUBOSampler


class TestQUBOSamplerWithFloatGrid(
    BasicSamplerTestCase, RelativeSamplerTestCase, MultiObjectiveSamplerTestCase
):
    """Every case of the suites: floats are searched on a 5-point grid."""

    @pytest.fixture
    def sampler(self) -> Callable[[], optuna.samplers.BaseSampler]:
        return lambda: QUBOSampler(n_startup_trials=1, discretize_floats=5, num_reads=8)


class TestQUBOSamplerCategoricalOnly(RelativeSamplerTestCase):
    """The default sampler (floats rejected) on the cases without floats."""

    @pytest.fixture
    def sampler(self) -> Callable[[], optuna.samplers.BaseSampler]:
        return lambda: QUBOSampler(seed=0, n_startup_trials=1, num_reads=8)

    test_sample_relative_numerical = None  # type: ignore[assignment]
    test_sample_relative_mixed = None  # type: ignore[assignment]
    test_trial_relative_params = None  # type: ignore[assignment]

    @pytest.mark.parametrize("choices", [(1, 2, 3), ("a", "b", "c"), (1, "a")])
    def test_categorical(
        self, sampler: Callable[[], optuna.samplers.BaseSampler], choices: tuple
    ) -> None:
        BasicSamplerTestCase.test_categorical(self, sampler, choices)  # type: ignore[arg-type]

    def test_conditional_sample_independent(
        self, sampler: Callable[[], optuna.samplers.BaseSampler]
    ) -> None:
        BasicSamplerTestCase.test_conditional_sample_independent(self, sampler)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "suggest",
        [
            lambda t: t.suggest_int("x", 0, 10),
            lambda t: t.suggest_categorical("x", [0, 1, 2]),
            lambda t: t.suggest_int("x", 1, 10, log=True),
        ],
    )
    def test_single_parameter_objective(
        self, sampler: Callable[[], optuna.samplers.BaseSampler], suggest: Callable
    ) -> None:
        BasicSamplerTestCase.test_single_parameter_objective(self, sampler, suggest)  # type: ignore[arg-type]
