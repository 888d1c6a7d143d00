"""Assigning candidates to evaluation groups: dynamic pull, optionally cost-aware.

Each group leader's ``LeaderQueue`` (``optuna_hpcnas.run``) drives a ``DynamicScheduler``
whose source asks the Optuna study: the leader pulls the next trial the moment its group is
idle (no generation barrier). ``bench/_scheduler_simulation.py`` drives the same class on a
simulated clock with thousands of groups, against static round-robin.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
import heapq
from typing import Any

from optuna_hpcnas._validation import check_int


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
        check_int("num_groups", num_groups, 1)
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
        check_int("lookahead", lookahead, 1)
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
