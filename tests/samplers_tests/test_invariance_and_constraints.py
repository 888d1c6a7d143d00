"""Issue 14: both samplers are blind to the scale of the objective, accept
``constraints_func`` and prefer feasible points."""

from __future__ import annotations

from collections.abc import Callable
import itertools
import math
from typing import Any

import numpy as np
import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler
from optuna_hpcnas.samplers._ranking import feasibility_keys
from optuna_hpcnas.samplers._ranking import normal_scores

NAMES = [f"x{i}" for i in range(5)]
CHOICES = ["a", "b", "c", "d"]
_RNG = np.random.default_rng(3)
# Values of all codes lie in [0, 1), so a penalty of 5 already ranks every infeasible code last.
LINEAR = _RNG.uniform(0.0, 0.2, (len(NAMES), len(CHOICES)))
COST = _RNG.uniform(1.0, 10.0, (len(NAMES), len(CHOICES)))
# About 40 % of the 1,024 codes fit the budget.
LIMIT = float(
    np.quantile(
        [COST[np.arange(len(NAMES)), c].sum() for c in itertools.product(range(4), repeat=5)],
        0.4,
    )
)

Factory = Callable[..., optuna.samplers.BaseSampler]
FACTORIES: dict[str, Factory] = {
    "evolution": lambda **kw: EvolutionarySampler(population_size=10, **kw),
    "qubo": lambda **kw: QUBOSampler(num_reads=8, **kw),
}


def _code(trial: optuna.Trial) -> list[int]:
    return [CHOICES.index(trial.suggest_categorical(n, CHOICES)) for n in NAMES]


def _value(code: list[int]) -> float:
    return float(LINEAR[np.arange(len(code)), code].sum())


def _excess(code: list[int]) -> float:
    return float(COST[np.arange(len(code)), code].sum()) - LIMIT


def _proposals(study: optuna.Study) -> list[tuple[Any, ...]]:
    return [tuple(t.params[n] for n in NAMES) for t in study.trials]


def _penalised(penalty: float, transform: Callable[[float], float]) -> Callable[..., float]:
    def objective(trial: optuna.Trial) -> float:
        code = _code(trial)
        return transform(_value(code) + (penalty if _excess(code) > 0 else 0.0))

    return objective


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_monotone_transform_or_a_huge_penalty_proposes_the_same(name: str) -> None:
    runs = []
    for penalty, transform in (
        (5.0, lambda v: v),
        (1e6, lambda v: v),
        (5.0, lambda v: math.exp(2.0 * v) * 1e3),  # any strictly increasing transform
    ):
        study = optuna.create_study(sampler=FACTORIES[name](seed=0))
        study.optimize(_penalised(penalty, transform), n_trials=30)
        runs.append(_proposals(study))
    assert runs[0] == runs[1] == runs[2]
    other = optuna.create_study(sampler=FACTORIES[name](seed=1))
    other.optimize(_penalised(5.0, lambda v: v), n_trials=30)
    assert _proposals(other) != runs[0]  # the runs above are not trivially fixed


def test_normal_scores_follow_the_order_and_share_ties() -> None:
    scores = normal_scores([(0.0, 3.0), (0.0, 1.0), (0.0, 3.0), (1.0, 0.0)])
    assert scores[1] < scores[0] == scores[2] < scores[3]
    assert abs(float(scores.sum())) < 1e-9  # symmetric around zero


def test_feasibility_keys_put_every_feasible_point_first() -> None:
    keys = feasibility_keys([5.0, -1.0, 0.0, 2.0], [[0.0], [2.0], [0.5], None])
    order = sorted(range(4), key=keys.__getitem__)
    # Feasible (0) first, then the smaller violation (2: 0.5, 1: 2.0), then no constraints.
    assert order == [0, 2, 1, 3]


def _constrained(trial: optuna.Trial) -> float:
    return _value(_code(trial))


def _constraints_func(trial: optuna.trial.FrozenTrial) -> list[float]:
    return [_excess([CHOICES.index(trial.params[n]) for n in NAMES])]


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_constraints_func_is_stored_and_equals_set_constraint(name: str) -> None:
    through_func = optuna.create_study(
        sampler=FACTORIES[name](seed=0, constraints_func=_constraints_func)
    )
    through_func.optimize(_constrained, n_trials=30)
    for t in through_func.trials:
        assert t.constraints == {"0": _constraints_func(t)[0]}

    def set_constraint(trial: optuna.Trial) -> float:
        code = _code(trial)
        trial.set_constraint("0", _excess(code))
        return _value(code)

    through_trial = optuna.create_study(sampler=FACTORIES[name](seed=0))
    through_trial.optimize(set_constraint, n_trials=30)
    assert _proposals(through_func) == _proposals(through_trial)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_constrained_search_prefers_feasible_points(name: str) -> None:
    ours = optuna.create_study(sampler=FACTORIES[name](seed=0, constraints_func=_constraints_func))
    ours.optimize(_constrained, n_trials=50)
    late = [t.constraints["0"] <= 0 for t in ours.trials[20:]]
    # 40 % of all codes are feasible (what uniform sampling gets); the search stays near the
    # boundary, where the constrained optimum lies, yet mostly on its feasible side.
    assert float(np.mean(late)) >= 0.4 + 0.2
    values = [_value(list(c)) for c in itertools.product(range(4), repeat=5)]
    feasible = [t.value for t in ours.trials if t.constraints["0"] <= 0]
    assert feasible and min(feasible) <= np.quantile(values, 0.05)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_constraints_func_is_validated(name: str) -> None:
    with pytest.raises(TypeError, match="constraints_func"):
        FACTORIES[name](constraints_func=3)


def test_screening_is_recorded_as_the_origin_of_bred_children() -> None:
    study = optuna.create_study(sampler=FACTORIES["evolution"](seed=0))
    study.optimize(_penalised(5.0, lambda v: v), n_trials=30)
    # The first trial has no search space yet (its params come from the independent sampler).
    ops = [t.system_attrs.get(_keys.EVOLUTION_ORIGIN, {}).get("operation") for t in study.trials]
    assert ops[1:5] == ["random"] * 4  # n_startup_trials = population_size // 2
    assert ops.count("screened") >= 20
