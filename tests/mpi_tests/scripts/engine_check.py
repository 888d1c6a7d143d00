"""Run under mpirun -n 4: DeepSpeed pipeline 2 x data 2 (ZeRO-1, bf16 autocast), then ZeRO-3
data parallel on 2 ranks, re-forming the torch world in between."""

from __future__ import annotations

import json

from mpi4py import MPI
import torch
from torch import nn

from optuna_hpcnas.distributed import DistributedConfig
from optuna_hpcnas.distributed import form_groups
from optuna_hpcnas.distributed._engine import build_engine
from optuna_hpcnas.distributed._engine import TorchWorld
from optuna_hpcnas.distributed._group_engine import broadcast_layers as _broadcast_layers

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
group = form_groups(comm, 4)
gen = torch.Generator().manual_seed(0)
X = torch.randn(512, 16, generator=gen)
Y = (X @ torch.randn(16, 4, generator=gen)).argmax(1)


def batches(replica: int, num_replicas: int, size: int):
    idx = torch.arange(len(X))[replica::num_replicas]
    while True:
        for start in range(0, len(idx) - size + 1, size):
            sel = idx[start : start + size]
            yield X[sel], Y[sel]


def make_layers() -> list[nn.Module]:
    torch.manual_seed(0)  # equal initial weights on every rank
    return [nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)]


def flat(module: nn.Module) -> list[float]:
    return torch.cat(
        [p.detach().reshape(-1) for p in module.parameters()] or [torch.zeros(0)]
    ).tolist()


out: dict = {"rank": rank}
# --- pipeline 2 x data 2 on 4 ranks
config = DistributedConfig(group_size=4, zero_stage=1)
world = TorchWorld(group, config, "cpu")
assert world.ensure(4)
layers = make_layers()
initial = [flat(layer) for layer in layers]
engine = build_engine(
    layers,
    nn.CrossEntropyLoss(),
    data_parallel=2,
    pipeline_stages=2,
    micro_batch_size=8,
    config=config,
    lr=1e-2,
    group_rank=group.rank,
    precision="bf16",
)
stream = batches(rank % 2, 2, 8)
losses = [engine.train_step(stream) for _ in range(12)]
local = {i: flat(engine._copies[i]) for i in engine._local}
out["pipeline"] = {
    "kind": engine.kind,
    "stage": rank // 2,
    "replica": rank % 2,
    "losses": losses,
    "local": local,
    "owners": engine.owners,
}
engine.copy_back(layers, group.rank)
_broadcast_layers(layers, engine.owners)
out["pipeline"]["after_sync"] = [flat(layer) for layer in layers]
out["pipeline"]["changed"] = [flat(layer) != init for layer, init in zip(layers, initial)]
del engine
# --- ZeRO-3 data parallel on the first 2 ranks (the world is re-formed)
config3 = DistributedConfig(group_size=4, zero_stage=3)
world._config = config3
active = world.ensure(2)
if active:
    layers = make_layers()
    initial = [flat(layer) for layer in layers]
    engine = build_engine(
        layers,
        nn.CrossEntropyLoss(),
        data_parallel=2,
        pipeline_stages=1,
        micro_batch_size=16,
        config=config3,
        lr=1e-2,
        group_rank=group.rank,
    )
    stream = batches(rank, 2, 16)
    losses = [engine.train_step(stream) for _ in range(12)]
    engine.copy_back(layers, group.rank)
    out["zero3"] = {
        "kind": engine.kind,
        "losses": losses,
        "changed": [flat(layer) != init for layer, init in zip(layers, initial)],
    }
world.close()
# --- asynchronous hierarchical averaging between 4 groups of 1 (every rank leads)
from optuna_hpcnas.distributed._averaging import ParameterAverager  # noqa: E402

solo = form_groups(comm, 1)
for compression in ("none", "powersgd"):
    tensors = [torch.zeros(8, 6), torch.zeros(5)]
    averager = ParameterAverager(
        solo, tensors, interval=1, compression=compression, powersgd_rank=2
    )
    with torch.no_grad():  # "training": each group moves its weights by its rank
        tensors[0] += rank
        tensors[1] += 2 * rank
    averager.trial_finished()  # starts a round (non-blocking)
    if rank == 1:
        with torch.no_grad():
            tensors[0] += 10  # progress made while the round is in flight is kept
    averager.finish()
    out[compression] = {
        "matrix": tensors[0].flatten().tolist(),
        "vector": tensors[1].tolist(),
        "rounds": averager.rounds_done,
        "bytes": averager.bytes_sent,
        "raw_bytes": averager.bytes_uncompressed,
    }
solo.free()
gathered = comm.gather(out, root=0)
if rank == 0:
    print("RESULT " + json.dumps(gathered), flush=True)
