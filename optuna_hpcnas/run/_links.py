"""The trial side of the evaluation core inside an MPI evaluation group.

The group leader owns the ``optuna.Trial``: ``LeaderLink`` reports and prunes through it and
broadcasts each decision; every other rank holds a ``FollowerLink`` that receives them. A
fault on any rank (a non-finite loss, out of memory) reaches every rank through the per-round
``decide`` (an all-gather), so the whole group fails that one trial and goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import TYPE_CHECKING
from typing import TypeVar

from optuna_hpcnas.evaluation import Decision
from optuna_hpcnas.evaluation import TrialPlan
from optuna_hpcnas.evaluation import verdict_needed

if TYPE_CHECKING:
    from optuna_hpcnas.distributed import Comm
    from optuna_hpcnas.distributed import GroupChannel
    from optuna_hpcnas.distributed import UtilisationTracker
    from optuna_hpcnas.run._queue import LeaderQueue
    from optuna_hpcnas.run._queue import Taken
    from optuna_hpcnas.search_space import Architecture

T = TypeVar("T")


def _first_fault(faults: list[str | None]) -> str | None:
    return next((f for f in faults if f is not None), None)


class LeaderLink:
    """``TrialLink`` of the group leader: the trial's storage calls plus the group's collectives.

    Its storage calls go to the leader's ``LeaderQueue`` (its write thread, in order); it
    waits for a report only when the pruner's verdict could be "stop" (``verdict_needed``),
    so the decisions are the ones a synchronous loop takes. The population is the one read
    at the ask, when the ask read it there.
    """

    def __init__(
        self,
        taken: Taken,
        queue: LeaderQueue,
        channel: GroupChannel,
        comm: Comm,
        tracker: UtilisationTracker,
    ) -> None:
        self.trial = taken.trial
        self.number = taken.trial.number
        self.plan = taken.plan
        self._population = taken.population
        self._queue = queue
        self._channel = channel
        self._comm = comm
        self._tracker = tracker
        self._pending: dict[str, Any] = {}
        self._reported: dict[int, float] = {}

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def solo(self) -> bool:
        return self._comm.Get_size() == 1

    def record(self, attrs: Mapping[str, Any]) -> None:
        # Kept until the trial is told (``take_records``): written once, with the tell,
        # instead of once per key and round; nobody reads them before the result.
        self._pending.update(attrs)

    def take_records(self) -> dict[str, Any]:
        """The user attributes recorded so far (the tell writes them, in one transaction)."""
        records, self._pending = self._pending, {}
        return records

    def constrain(self, name: str, value: float) -> None:
        self._queue.constrain(self.trial, name, value)

    def population(self, size: int) -> list[Architecture]:
        if self._population is not None:  # read by the ask, with the same size
            return self._population
        return self._queue.population(size)

    def share(self, value: T) -> T:
        with self._tracker.track("communication"):
            return self._channel.share(value)

    def decide(
        self, step: int, value: float | None, fault: str | None
    ) -> tuple[Decision, str | None]:
        with self._tracker.track("communication"):
            fault = _first_fault(self._comm.allgather(fault))
        decision = self._report(step, value, fault)
        with self._tracker.track("communication"):
            return self._channel.share(decision), fault

    def _report(self, step: int, value: float | None, fault: str | None) -> Decision:
        """The report, queued on the write thread; its verdict is awaited only when it could
        be anything but "continue"."""
        with self._channel.leader_section(f"at step {step}"):
            self._queue.check_storage()  # past the outage window: the whole group stops
        if fault is not None:
            return Decision.FAIL
        if not self.plan.report or value is None:
            return Decision.CONTINUE
        self._reported[step] = value
        future = self._queue.report(self.trial, self.plan, step, value)
        pruner = self.trial.study.pruner
        if not verdict_needed(pruner, self._reported, maximize=self.plan.maximize):
            return Decision.CONTINUE
        with self._channel.leader_section(f"reporting step {step}"):
            return self._queue.wait(future)


class FollowerLink:
    """``TrialLink`` of a group rank that is not the leader."""

    def __init__(
        self,
        number: int,
        plan: TrialPlan,
        channel: GroupChannel,
        comm: Comm,
        tracker: UtilisationTracker,
    ) -> None:
        self.number = number
        self.plan = plan
        self._channel = channel
        self._comm = comm
        self._tracker = tracker

    @property
    def is_leader(self) -> bool:
        return False

    @property
    def solo(self) -> bool:
        return False

    def record(self, attrs: Mapping[str, Any]) -> None:
        pass

    def constrain(self, name: str, value: float) -> None:
        pass

    def population(self, size: int) -> list[Architecture]:
        return []

    def share(self, value: T) -> T:
        with self._tracker.track("idle"):  # the leader's storage and scoring time
            return self._channel.share(None)

    def decide(
        self, step: int, value: float | None, fault: str | None
    ) -> tuple[Decision, str | None]:
        with self._tracker.track("idle"):
            fault = _first_fault(self._comm.allgather(fault))
            return self._channel.share(None), fault
