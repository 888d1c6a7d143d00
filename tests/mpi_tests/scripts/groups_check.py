"""Run under mpirun: form groups of 1, 2 and 4 ranks and exercise the leader protocol."""

from __future__ import annotations

import json

from mpi4py import MPI

from optuna_hpcnas.distributed import form_groups
from optuna_hpcnas.distributed import GroupChannel
from optuna_hpcnas.distributed import GroupError

comm = MPI.COMM_WORLD
results = {}
for size in (1, 2, 4):
    g = form_groups(comm, size)
    record = {
        "index": g.index,
        "num_groups": g.num_groups,
        "group_rank": g.rank,
        "group_size": g.size,
        "leader": g.is_leader,
        "leaders": g.leaders.Get_size() if g.leaders is not None else None,
        "node_leaders": g.node_leaders.Get_size() if g.node_leaders is not None else None,
        "cross_node": g.cross_node.Get_size() if g.cross_node is not None else None,
        "single_node": g.single_node,
        "sizes": list(g.sizes),
        "node": g.context.node,
        "local_rank": g.context.local_rank,
    }
    channel = GroupChannel(g.comm, group_index=g.index)
    record["shared"] = channel.share(
        {"group": g.index, "from": comm.Get_rank()} if g.is_leader else None
    )
    try:
        if g.is_leader:
            with channel.leader_section("in the test"):
                raise ValueError(f"boom in group {g.index}")
        channel.share()
        record["error"] = None
    except (GroupError, ValueError) as e:
        record["error"] = f"{type(e).__name__}: {e}"
    # the group is still usable after an error
    record["after"] = channel.share("still alive" if g.is_leader else None)
    results[size] = record
    g.free()
gathered = comm.gather(results, root=0)
if comm.Get_rank() == 0:
    print("RESULT " + json.dumps(gathered), flush=True)
