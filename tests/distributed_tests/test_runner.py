"""The plain path: one process, no mpirun, no DeepSpeed."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import torch
from torch import nn

from optuna_hpcnas import _keys
from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.config import ConfigError
from optuna_hpcnas.distributed import DistributedConfig
from optuna_hpcnas.distributed import run_search
from optuna_hpcnas.distributed import utilisation_from_study
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
        config=DistributedConfig(precision=precision),
        lr=0.05,
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
            config=DistributedConfig(precision="fp16"),
            lr=0.1,
        )


def _config(tmp_path: Path, **study: object) -> object:
    return config_from_dict(
        {
            "study": {"name": "plain", "storage": f"sqlite:///{tmp_path / 'p.db'}", **study},
            "space": {"overrides": {"data_parallel": [1, 2]}},
            "sampler": {"name": "random", "seed": 0},
            "pruner": {"name": "median", "kwargs": {"n_startup_trials": 1}},
            "training": {"epochs": 2, "steps_per_epoch": 2, "supernet_steps": 1},
        }
    )


def test_single_process_search_and_infeasible_layouts(tmp_path: Path) -> None:
    config = _config(tmp_path, n_trials=6)
    run_search(config)  # type: ignore[arg-type]
    study = optuna.load_study(study_name="plain", storage=f"sqlite:///{tmp_path / 'p.db'}")
    trials = study.get_trials()
    assert len(trials) == 6
    assert all(t.state.is_finished() for t in trials)
    key = f"constraints:{_keys.CLUSTER_RANKS_CONSTRAINT}"
    for t in trials:
        if t.params["cluster.data_parallel"] == 2:  # needs 2 ranks, the group has 1
            assert t.system_attrs[key] == 1.0 and t.values == [float("-inf")]
        else:
            assert t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
            assert t.system_attrs[_keys.DISTRIBUTED_LAYOUT] == "dp1xpp1 on 1 ranks (plain)"
    runs = utilisation_from_study(study)
    assert len(runs) == 1 and runs[0]["ranks"][0]["rank"] == 0
    # rerunning adds the new budget on top (the study is loaded, not recreated)
    run_search(_config(tmp_path, n_trials=2))  # type: ignore[arg-type]
    assert len(study.get_trials()) == 8
    assert len(utilisation_from_study(study)) == 2


def test_several_ranks_need_a_shared_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)

    class TwoRanks:
        def Get_size(self) -> int:
            return 2

        def Get_rank(self) -> int:
            return 0

    config = config_from_dict({"study": {"n_trials": 1}})
    with pytest.raises(ConfigError, match="shared storage"):
        run_search(config, comm=TwoRanks())
