"""``agreed``: a setup step of a run that fails on every rank at once, as one line.

Building the evaluation core for the data and warming the supernet up run on every rank (or
every leader) before the first trial. An error there on one rank would leave the others
waiting in the next collective, or end the job in ``MPI_Abort`` with a traceback per rank.
``agreed`` runs the step, then every rank learns whether any rank failed and raises the
same ``SetupError`` (the first failing rank's message), which the command line prints as
one line with exit status 2.
"""

from __future__ import annotations

from collections.abc import Callable
import time
from typing import TYPE_CHECKING
from typing import TypeVar

if TYPE_CHECKING:
    from optuna_hpcnas.distributed import Comm

T = TypeVar("T")


class SetupError(Exception):
    """A run could not be set up on some rank: one line, raised on every rank."""


def _wait_for_every_rank(comm: Comm) -> None:
    """A barrier that sleeps while it waits: ranks done early must not spin on the cores a
    slower rank still computes on (MPICH's blocking collectives poll)."""
    barrier = getattr(comm, "Ibarrier", None)
    if comm.Get_size() == 1 or barrier is None:
        return
    request = barrier()
    while not request.Test():
        time.sleep(0.01)


def agreed(comm: Comm, what: str, step: Callable[[], T]) -> T:
    """``step()`` on this rank; if it raised an ``Exception`` on any rank of ``comm``, a
    ``SetupError`` on every rank: ``"<what>: <Error>: <message>"`` (the lowest failing rank's),
    whose ``__cause__`` is the error itself on a rank where it happened.

    Args:
        comm: Every rank that runs the step (or takes part without work).
        what: What the step does, for the message (e.g. ``"cannot build the search"``).
        step: The work of this rank.
    """
    result: T | None = None
    error: str | None = None
    local: Exception | None = None
    try:
        result = step()
    except Exception as e:  # a setup error is reported, not a traceback per rank
        local = e
        message = " ".join(str(e).split()) or "(no message)"
        error = f"{what}: {type(e).__name__}: {message}"
    _wait_for_every_rank(comm)
    errors = comm.allgather(error) if comm.Get_size() > 1 else [error]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        # the failing rank keeps its error as the cause: a full disk or a lost storage is
        # said as such by the launcher
        raise SetupError(first) from local
    return result  # type: ignore[return-value]
