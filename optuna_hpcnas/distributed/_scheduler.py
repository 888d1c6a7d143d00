"""Assigning candidates to evaluation groups: dynamic pull (optionally cost-aware) or static
round-robin, on a real or a simulated clock.

The run loop of ``run_search`` drives a ``DynamicScheduler`` on a ``WallClock`` whose source
asks the Optuna study (each group leader pulls the next trial the moment its group is idle:
no generation barrier). ``simulate`` drives the very same scheduler classes on a
``SimulatedClock`` with thousands of groups, which is how the benchmark measures utilisation
and tail latency without a cluster.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
import heapq
import time
from typing import Any
from typing import Protocol

import numpy as np


class Clock(Protocol):
    """Seconds since an arbitrary origin."""

    def now(self) -> float: ...


class WallClock:
    """``time.perf_counter``."""

    def now(self) -> float:
        return time.perf_counter()


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


@dataclass(frozen=True)
class Task:
    """One unit of work: a key (trial number, architecture...), its predicted cost (e.g.
    FLOPs; any unit, only the order matters) and the time it became available."""

    key: Any
    cost: float = 0.0
    submitted: float = 0.0


class BaseScheduler(abc.ABC):
    """Hands tasks to idle groups. ``submit`` adds work, ``next_task`` is called by a group
    the moment it is idle and returns ``None`` when nothing is left."""

    def __init__(self, *, num_groups: int, source: Callable[[], Task | None] | None = None):
        if isinstance(num_groups, bool) or not isinstance(num_groups, int):
            raise TypeError(f"`num_groups` must be an int, but got {num_groups!r}.")
        if num_groups < 1:
            raise ValueError(f"`num_groups` is {num_groups}, but must be >= 1.")
        self._num_groups = num_groups
        self._source = source

    @property
    def num_groups(self) -> int:
        return self._num_groups

    @abc.abstractmethod
    def submit(self, task: Task) -> None:
        """Add one task to the pool."""

    @abc.abstractmethod
    def next_task(self, group: int, now: float) -> Task | None:
        """The task that the idle ``group`` runs next, or ``None`` when nothing is left."""

    def _check_group(self, group: int) -> None:
        if not 0 <= group < self._num_groups:
            raise ValueError(f"`group` is {group}, but must be in [0, {self._num_groups}).")


class DynamicScheduler(BaseScheduler):
    """A shared queue: an idle group takes the next task at once.

    Args:
        num_groups: Number of groups pulling from the queue.
        source: Called when the queue is empty (e.g. asks the Optuna study); ``None`` from
            it means no more work.
        cost_aware: Pick, among the first ``lookahead`` waiting tasks, the one with the
            largest predicted cost (longest-processing-time first), so expensive candidates
            start early and the groups finish with similar total work instead of one group
            running the heaviest candidate alone at the end.
        lookahead: Window of waiting tasks the cost-aware choice considers.
    """

    def __init__(
        self,
        *,
        num_groups: int,
        source: Callable[[], Task | None] | None = None,
        cost_aware: bool = False,
        lookahead: int = 64,
    ) -> None:
        super().__init__(num_groups=num_groups, source=source)
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
            raise ValueError(f"`lookahead` is {lookahead!r}, but must be an integer >= 1.")
        self._cost_aware = bool(cost_aware)
        self._lookahead = lookahead
        self._queue: deque[Task] = deque()
        # A max-heap window (by cost, then arrival) for the cost-aware choice.
        self._window: list[tuple[float, int, Task]] = []
        self._counter = 0

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def __len__(self) -> int:
        return len(self._queue) + len(self._window)

    def take_waiting(self) -> list[Task]:
        """Remove and return every task not handed out yet (to give them back at a stop)."""
        tasks = [*self._queue, *(entry[2] for entry in sorted(self._window))]
        self._queue.clear()
        self._window.clear()
        return tasks

    def next_task(self, group: int, now: float) -> Task | None:
        self._check_group(group)
        if not self._cost_aware:
            if not self._queue and self._source is not None:
                task = self._source()
                if task is not None:
                    return task
            return self._queue.popleft() if self._queue else None
        while len(self._window) < self._lookahead:
            if self._queue:
                task = self._queue.popleft()
            elif self._source is not None:
                pulled = self._source()
                if pulled is None:
                    break
                task = pulled
            else:
                break
            heapq.heappush(self._window, (-task.cost, self._counter, task))
            self._counter += 1
        if not self._window:
            return None
        return heapq.heappop(self._window)[2]


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
