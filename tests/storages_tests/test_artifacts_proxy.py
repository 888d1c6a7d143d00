"""artifact_store_for (where checkpoints go) and the gRPC proxy command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import signal
import subprocess
import sys

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore
import pytest

from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import RDBArtifactStore
from optuna_hpcnas.storages import add_storage_proxy_arguments
from optuna_hpcnas.storages import artifact_store_for
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import start_storage_proxy
from optuna_hpcnas.storages import storage_kind
from optuna_hpcnas.storages import StorageError

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_checkpoints_go_to_the_database_or_the_configured_directory(
    storage_url: str, tmp_path: Path
) -> None:
    storage = open_storage(storage_url)
    study = optuna.create_study(storage=storage)
    is_rdb = storage_kind(storage_url) in ("sqlite", "postgresql", "mysql")
    if is_rdb:
        store = artifact_store_for(study._storage, artifact_store=None)
        assert isinstance(store, RDBArtifactStore)
    else:
        with pytest.raises(StorageError, match=r"set `\[checkpoints\] artifact_store`"):
            artifact_store_for(study._storage, artifact_store=None)
        store = artifact_store_for(study._storage, artifact_store=str(tmp_path / "ckpt"))
        assert isinstance(store, FileSystemArtifactStore)
    weights = {"w": np.arange(12, dtype=np.float32)}
    CheckpointManager(study=study, artifact_store=store).save(weights, step=3)
    # A fresh worker on the same storage finds and verifies it.
    again = optuna.load_study(study_name=study.study_name, storage=open_storage(storage_url))
    loaded = CheckpointManager(study=again, artifact_store=store).load_latest()
    assert loaded is not None and loaded.step == 3
    np.testing.assert_array_equal(loaded.array("w"), weights["w"])


def test_a_configured_directory_must_be_a_directory(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "j.log"))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(StorageError, match="which is not a directory"):
        artifact_store_for(storage, artifact_store=str(a_file))
    with pytest.raises(TypeError, match="`artifact_store` is 3"):
        artifact_store_for(storage, artifact_store=3)  # type: ignore[arg-type]


def test_proxy_refuses_journals_and_a_taken_port(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="serves RDB storages only"):
        start_storage_proxy(str(tmp_path / "j.log"), port=free_port())
    with pytest.raises(ValueError, match="`port` is 0"):
        start_storage_proxy(f"sqlite:///{tmp_path / 'a.db'}", port=0)
    port = free_port()
    server = start_storage_proxy(f"sqlite:///{tmp_path / 'a.db'}", port=port)
    try:
        with pytest.raises(StorageError, match=f"on 127.0.0.1:{port}"):
            start_storage_proxy(f"sqlite:///{tmp_path / 'b.db'}", port=port)
    finally:
        server.stop(grace=None)


def test_proxy_arguments_default_to_loopback() -> None:
    parser = argparse.ArgumentParser()
    add_storage_proxy_arguments(parser)
    args = parser.parse_args(["--storage", "sqlite:///x.db"])
    assert (args.storage, args.host, args.port) == ("sqlite:///x.db", "127.0.0.1", 13000)


_COMMAND = (
    "import argparse, logging, sys\n"
    "from optuna_hpcnas.storages import add_storage_proxy_arguments, storage_proxy_command\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "p = argparse.ArgumentParser(); add_storage_proxy_arguments(p)\n"
    "sys.exit(storage_proxy_command(p.parse_args(sys.argv[1:])))\n"
)


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    inherited = {k: v for k, v in os.environ.items() if k != "OPTUNA_STORAGE"}
    full_env = {**inherited, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-c", _COMMAND, *args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_storage_proxy_command_serves_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"sqlite:///{tmp_path / 'served.db'}"
    # The URL comes from OPTUNA_STORAGE, as it should when it holds a password.
    proc = _command("--port", str(port), env={"OPTUNA_STORAGE": url})
    try:
        client = open_storage(f"grpc://127.0.0.1:{port}", connect_timeout=60)
        study = optuna.create_study(storage=client, study_name="via-proxy")
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"listening on 127.0.0.1:{port}" in err
    assert "Traceback" not in err
    # The trials are in the database behind the proxy.
    assert len(optuna.load_study(study_name="via-proxy", storage=url).trials) == 3


def test_storage_proxy_command_reports_a_bad_storage_in_one_line(tmp_path: Path) -> None:
    proc = _command("--storage", str(tmp_path / "j.log"), "--port", str(free_port()))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0 and "serves RDB storages only" in err
    proc = _command()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "give --storage URL or set OPTUNA_STORAGE" in err
