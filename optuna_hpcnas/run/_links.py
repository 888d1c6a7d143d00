"""The trial side of the evaluation core inside an MPI evaluation group.

The group leader owns the ``optuna.Trial``: ``LeaderLink`` reports and prunes through it and
broadcasts each decision; every other rank holds a ``FollowerLink`` that receives them. A
fault on any rank (a non-finite loss, out of memory) reaches every rank through the per-epoch
``decide`` (an all-gather), so the whole group fails that one trial and goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import TYPE_CHECKING
from typing import TypeVar

from optuna_hpcnas.evaluation import Decision
from optuna_hpcnas.evaluation import OptunaTrialLink
from optuna_hpcnas.evaluation import report_epoch
from optuna_hpcnas.evaluation import TrialPlan

if TYPE_CHECKING:
    from optuna_hpcnas.distributed import GroupChannel
    from optuna_hpcnas.distributed import UtilisationTracker
    from optuna_hpcnas.search_space import Architecture

T = TypeVar("T")


def _first_fault(faults: list[str | None]) -> str | None:
    return next((f for f in faults if f is not None), None)


class LeaderLink:
    """``TrialLink`` of the group leader: the trial's link plus the group's collectives."""

    def __init__(
        self,
        inner: OptunaTrialLink,
        channel: GroupChannel,
        comm: Any,
        tracker: UtilisationTracker,
    ) -> None:
        self._inner = inner
        self._channel = channel
        self._comm = comm
        self._tracker = tracker
        self.number = inner.number
        self.plan = inner.plan

    @property
    def is_leader(self) -> bool:
        return True

    def record(self, attrs: Mapping[str, Any]) -> None:
        with self._tracker.track("storage"):
            self._inner.record(attrs)

    def constrain(self, name: str, value: float) -> None:
        with self._tracker.track("storage"):
            self._inner.constrain(name, value)

    def population(self, size: int) -> list[Architecture]:
        with self._tracker.track("storage"):
            return self._inner.population(size)

    def share(self, value: T) -> T:
        with self._tracker.track("communication"):
            return self._channel.share(value)

    def decide(
        self, epoch: int, value: float | None, fault: str | None
    ) -> tuple[Decision, str | None]:
        with self._tracker.track("communication"):
            fault = _first_fault(self._comm.allgather(fault))
        with self._channel.leader_section(f"reporting epoch {epoch}"):
            with self._tracker.track("storage"):
                decision = report_epoch(self._inner.trial, self.plan, epoch, value, fault)
        with self._tracker.track("communication"):
            return self._channel.share(decision), fault


class FollowerLink:
    """``TrialLink`` of a group rank that is not the leader."""

    def __init__(
        self,
        number: int,
        plan: TrialPlan,
        channel: GroupChannel,
        comm: Any,
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
        self, epoch: int, value: float | None, fault: str | None
    ) -> tuple[Decision, str | None]:
        with self._tracker.track("idle"):
            fault = _first_fault(self._comm.allgather(fault))
            return self._channel.share(None), fault
