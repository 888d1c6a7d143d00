"""samplers/hpcnas_qubo as OptunaHub loads it: Optuna's sampler contract suites, then its
behaviour on a small architecture space. Run from the registry root:
``pytest package/samplers/hpcnas_qubo/tests``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.samplers import BaseSampler
from optuna.testing.pytest_samplers import BasicSamplerTestCase
from optuna.testing.pytest_samplers import MultiObjectiveSamplerTestCase
from optuna.testing.pytest_samplers import RelativeSamplerTestCase
import optunahub
import pytest
from qubo import LinearBudget


module = optunahub.load_local_module(
    package="samplers/hpcnas_qubo", registry_root=str(Path(__file__).resolve().parents[3])
)
QUBOSampler = module.QUBOSampler
OPS = {"conv3x3": (0.0, 9.0), "sepconv3x3": (0.03, 4.0), "skip": (0.2, 0.0)}  # error, cost


class TestQUBOSampler(
    BasicSamplerTestCase, RelativeSamplerTestCase, MultiObjectiveSamplerTestCase
):
    @pytest.fixture
    def sampler(self) -> Callable[[], BaseSampler]:
        # Floats on a 5-point grid, so every case of the suites applies.
        return lambda: QUBOSampler(n_startup_trials=1, discretize_floats=5, num_reads=8)


def test_proposals_respect_the_budget() -> None:
    n_cells = 5

    def objective(trial: optuna.Trial) -> float:
        ops = [trial.suggest_categorical(f"cell{i}", list(OPS)) for i in range(n_cells)]
        return sum(OPS[op][0] for op in ops)

    costs = {(f"cell{i}", op): cost for i in range(n_cells) for op, (_, cost) in OPS.items()}
    budget = LinearBudget("cost", costs, limit=21.0)  # 117 of the 243 codes fit
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=QUBOSampler(seed=0, n_startup_trials=3, num_reads=16, budgets=[budget])
    )
    study.optimize(objective, n_trials=15)
    infos = [t.system_attrs["hpcnas:qubo:info"] for t in study.trials[3:]]
    # Global asks anneal (samples drawn); local asks rank the incumbent's neighbours.
    assert all(i["n_samples" if i["step"] == "global" else "n_local"] > 0 for i in infos)
    assert {"global", "local"} <= {i["step"] for i in infos}
    # The first trial comes from the independent sampler, before the space is known.
    for trial in study.trials[1:]:
        assert sum(costs[(k, v)] for k, v in trial.params.items()) <= 21.0, trial.params


def test_is_the_library_sampler() -> None:
    from optuna_hpcnas.samplers import QUBOSampler as Library

    assert QUBOSampler is Library
    # two objectives (ParEGO): every trial proposes a point of the space
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=QUBOSampler(seed=0))
    study.optimize(lambda t: (t.suggest_int("x", 0, 3), -t.params["x"]), n_trials=8)
    assert len(study.best_trials) >= 2
