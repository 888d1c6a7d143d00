"""The evolution's non-dominated sorting is Optuna's, and ranks every population as the
project's own sort did (so the sampler's proposals did not change when it was replaced)."""

from __future__ import annotations

import math

import numpy as np
import optuna
from optuna.study import StudyDirection
import pytest

from optuna_hpcnas import _records
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers._evolution import _selection
from optuna_hpcnas.samplers._evolution._cache import Member
from optuna_hpcnas.samplers._evolution._selection import selection_keys

MIN, MAX = StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE


def _reference_ranks(losses: np.ndarray) -> np.ndarray:
    """The sort ``_selection.pareto_ranks`` did before it used Optuna's (kept as the oracle)."""
    n = len(losses)
    ranks = np.full(n, -1, dtype=int)
    if n == 0:
        return ranks
    le = np.all(losses[:, None, :] <= losses[None, :, :], axis=2)
    lt = np.any(losses[:, None, :] < losses[None, :, :], axis=2)
    dominates = le & lt  # dominates[i, j]: i dominates j
    remaining = np.ones(n, dtype=bool)
    rank = 0
    while remaining.any():
        dominated = (dominates[remaining][:, remaining]).any(axis=0)
        idx = np.flatnonzero(remaining)[~dominated]
        ranks[idx] = rank
        remaining[idx] = False
        rank += 1
    return ranks


def _losses(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """Few distinct values (ties, duplicate rows) and, sometimes, infinities."""
    losses = rng.integers(0, 5, size=(n, m)).astype(float)
    if rng.random() < 0.3:
        losses[rng.random((n, m)) < 0.1] = math.inf
    if rng.random() < 0.3:
        losses[rng.random((n, m)) < 0.1] = -math.inf
    return losses


@pytest.mark.parametrize("m", [2, 3, 4])
def test_optuna_sort_ranks_random_populations_as_before(m: int) -> None:
    rng = np.random.default_rng(m)
    for _ in range(200):
        losses = _losses(rng, int(rng.integers(0, 40)), m)
        np.testing.assert_array_equal(
            _records.non_domination_ranks(losses), _reference_ranks(losses)
        )


def _population(rng: np.random.Generator, n: int, m: int, constrained: bool) -> list[Member]:
    out = []
    for i in range(n):
        complete = rng.random() < 0.8
        values = tuple(float(v) for v in rng.integers(0, 4, size=m)) if complete else None
        steps = {} if complete else {int(s): float(rng.random()) for s in range(rng.integers(3))}
        constraints = {}
        if constrained and rng.random() < 0.9:  # a member without constraints is infeasible
            constraints = {"c": float(rng.integers(-2, 2))}
        out.append(Member(i, (float(i), i), complete, values, constraints, steps, {}))
    return out


@pytest.mark.parametrize("constrained", [False, True])
def test_selection_keys_unchanged_on_random_populations(
    constrained: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(int(constrained))
    cases = []
    for _ in range(150):
        m = int(rng.integers(2, 4))
        directions = [MIN if rng.random() < 0.5 else MAX for _ in range(m)]
        cases.append((_population(rng, int(rng.integers(1, 30)), m, constrained), directions))
    new = [selection_keys(population, directions) for population, directions in cases]
    monkeypatch.setattr(_selection._records, "non_domination_ranks", _reference_ranks)
    old = [selection_keys(population, directions) for population, directions in cases]
    assert new == old


def test_multi_objective_proposals_are_reproducible() -> None:
    """Same seed, same proposals: the sort is deterministic whatever the ties."""

    def run() -> list[dict[str, object]]:
        study = optuna.create_study(
            directions=["minimize", "maximize"],
            sampler=EvolutionarySampler(population_size=6, n_startup_trials=4, seed=3),
        )

        def objective(trial: optuna.Trial) -> tuple[float, float]:
            x = trial.suggest_int("x", 0, 4)
            y = trial.suggest_categorical("y", ["a", "b", "c"])
            return float(x % 3), float(x + len(y))

        study.optimize(objective, n_trials=25)
        return [t.params for t in study.trials]

    assert run() == run()
