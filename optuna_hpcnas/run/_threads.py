"""Each process's share of the node's cores for torch's intra-op threads.

Torch starts as many threads as the machine has cores in every process; with several ranks
on a node they fight over the cores (measured on 2 loaded cores: ``hpcnas run`` 277 s with
torch's default against 30 s with one thread per process).
"""

from __future__ import annotations

import logging
import os

_logger = logging.getLogger(__name__)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def thread_share(
    *, requested: int | None, ranks_on_node: int, environ: dict[str, str] | None = None
) -> tuple[int, str]:
    """``(threads, where the figure comes from)``: ``[training] threads``, else
    ``OMP_NUM_THREADS``, else the node's cores divided by the ranks on it (at least 1)."""
    env = os.environ if environ is None else environ
    if requested is not None:
        return requested, "[training] threads"
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return int(omp), "OMP_NUM_THREADS"
    share = max(1, available_cores() // max(1, ranks_on_node))
    return share, f"{available_cores()} cores / {ranks_on_node} rank(s) on this node"


def configure_threads(*, requested: int | None, ranks_on_node: int, rank: int = 0) -> int:
    """Set torch's intra-op threads to this process's share and log the figure."""
    import torch

    threads, source = thread_share(requested=requested, ranks_on_node=ranks_on_node)
    torch.set_num_threads(threads)
    if rank == 0:
        _logger.info("torch uses %d intra-op thread(s) per process (%s).", threads, source)
    return threads
