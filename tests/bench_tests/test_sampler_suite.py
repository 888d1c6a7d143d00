"""The cluster settings of ``bench/sampler_suite.py``: asynchronous workers whose results
arrive out of order, compared by completed trials and at equal simulated time, and the
two-objective mode's hypervolume regret against the exact front."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from tests.bench_tests._bench import bench_module

suite = bench_module("sampler_suite")


def test_the_reference_clock_schedules_every_trial_on_the_first_free_worker() -> None:
    assert suite.reference_clock(np.array([1.0, 1.0, 1.0, 1.0]), 2) == 2.0
    assert suite.reference_clock(np.array([3.0, 1.0, 1.0]), 2) == 3.0
    assert suite.reference_clock(np.array([1.0, 1.0, 5.0]), 2) == 6.0


class _Watching(optuna.samplers.RandomSampler):
    """Random, noting how many trials are RUNNING at each ask."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.running: list[int] = []

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        states = (optuna.trial.TrialState.RUNNING,)
        self.running.append(len(study.get_trials(deepcopy=False, states=states)))


def test_asynchronous_workers_ask_beside_running_trials_and_read_both_clocks() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    problem = suite.make_problem("quadratic", 0)
    sampler = _Watching()
    n = 40
    out = suite.run_async(problem, sampler, n, seed=0)
    workers = suite.ASYNC_WORKERS
    assert len(out["curve"]) == n and max(sampler.running) >= workers - 1
    assert all(a >= b for a, b in zip(out["curve"], out["curve"][1:]))
    # at equal time a sampler has what it finished by the zero-cost clock: nearly all here
    assert n - workers <= out["finished_by_time"] <= n
    assert out["regret_at_time"] >= out["curve"][-1] >= 0.0
    again = suite.run_async(problem, optuna.samplers.RandomSampler(seed=0), n, seed=0)
    assert again["curve"] == out["curve"]  # the durations are the seed's, not the run's


def test_the_hypervolume_regret_reaches_zero_on_the_exact_front() -> None:
    problem = suite.make_problem("quadratic", 1)
    by_value = sorted(problem.value, key=lambda k: (problem.value[k], problem.cost[k]))
    front, lowest = [], np.inf
    for key in by_value:
        if problem.cost[key] < lowest:
            front.append(key)
            lowest = problem.cost[key]
    others = by_value[-5:]
    curve = suite.hypervolume_regret(problem, others + front)
    assert all(0.0 <= v <= 1.0 for v in curve)
    assert all(a >= b - 1e-12 for a, b in zip(curve, curve[1:]))
    assert curve[4] > 0.5 and curve[-1] == pytest.approx(0.0, abs=1e-12)
