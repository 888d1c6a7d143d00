"""Engines on one process: the rendezvous environment and the plain path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optuna_hpcnas.distributed import DistributedConfig
from optuna_hpcnas.distributed._engine import build_engine
from optuna_hpcnas.distributed._engine import rendezvous_env


def test_rendezvous_env_is_explicit() -> None:
    env = rendezvous_env(
        rank=1, world_size=4, local_rank=1, master_addr="127.0.0.1", master_port=29500
    )
    assert env == {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    assert "GLOO_SOCKET_IFNAME" not in rendezvous_env(
        rank=0, world_size=2, local_rank=0, master_addr="10.0.0.5", master_port=1
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_plain_engine_trains_a_copy_and_copies_back(precision: str) -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)]
    before = [p.clone() for p in layers[0].parameters()]
    engine = build_engine(
        layers,
        nn.CrossEntropyLoss(),
        data_parallel=1,
        pipeline_stages=1,
        micro_batch_size=16,
        config=DistributedConfig(),
        lr=0.05,
        precision=precision,
    )
    assert engine.kind == "plain"
    x = torch.randn(64, 8)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    stream = iter([(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)] * 10)
    losses = [engine.train_step(stream) for _ in range(40)]
    assert sum(losses[-4:]) < sum(losses[:4])
    # the originals are untouched until copy_back
    assert all(torch.equal(a, b) for a, b in zip(before, layers[0].parameters()))
    assert engine.copy_back(layers, 0) == [0, 1, 2]
    assert not torch.equal(before[0], layers[0].weight)


def test_fp16_on_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="fp16.*needs a GPU"):
        build_engine(
            [nn.Linear(2, 2)],
            nn.CrossEntropyLoss(),
            data_parallel=1,
            pipeline_stages=1,
            micro_batch_size=4,
            config=DistributedConfig(),
            lr=0.1,
            precision="fp16",
        )
