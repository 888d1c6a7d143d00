"""The scheduler simulation of ``bench/distributed_scheduler.py``: the library's
``DynamicScheduler`` against static round-robin on a simulated clock, thousands of groups.

Discrete events: every group asks for work when idle, pays a dispatch overhead per task
(sampler + storage) and runs it for its true duration; utilisation and latencies come out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
import heapq

import numpy as np

from optuna_hpcnas.distributed._scheduler import BaseScheduler
from optuna_hpcnas.distributed._scheduler import Task


class SimulatedClock:
    """A clock that moves only when told (discrete-event simulation)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"Cannot move the clock back from {self._now} to {t}.")
        self._now = float(t)


class RoundRobinScheduler(BaseScheduler):
    """Static assignment: the i-th submitted task goes to group ``i % num_groups``, whatever
    the groups' load (what a fixed MPI rank-to-candidate mapping does)."""

    def __init__(self, *, num_groups: int) -> None:
        super().__init__(num_groups=num_groups)
        self._queues: list[deque[Task]] = [deque() for _ in range(num_groups)]
        self._next = 0

    def submit(self, task: Task) -> None:
        self._queues[self._next % self._num_groups].append(task)
        self._next += 1

    def next_task(self, group: int, now: float) -> Task | None:
        self._check_group(group)
        q = self._queues[group]
        return q.popleft() if q else None


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of ``simulate``: busy share of the groups and task latencies (seconds)."""

    utilisation: float
    makespan: float
    latencies: np.ndarray
    num_tasks: int
    starts: np.ndarray
    finishes: np.ndarray
    num_groups: int

    def latency_quantile(self, q: float) -> float:
        return float(np.quantile(self.latencies, q))

    @property
    def steady_utilisation(self) -> float:
        """Busy share while work was still waiting (up to the last dispatch): the figure for
        a search that keeps producing candidates, without the drain at the very end."""
        horizon = float(self.starts.max())
        if horizon <= 0:
            return 1.0
        busy = np.clip(np.minimum(self.finishes, horizon) - self.starts, 0.0, None).sum()
        return float(busy / (self.num_groups * horizon))


def simulate(
    scheduler: BaseScheduler,
    tasks: Sequence[Task],
    durations: Sequence[float] | np.ndarray,
    *,
    dispatch_overhead: float = 0.0,
) -> SimulationResult:
    """Run ``tasks`` (true run times ``durations``) through ``scheduler`` on a simulated clock.

    Every task is submitted at its ``submitted`` time (all at 0 for a ready pool); each group
    asks for work when idle, pays ``dispatch_overhead`` per task (sampler + storage), and
    runs it. Utilisation = sum of run times / (groups x makespan); latency = finish -
    submitted.
    """
    if len(tasks) != len(durations):
        raise ValueError(f"`tasks` has {len(tasks)} entries but `durations` has {len(durations)}.")
    clock = SimulatedClock()
    duration_of = {id(t): float(d) for t, d in zip(tasks, durations)}
    arrivals = sorted(range(len(tasks)), key=lambda i: tasks[i].submitted)
    next_arrival = 0
    idle = list(range(scheduler.num_groups))
    events: list[tuple[float, int, int]] = []  # (finish time, group, task index)
    index_of = {id(t): i for i, t in enumerate(tasks)}
    latencies = np.zeros(len(tasks))
    starts = np.zeros(len(tasks))
    finishes = np.zeros(len(tasks))
    busy = 0.0
    finished = 0

    def release(upto: float) -> None:
        nonlocal next_arrival
        while next_arrival < len(arrivals) and tasks[arrivals[next_arrival]].submitted <= upto:
            scheduler.submit(tasks[arrivals[next_arrival]])
            next_arrival += 1

    release(0.0)
    while finished < len(tasks):
        still_idle = []
        for g in idle:
            task = scheduler.next_task(g, clock.now())
            if task is None:
                still_idle.append(g)
                continue
            run = duration_of[id(task)]
            busy += run
            i = index_of[id(task)]
            starts[i] = clock.now() + dispatch_overhead
            heapq.heappush(events, (starts[i] + run, g, i))
        idle = still_idle
        next_time = events[0][0] if events else np.inf
        if next_arrival < len(arrivals):
            next_time = min(next_time, tasks[arrivals[next_arrival]].submitted)
        if not np.isfinite(next_time):
            raise RuntimeError("Tasks remain but no group can take them.")  # pragma: no cover
        clock.advance_to(next_time)
        release(clock.now())
        while events and events[0][0] <= clock.now():
            t, g, i = heapq.heappop(events)
            latencies[i] = t - tasks[i].submitted
            finishes[i] = t
            finished += 1
            idle.append(g)
    makespan = clock.now()
    utilisation = busy / (scheduler.num_groups * makespan) if makespan > 0 else 1.0
    return SimulationResult(
        utilisation, makespan, latencies, len(tasks), starts, finishes, scheduler.num_groups
    )
