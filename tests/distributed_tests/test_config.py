from __future__ import annotations

from pathlib import Path

import pytest

from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.config import ConfigError
from optuna_hpcnas.config import load_config
from optuna_hpcnas.config import RunConfig
from optuna_hpcnas.distributed import DistributedConfig

FULL = """
[study]
name = "digits"
storage = "sqlite:///nas.db"
directions = ["maximize", "minimize"]
n_trials = 40
timeout = 600
[space]
preset = "digits-small"
overrides = { max_ranks = 2, data_parallel = [1, 2] }
[sampler]
name = "nsga2"
seed = 1
kwargs = { population_size = 8 }
[pruner]
name = "median"
kwargs = { n_startup_trials = 2 }
[stages]
stages = [{ name = "quick", steps = 10, lr = 1e-3 }, { name = "full", steps = 20, lr = 1e-2 }]
patience = 2
[training]
epochs = 3
lr = 0.001
precision = "bf16"
threads = 2
[objective]
objectives = ["accuracy", "flops"]
optimizer = "adam"
[data]
name = "digits"
[distributed]
group_size = 2
sync_interval = 3
compression = "powersgd"
zero_stage = 1
[export]
steps = 1200
[checkpoints]
enabled = true
[metrics]
port = 9000
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nas.toml"
    path.write_text(text)
    return path


def test_full_config_maps_every_table(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, FULL))
    assert isinstance(config, RunConfig)
    assert config.study.directions == ("maximize", "minimize")
    assert config.distributed == DistributedConfig(
        group_size=2, sync_interval=3, compression="powersgd", zero_stage=1
    )
    # the API's own classes, with the same fields
    from optuna_hpcnas.evaluation import ObjectiveConfig
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.pruners import StagePlan
    from optuna_hpcnas.supernet import SupernetTrainingConfig

    assert config.objective == ObjectiveConfig(objectives=("accuracy", "flops"), optimizer="adam")
    assert config.training.supernet == SupernetTrainingConfig(epochs=3, lr=0.001, precision="bf16")
    assert config.training.threads == 2
    assert isinstance(config.stages, StagePlan) and config.stages.boundaries == (10, 30)
    assert config.export == ScratchTrainingConfig(steps=1200)
    assert config.directions == ["maximize", "minimize"]
    assert config.metrics.port == 9000 and config.checkpoints.enabled
    space = config.space.build()
    assert space.max_ranks == 2
    sampler = config.sampler.build()
    assert type(sampler).__name__ == "NSGAIISampler"
    assert type(config.pruner.build()).__name__ == "MedianPruner"


def test_overrides_as_strings_and_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, FULL)
    config = load_config(path, ["distributed.group_size=4", "study.name=other"])
    assert config.distributed.group_size == 4 and config.study.name == "other"
    config = load_config(path, {"training.epochs": 7, "space.overrides.max_ranks": 4})
    assert config.training.supernet.epochs == 7 and config.space.build().max_ranks == 4


def test_unknown_key_names_the_key_and_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"`group_sise` in \[distributed\].*'group_size'"):
        load_config(_write(tmp_path, "[study]\nn_trials = 1\n[distributed]\ngroup_sise = 2\n"))
    with pytest.raises(ConfigError, match=r"Unknown section \[distributd\]"):
        config_from_dict({"study": {"n_trials": 1}, "distributd": {}})
    with pytest.raises(ConfigError, match="Unknown section"):
        load_config(_write(tmp_path, "[study]\nn_trials = 1\n"), ["nope.key=1"])


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"training": {"precision": "fp8"}}, r"`precision` is 'fp8'.*'bf16'"),
        ({"training": {"epoch": 2}}, r"Unknown key `epoch` in \[training\].*'epochs'"),
        ({"objective": {"optimizer": "adamw"}}, r"`optimizer` is 'adamw'.*'adam', 'sgd'"),
        ({"export": {"epochs": 30}}, r"\[export\] `epochs` is no longer a unit.*`steps`"),
        (
            {"stages": {"stages": [{"name": "q", "epochs": 1, "lr": 0.1}]}},
            r"write `steps` instead of `epochs`",
        ),
        ({"objective": {"batch_size": 1}}, r"`batch_size` is 1, but must be >= 2"),
        ({"objective": {"validation": "kfold"}}, r"`validation` is 'kfold'"),
        ({"data": {"name": "npz"}}, r"needs `path`"),
        ({"data": {"factory": "no colon"}}, r"package.module:function"),
        ({"distributed": {"zero_stage": 4}}, r"`zero_stage` is 4"),
        ({"distributed": {"group_size": -1}}, r"`group_size` is -1"),
        ({"distributed": {"group_size": "2"}}, r"`group_size` is '2', but must be an int"),
        ({"distributed": {"compression": "topk"}}, r"'none', 'powersgd'"),
        ({"sampler": {"name": "cmaes"}}, r"`name` is 'cmaes'.*'evolutionary'"),
        ({"pruner": {"name": "asha"}}, r"`name` is 'asha'"),
        ({"space": {"preset": "imagenet"}}, r"`preset` is 'imagenet'.*'digits-small'"),
        ({"objective": {"objectives": ["acc"]}}, r"`objectives` contains 'acc'"),
        ({"training": {"device": "tpu"}}, r"`device` is 'tpu'"),
    ],
)
def test_bad_values_raise_with_the_allowed_values(table: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"study": {"n_trials": 1}, **table})


def test_study_needs_an_end_and_one_direction_per_metric() -> None:
    with pytest.raises(ConfigError, match="n_trials` or `timeout"):
        config_from_dict({"study": {}})
    with pytest.raises(ConfigError, match="missing"):
        config_from_dict({})
    with pytest.raises(ConfigError, match="one direction per objective"):
        config_from_dict(
            {
                "study": {"n_trials": 1, "directions": ["maximize"]},
                "objective": {"objectives": ["accuracy", "flops"]},
            }
        )
    # without [study] directions, the objectives give them
    config = config_from_dict(
        {"study": {"n_trials": 1}, "objective": {"objectives": ["accuracy", "loss"]}}
    )
    assert config.directions == ["maximize", "minimize"]


def test_storage_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_dict({"study": {"n_trials": 1}})
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    assert config.study.resolved_storage() == "sqlite:///hpcnas.db"  # never silently in memory
    monkeypatch.setenv("OPTUNA_STORAGE", "postgresql+psycopg://u@127.0.0.1/db")
    assert config.study.resolved_storage() == "postgresql+psycopg://u@127.0.0.1/db"
    explicit = config_from_dict({"study": {"n_trials": 1, "storage": "sqlite:///x.db"}})
    assert explicit.study.resolved_storage() == "sqlite:///x.db"


def test_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[study\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_config_and_distributed_import_no_heavy_dependency() -> None:
    import subprocess
    import sys

    code = (
        "import sys, optuna_hpcnas.config as c, optuna_hpcnas.distributed; "
        "c.config_from_dict({'study': {'n_trials': 1}, 'objective': {'max_flops': 1e6}}); "
        "print(','.join(m for m in ('torch', 'deepspeed', 'mpi4py') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_group_size_zero_follows_the_space_cluster_parameters() -> None:
    from optuna_hpcnas.run._search import group_size as _group_size

    config = config_from_dict(
        {
            "study": {"n_trials": 1},
            "space": {"overrides": {"data_parallel": [1, 2], "pipeline_stages": [1, 3]}},
            "distributed": {"group_size": 0},
        }
    )
    space = config.space.build()
    assert _group_size(config.distributed, space) == 6
    capped = config_from_dict(
        {
            "study": {"n_trials": 1},
            "space": {
                "overrides": {"data_parallel": [1, 2], "pipeline_stages": [1, 3], "max_ranks": 4}
            },
        }
    )
    assert _group_size(DistributedConfig(group_size=0), capped.space.build()) == 4
    assert _group_size(DistributedConfig(group_size=2), space) == 2


def test_checkpoints_table_is_the_checkpoint_components_config() -> None:
    from optuna_hpcnas.checkpoints import CheckpointConfig as ComponentConfig

    config = config_from_dict(
        {
            "study": {"n_trials": 1},
            "checkpoints": {
                "enabled": True,
                "every_n_steps": 5,
                "heartbeat_interval": 1,
                "grace_period": 3,
                "max_retry": 2,
            },
        }
    )
    assert isinstance(config.checkpoints, ComponentConfig)
    assert config.checkpoints.enabled and config.checkpoints.every_n_steps == 5
    assert (config.checkpoints.grace_period, config.checkpoints.max_retry) == (3, 2)
    with pytest.raises(ConfigError, match="`every_n_trials` in \\[checkpoints\\].*every_n_steps"):
        config_from_dict({"study": {"n_trials": 1}, "checkpoints": {"every_n_trials": 3}})
    with pytest.raises(ConfigError, match="grace_period` is 1"):
        config_from_dict(
            {"study": {"n_trials": 1}, "checkpoints": {"heartbeat_interval": 1, "grace_period": 1}}
        )


def make_identity_op(*, spec: object, domain: str, channels: int) -> object:
    """A user operator factory for the ``[[space.operator]]`` test."""
    from optuna_hpcnas.supernet._ops import IdentityOp

    return IdentityOp(domain)


def test_space_operator_tables_add_a_users_operator() -> None:
    own = {"name": "mine", "factory": f"{__name__}:make_identity_op"}
    study = {"n_trials": 1}
    config = config_from_dict(
        {"study": study, "space": {"preset": "digits-small", "operator": [own]}}
    )
    space = config.space.build()
    names = [spec.name for spec in space.operators]
    assert names[-1] == "mine" and "conv3x3" in names
    mine = space.operators[-1]
    assert mine.family == "mine" and mine.domains == {"image"} and mine.factory is not None
    with pytest.raises(ConfigError, match="needs a `factory`"):
        config_from_dict({"study": study, "space": {"operator": [{"name": "mine"}]}})
    broken = {"name": "mine", "factory": "no_such_module:make"}
    with pytest.raises(ConfigError, match=r"\[space\].*no_such_module.*cannot be imported"):
        config_from_dict({"study": study, "space": {"operator": [broken]}}).space.build()
