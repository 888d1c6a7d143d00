from __future__ import annotations

import dataclasses

import pytest
import tomllib

from optuna_hpcnas.checkpoints import CheckpointConfig


def test_from_toml_table() -> None:
    table = tomllib.loads(
        """
        [checkpoints]
        every_n_steps = 50
        full_every = 5
        every_p_trials = 20
        heartbeat_interval = 30
        grace_period = 90
        """
    )["checkpoints"]
    config = CheckpointConfig(**table)
    assert config.every_n_steps == 50 and config.full_every == 5 and config.grace_period == 90
    assert CheckpointConfig.from_toml(table) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.top_k = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every_n_steps": 0}, ValueError, "`every_n_steps` is 0"),
        ({"full_every": 1.5}, TypeError, "`full_every` is 1.5"),
        ({"top_k": True}, TypeError, "`top_k` is True"),
        ({"heartbeat_interval": 10, "grace_period": 10}, ValueError, "`grace_period` is 10"),
        ({"exit_deadline": 31}, ValueError, "`exit_deadline` is 31"),
        ({"zstd_level": 23}, ValueError, "`zstd_level` is 23"),
    ],
)
def test_validation_quotes_the_value(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CheckpointConfig(**kwargs)


def test_unknown_toml_key_is_named() -> None:
    with pytest.raises(ValueError, match="every_n_step"):
        CheckpointConfig.from_toml({"every_n_step": 3})
