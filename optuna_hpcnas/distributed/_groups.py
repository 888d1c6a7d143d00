"""Where a rank sits in the job (``RankContext``) and the evaluation groups it belongs to.

Groups are formed topology-first: ranks that share a node (``Split_type(COMM_TYPE_SHARED)``)
are grouped together before any group spans nodes, so the data and pipeline traffic of one
candidate stays on the fastest link. The placement arithmetic is the pure function
``assign_groups``; ``form_groups`` runs it on the gathered placement of every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import logging
import os
from pathlib import Path
import shutil
import sys
import threading
from typing import Any
from typing import Protocol

from optuna_hpcnas._validation import check_int

_logger = logging.getLogger(__name__)


class Comm(Protocol):
    """What the runner asks of a communicator: an ``mpi4py.MPI.Comm`` or, in one process
    without MPI, ``self_comm()``."""

    def Get_rank(self) -> int: ...

    def Get_size(self) -> int: ...

    def bcast(self, obj: Any, /, root: int = 0) -> Any: ...

    def gather(self, obj: Any, /, root: int = 0) -> list[Any] | None: ...

    def allgather(self, obj: Any, /) -> list[Any]: ...


def launched_rank_and_size() -> tuple[int, int]:
    """This process's rank and the world size without importing mpi4py: from mpi4py when it
    is already imported (``python -m mpi4py``), else from the launcher's environment, else
    ``(0, 1)``."""
    if "mpi4py.MPI" in sys.modules:
        comm = sys.modules["mpi4py.MPI"].COMM_WORLD
        return int(comm.Get_rank()), int(comm.Get_size())
    for rank_var, size_var in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("PMIX_RANK", "PMIX_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def find_mpirun() -> str | None:
    """The ``mpirun`` beside this Python (the ``mpich`` wheel of ``optuna-hpcnas[mpi]``), else
    the first ``mpirun``/``mpiexec`` on ``PATH``; ``None`` when there is none."""
    beside = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (beside / name).is_file() and os.access(beside / name, os.X_OK):
            return str(beside / name)
    return shutil.which("mpirun") or shutil.which("mpiexec")


@dataclass(frozen=True)
class RankContext:
    """One rank's place in the MPI job.

    Attributes:
        rank: Rank in the world communicator.
        size: World size.
        local_rank: Rank among the ranks of the same node.
        local_size: Ranks on this node.
        node: Index of this rank's node (0-based, ordered by the lowest world rank on it).
        num_nodes: Number of nodes of the job.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    node: int
    num_nodes: int


@dataclass(frozen=True)
class Placement:
    """The node and local rank of one world rank (input of ``assign_groups``)."""

    rank: int
    node: int
    local_rank: int


def assign_groups(placements: Sequence[Placement], group_size: int) -> list[int]:
    """The group index of every world rank (indexed by rank).

    Ranks are ordered by (node, local rank). With ``group_size`` at most the ranks of a node,
    each node is cut into groups of ``group_size`` and never shares a group with another node;
    a node whose rank count is not a multiple leaves one smaller group. Larger groups take
    whole nodes in order.

    Examples:
        >>> p = [Placement(r, r // 4, r % 4) for r in range(8)]
        >>> assign_groups(p, 2)
        [0, 0, 1, 1, 2, 2, 3, 3]
    """
    check_int("group_size", group_size, 1)
    ordered = sorted(placements, key=lambda p: (p.node, p.local_rank))
    per_node: dict[int, list[Placement]] = {}
    for p in ordered:
        per_node.setdefault(p.node, []).append(p)
    groups = [-1] * len(placements)
    next_group = 0
    if group_size <= min(len(members) for members in per_node.values()):
        for node in sorted(per_node):
            members = per_node[node]
            for start in range(0, len(members), group_size):
                for p in members[start : start + group_size]:
                    groups[p.rank] = next_group
                next_group += 1
    else:
        for i, p in enumerate(ordered):
            groups[p.rank] = i // group_size
    return groups


class _SelfComm:
    """The subset of an MPI communicator the runner uses, for one process without mpi4py."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def gather(self, obj: Any, root: int = 0) -> list[Any]:
        return [obj]

    def allreduce(self, obj: Any, op: Any = None) -> Any:
        return obj

    def Barrier(self) -> None:
        return None

    def barrier(self) -> None:
        return None

    def Abort(self, errorcode: int = 1) -> None:
        raise SystemExit(errorcode)

    def Free(self) -> None:
        return None


def self_comm() -> Comm:
    """A one-process communicator that needs no MPI (the laptop path)."""
    return _SelfComm()


def world_comm() -> Comm:
    """``MPI.COMM_WORLD`` when mpi4py is installed, else a one-process communicator."""
    try:
        from mpi4py import MPI
    except ImportError:
        return _SelfComm()
    return MPI.COMM_WORLD


def finalize_mpi(status: int, *, deadline: float = 15.0) -> None:
    """End MPI on this rank before it exits with ``status`` on its own (every rank of the job
    does the same, in its own time): ``python -m mpi4py`` turns a non-zero exit of a
    process whose MPI is still running into ``MPI_Abort`` and its noise. When ``MPI.Finalize``
    has not returned within ``deadline`` seconds (a rank that left a collective behind), the
    process ends at once with ``status``. Nothing happens without a running MPI."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return

    def force() -> None:
        logging.shutdown()
        os._exit(status)

    timer = threading.Timer(deadline, force)
    timer.daemon = True
    timer.start()
    try:
        mpi.Finalize()
    finally:
        timer.cancel()


def rank_context(comm: Any) -> RankContext:
    """Rank, size, node and local rank of this process, from the communicator itself.

    The node is found with ``Split_type(COMM_TYPE_SHARED)`` rather than launcher variables
    (``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``, ``SLURM_LOCALID``), which differ
    between mpirun, srun and Kubernetes launchers.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if isinstance(comm, _SelfComm):
        return RankContext(rank=0, size=1, local_rank=0, local_size=1, node=0, num_nodes=1)
    from mpi4py import MPI

    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        local_rank, local_size = node_comm.Get_rank(), node_comm.Get_size()
        node_head = node_comm.bcast(rank, root=0)
    finally:
        node_comm.Free()
    heads = sorted(set(comm.allgather(node_head)))
    return RankContext(
        rank=rank,
        size=size,
        local_rank=local_rank,
        local_size=local_size,
        node=heads.index(node_head),
        num_nodes=len(heads),
    )


@dataclass
class EvaluationGroup:
    """The communicators of one rank's evaluation group.

    Attributes:
        context: This rank's ``RankContext``.
        index: Group index (0-based).
        num_groups: Number of groups in the job.
        comm: The group's communicator; rank 0 is the leader, the only rank that talks to
            the Optuna storage.
        leaders: Communicator of all group leaders (``None`` on other ranks).
        node_leaders: Leaders on this node (``None`` on other ranks): first level of the
            hierarchical all-reduce.
        cross_node: One leader per node (``None`` elsewhere): the second level.
        single_node: Whether every rank of this group is on one node (then the torch
            rendezvous address is 127.0.0.1).
        sizes: Size of every group, by index.
    """

    context: RankContext
    index: int
    num_groups: int
    comm: Any
    leaders: Any
    node_leaders: Any
    cross_node: Any
    single_node: bool
    sizes: tuple[int, ...]

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def free(self) -> None:
        """Free the communicators this group created (not the world)."""
        for c in (self.cross_node, self.node_leaders, self.leaders, self.comm):
            if c is not None and not isinstance(c, _SelfComm):
                c.Free()


def form_groups(comm: Any, group_size: int) -> EvaluationGroup:
    """Split ``comm`` into evaluation groups of ``group_size`` ranks, node-local first.

    Collective over ``comm``. ``group_size`` larger than the world is reduced to the world.
    """
    ctx = rank_context(comm)
    check_int("group_size", group_size, 1)
    if isinstance(comm, _SelfComm):
        return EvaluationGroup(ctx, 0, 1, comm, comm, comm, comm, True, (1,))
    from mpi4py import MPI

    size = min(group_size, ctx.size)
    placements = [Placement(*p) for p in comm.allgather((ctx.rank, ctx.node, ctx.local_rank))]
    groups = assign_groups(placements, size)
    index = groups[ctx.rank]
    num_groups = max(groups) + 1
    sizes = tuple(groups.count(g) for g in range(num_groups))
    nodes_of_group = {placements[r].node for r in range(ctx.size) if groups[r] == index}
    if sizes[index] < size and ctx.rank == min(r for r in range(ctx.size) if groups[r] == index):
        _logger.warning(
            "Group %d has %d ranks, fewer than `group_size`=%d (a node's rank count is not a "
            "multiple of it); candidates needing more ranks are infeasible there.",
            index,
            sizes[index],
            size,
        )
    # key orders ranks by node then local rank, so group rank 0 is the lowest placement.
    key = ctx.node * ctx.size + ctx.local_rank
    group_comm = comm.Split(color=index, key=key)
    is_leader = group_comm.Get_rank() == 0
    leaders = comm.Split(color=0 if is_leader else MPI.UNDEFINED, key=index)
    node_leaders = cross_node = None
    if is_leader:
        node_leaders = leaders.Split(color=ctx.node, key=index)
        first_on_node = node_leaders.Get_rank() == 0
        cross_node = leaders.Split(color=0 if first_on_node else MPI.UNDEFINED, key=index)
    if leaders == MPI.COMM_NULL:
        leaders = None
    if cross_node == MPI.COMM_NULL:
        cross_node = None
    return EvaluationGroup(
        context=ctx,
        index=index,
        num_groups=num_groups,
        comm=group_comm,
        leaders=leaders,
        node_leaders=node_leaders,
        cross_node=cross_node,
        single_node=len(nodes_of_group) == 1,
        sizes=sizes,
    )
