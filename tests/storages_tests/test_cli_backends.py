"""``hpcnas run`` / ``status`` / ``best`` / ``export`` on every Optuna storage, as typed.

The same tiny search on SQLite, PostgreSQL, MariaDB, a journal file, the Redis journal and the
gRPC proxy; checkpoints go to the study's database on RDB storages and to
``[checkpoints] artifact_store`` on the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from optuna_hpcnas.cli import main
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import storage_kind
from tests.run_configs import tiny_config
from tests.run_configs import write_config


def test_run_status_best_export_on_every_backend(
    storage_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rdb = storage_kind(storage_url) in ("sqlite", "postgresql", "mysql")
    checkpoints = {"enabled": True, "every_n_steps": 1}
    if not rdb:
        checkpoints["artifact_store"] = str(tmp_path / "artifacts")
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "backends", "storage": storage_url, "n_trials": 3},
            pruner={"name": "none"},
            checkpoints=checkpoints,
        ),
    )
    assert main(["run", "--config", str(config), "--no-progress"]) == 0
    study = optuna.load_study(study_name="backends", storage=open_storage(storage_url))
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)
    # the run kept each trial alive from its pop: a heartbeat (RDB) or a lease (the others)
    if not rdb:
        assert all("hpcnas:storages:lease" in t.system_attrs for t in trials)
    capsys.readouterr()
    assert main(["status", "--storage", storage_url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["by_state"]["COMPLETE"] == 3 and info["study"] == "backends"
    assert main(["best", "--storage", storage_url, "--top", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    out = tmp_path / "export"
    assert main(["export", "--config", str(config), "--out", str(out), "--no-onnx"]) == 0
    assert (out / "model.pt2").is_file()
    if not rdb:  # the supernet checkpoints went to the artifact directory
        assert any((tmp_path / "artifacts").iterdir())


def test_storage_without_artifact_store_is_refused_with_checkpoints(
    journal_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "j", "storage": journal_path, "n_trials": 1},
            checkpoints={"enabled": True},
        ),
    )
    assert main(["run", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "[checkpoints] artifact_store" in err and "Traceback" not in err
