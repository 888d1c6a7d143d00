"""Engines on one process: the rendezvous environment and the precision check (the DeepSpeed
engines train under mpirun: tests/mpi_tests)."""

from __future__ import annotations

import pytest
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
