"""``JobStop``: the ranks of one job stop together when a signal reaches only some of them.

Slurm signals every task, but a user's ``kill`` or a node's own shutdown may reach one rank:
without this, that rank exits, ``python -m mpi4py`` aborts the job, and the trials the other
leaders held stay RUNNING until their grace period. ``PreemptionGuard`` (checkpoints) calls it
at step boundaries: a signalled rank tells every other rank (a small point-to-point message,
polled without blocking); every group leader that learns of it gives back its trial and says
so; a leader exits once the other leaders said so (or after ``wait`` seconds), a follower once
its own leader did (its trial is the leader's).
"""

from __future__ import annotations

import time
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna_hpcnas.distributed._groups import EvaluationGroup

# MPI tags of the two messages (user tags below the group protocol's, which counts from 0).
_NOTICE = 7_731
_DONE = 7_732


class JobStop:
    """Collective to construct (every rank of ``comm``); then each rank on its own.

    Args:
        comm: The job's world communicator (mpi4py).
        group: This rank's evaluation group.
    """

    def __init__(self, comm: Any, group: EvaluationGroup) -> None:
        self._comm = comm
        me = comm.Get_rank()
        info = comm.allgather((group.index, group.is_leader))
        self._others = [r for r in range(len(info)) if r != me]
        self._leader = group.is_leader
        self._wait_for = {r for r, (_, leader) in enumerate(info) if leader and r != me}
        if not self._leader:  # a follower waits for its own leader only
            self._wait_for = {r for r, (i, lead) in enumerate(info) if lead and i == group.index}
        self._done: set[int] = set()
        self._notified = False
        self._sent: list[Any] = []  # requests kept until they complete

    @property
    def is_leader(self) -> bool:
        return self._leader

    def notify(self, signum: int) -> None:
        """Tell every other rank that this one got ``signum`` (once)."""
        if self._notified:
            return
        self._notified = True
        self._send(_NOTICE, int(signum))

    def poll(self) -> int | None:
        """The signal another rank told of, if any arrived (never blocks)."""
        from mpi4py import MPI

        signum = None
        status = MPI.Status()
        while self._comm.iprobe(source=MPI.ANY_SOURCE, tag=_NOTICE, status=status):
            got = self._comm.recv(source=status.Get_source(), tag=_NOTICE)
            signum = signum if signum is not None else int(got)
        return signum

    def done(self) -> None:
        """Say that this rank gave back its trial (leaders; a follower's is its leader's)."""
        if self._leader:
            self._send(_DONE, True)

    def ready(self) -> bool:
        """Whether every rank this one waits for said it is done."""
        from mpi4py import MPI

        status = MPI.Status()
        while self._comm.iprobe(source=MPI.ANY_SOURCE, tag=_DONE, status=status):
            self._comm.recv(source=status.Get_source(), tag=_DONE)
            self._done.add(status.Get_source())
        return self._wait_for <= self._done

    def wait(self, seconds: float) -> bool:
        """``ready()``, polled for at most ``seconds``."""
        end = time.monotonic() + seconds
        while not self.ready():
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def _send(self, tag: int, value: Any) -> None:
        self._sent += [self._comm.isend(value, dest=r, tag=tag) for r in self._others]
