"""The scheduler simulation behind ``bench/distributed_scheduler.py``: every task runs once,
dynamic pull beats static round-robin on heavy tails."""

from __future__ import annotations

import numpy as np
import pytest

from optuna_hpcnas.distributed import DynamicScheduler
from optuna_hpcnas.distributed import Task
from tests.bench_tests._bench import bench_module

sim = bench_module("_scheduler_simulation")


def _heavy_tailed(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(mean=0.0, sigma=1.2, size=n)


def test_every_task_runs_once_and_dynamic_beats_static_on_heavy_tails() -> None:
    durations = _heavy_tailed(2000, 0)
    tasks = [Task(key=i, cost=float(d)) for i, d in enumerate(durations)]
    dynamic = sim.simulate(DynamicScheduler(num_groups=64), tasks, durations)
    static = sim.simulate(sim.RoundRobinScheduler(num_groups=64), tasks, durations)
    for result in (dynamic, static):
        assert result.num_tasks == 2000
        assert np.all(result.latencies >= durations - 1e-9)
    assert dynamic.utilisation > static.utilisation
    assert dynamic.makespan < static.makespan
    assert dynamic.latency_quantile(0.99) < static.latency_quantile(0.99)
    # cost-aware pairing (largest predicted cost first) shortens the drain at the end
    aware = sim.simulate(
        DynamicScheduler(num_groups=64, cost_aware=True, lookahead=4096), tasks, durations
    )
    assert aware.makespan < dynamic.makespan
    assert aware.utilisation > 0.95


def test_round_robin_needs_a_group_and_the_clock_moves_forward_only() -> None:
    with pytest.raises(ValueError, match="`num_groups` is 0"):
        sim.RoundRobinScheduler(num_groups=0)
    clock = sim.SimulatedClock()
    clock.advance_to(2.0)
    assert clock.now() == 2.0
    with pytest.raises(ValueError, match="move the clock back"):
        clock.advance_to(1.0)
