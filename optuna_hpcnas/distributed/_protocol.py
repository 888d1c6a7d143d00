"""The leader-owns-the-trial protocol of one evaluation group.

Only the group leader (group rank 0) holds the ``optuna.Trial`` and talks to the storage and
the sampler. Everything the other ranks need — the next task, each prune decision, the end
of the run — reaches them through ``GroupChannel.share``. An exception on the leader inside
``GroupChannel.leader_section`` is sent instead of the message, so every rank of the group
raises ``GroupError`` at the same point rather than waiting forever on a broadcast that never
comes. Exceptions on a non-leader rank end the job through ``python -m mpi4py`` (or the
``MPI.Abort`` of our entry point).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
import traceback
from typing import Any


class GroupError(RuntimeError):
    """Raised on every rank of a group when its leader failed (the leader's error is chained
    on the leader and quoted in the message elsewhere).

    Attributes:
        error_type: The class name of the leader's error.
        leader_message: The leader's error message.
    """

    def __init__(self, message: str, *, error_type: str = "", leader_message: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.leader_message = leader_message


@dataclass(frozen=True)
class TrialTask:
    """One candidate for a group: what every rank needs to build and train it (the layout
    is the architecture's cluster decisions; the seeds come from the trial number)."""

    trial_number: int
    architecture: str  # Architecture.to_json()
    plan: dict[str, Any]  # TrialPlan.to_dict(): stages, steps, whether rounds are reported


@dataclass(frozen=True)
class Stop:
    """No more trials: leave the evaluation loop."""

    reason: str = "done"


@dataclass(frozen=True)
class _Failure:
    error_type: str
    message: str
    where: str
    details: str = field(default="", repr=False)


class GroupChannel:
    """Broadcasts from the group leader, with failures delivered as errors on every rank.

    Args:
        comm: The group's communicator (rank 0 is the leader).
        group_index: Index of the group (for messages).
    """

    def __init__(self, comm: Any, *, group_index: int = 0) -> None:
        self._comm = comm
        self._group_index = group_index

    @property
    def is_leader(self) -> bool:
        return int(self._comm.Get_rank()) == 0

    @property
    def size(self) -> int:
        return int(self._comm.Get_size())

    def share(self, value: Any = None) -> Any:
        """Collective: the leader's ``value`` on every rank (others pass nothing).

        If the leader left a ``leader_section`` with an exception, the other ranks raise
        ``GroupError`` here instead.
        """
        payload = value
        if self.size > 1:
            payload = self._comm.bcast(value if self.is_leader else None, root=0)
        if isinstance(payload, _Failure):
            raise GroupError(
                f"The leader of evaluation group {self._group_index} failed {payload.where}: "
                f"{payload.error_type}: {payload.message}",
                error_type=payload.error_type,
                leader_message=payload.message,
            )
        return payload

    @contextmanager
    def leader_section(self, where: str) -> Iterator[None]:
        """Run leader-only work; an exception is broadcast to the group, then re-raised.

        Use on the leader only, and follow it by a ``share`` on every rank. The exception
        reaches the other ranks as ``GroupError`` at that ``share``; the leader raises it at
        once (after broadcasting it).
        """
        try:
            yield
        except BaseException as e:
            failure = _Failure(type(e).__name__, str(e), where, traceback.format_exc())
            if self.size > 1:
                self._comm.bcast(failure, root=0)
            raise
