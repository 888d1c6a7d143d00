"""samplers/hpcnas_evolutionary as OptunaHub loads it: Optuna's sampler contract suites, then
its behaviour on an architecture space. Run from the registry root:
``pytest package/samplers/hpcnas_evolutionary/tests``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.samplers import BaseSampler
from optuna.testing.pytest_samplers import BasicSamplerTestCase
from optuna.testing.pytest_samplers import MultiObjectiveSamplerTestCase
from optuna.testing.pytest_samplers import RelativeSamplerTestCase
from optuna_hpcnas import HierarchicalSearchSpace
import optunahub
import pytest


module = optunahub.load_local_module(
    package="samplers/hpcnas_evolutionary", registry_root=str(Path(__file__).resolve().parents[3])
)
EvolutionarySampler = module.EvolutionarySampler
SPACE = HierarchicalSearchSpace.preset("digits-small")


class TestEvolutionarySampler(
    BasicSamplerTestCase, RelativeSamplerTestCase, MultiObjectiveSamplerTestCase
):
    @pytest.fixture
    def sampler(self) -> Callable[[], BaseSampler]:
        # Evolution from the first finished trial on: the suites reach mutation and crossover.
        return lambda: EvolutionarySampler(
            population_size=4, tournament_size=2, n_startup_trials=1, crossover_prob=0.5, seed=0
        )


def _search(seed: int) -> optuna.Study:
    def objective(trial: optuna.Trial) -> tuple[float, float]:
        arch = SPACE.suggest(trial)
        size = float(sum(c.width or 0 for c in arch.cells))
        trial.set_constraint("size", size - 64.0)
        return float(sum(c.op != "conv3x3" for c in arch.cells)), size

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        directions=["minimize", "minimize"],
        sampler=EvolutionarySampler(population_size=8, crossover_prob=0.3, seed=seed),
    )
    study.optimize(objective, n_trials=40)
    return study


def test_architecture_search_is_reproducible_and_never_repeats() -> None:
    study = _search(seed=1)
    archs = [SPACE.from_params(t.params).describe() for t in study.trials]
    assert len(set(archs)) == len(archs)  # 40 of 1,536: an unseen neighbour always exists
    assert all(v <= 0 for t in study.best_trials for v in t.constraints.values())
    assert [t.params for t in _search(seed=1).trials] == [t.params for t in study.trials]


def test_is_the_library_sampler() -> None:
    from optuna_hpcnas.samplers import EvolutionarySampler as Library

    assert EvolutionarySampler is Library
    with pytest.raises(ValueError, match="population_size"):
        EvolutionarySampler(population_size=1)
