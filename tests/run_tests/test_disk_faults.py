"""Issue 23: a full or read-only disk ends ``hpcnas run``/``status`` with one line and exit 2,
and leaves no partial checkpoint blob.

Full disks are reproduced without root: a file-size limit (``RLIMIT_FSIZE``) with SIGXFSZ
ignored makes every write past it fail with EFBIG, as a full disk fails with ENOSPC.
Read-only file systems need a read-only bind mount (root in a mount namespace, via
``unshare``), or permissions when the tests do not run as root.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
import resource
import shutil
import sqlite3
import subprocess
import sys
import time

import numpy as np
import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.storages import artifact_store_for
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import out_of_space
from tests.run_configs import tiny_config
from tests.run_configs import write_config

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


# The run ignores SIGXFSZ, so that writes past the limit fail with EFBIG. It is set in the
# child's own interpreter, not by a ``preexec_fn``: a fork from a test worker that has loaded
# gRPC runs gRPC's fork handlers, which may print to the child's stderr before the exec.
_IGNORING_SIGXFSZ = (
    "import runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "sys.argv[0] = 'hpcnas'; runpy.run_module('optuna_hpcnas', run_name='__main__')"
)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def test_out_of_space_names_the_cause() -> None:
    assert out_of_space(OSError(errno.ENOSPC, "No space left on device", "/a")) == (
        "no space left on the device (/a)"
    )
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        assert "disk is full" in str(out_of_space(e))
    assert out_of_space(ValueError("unrelated")) is None


def test_sqlite_full_at_a_checkpoint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The file-size limit is set once the study exists: the supernet's checkpoint after the
    warm-up is the first write past it."""
    db = tmp_path / "full.db"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "full", "storage": f"sqlite:///{db}", "n_trials": 3},
            checkpoints={"enabled": True},
        ),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _IGNORING_SIGXFSZ, "run", "--config", str(config), "--no-progress"],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:  # the budget queued: the next big write is the checkpoint
        assert proc.poll() is None and time.monotonic() < deadline
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                if con.execute("SELECT count(*) FROM trials").fetchone()[0] >= 3:
                    break
        except sqlite3.Error:
            pass
        time.sleep(0.01)
    limit = max(os.path.getsize(p) for p in tmp_path.glob("full.db*")) + 8192
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]  # was 1, with a traceback
    assert "Traceback" not in err
    errors = _error_lines(err)
    assert len(errors) == 1 and errors[0].startswith("hpcnas run: error: the search stopped")
    assert "hpcnas resume" in errors[0]
    study = optuna.load_study(study_name="full", storage=f"sqlite:///{db}")
    attrs = _records.study_system_attrs(study)
    assert not any(k.startswith(_keys.CHECKPOINT_MANIFEST_PREFIX) for k in attrs)


_WRITE_PAST_THE_LIMIT = """
import io, resource, signal, sys
import optuna
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.storages import artifact_store_for, open_storage
import numpy as np
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
journal, directory = sys.argv[1:3]
storage = open_storage(journal)
study = optuna.load_study(study_name="ckpt", storage=storage)
manager = CheckpointManager(
    study=study, artifact_store=artifact_store_for(storage, artifact_store=directory)
)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:
    noise = np.random.default_rng(0).random(200_000, dtype=np.float32)  # no compression
    manager.save({"w": noise}, step=2)
except OSError as e:
    print("OSError", e.errno)
"""


def test_a_full_artifact_directory_leaves_no_partial_blob(tmp_path: Path) -> None:
    journal, directory = str(tmp_path / "s.journal"), tmp_path / "ckpt"
    storage = open_storage(journal)
    study = optuna.create_study(study_name="ckpt", storage=storage)
    manager = CheckpointManager(
        study=study, artifact_store=artifact_store_for(storage, artifact_store=str(directory))
    )
    manager.save({"w": np.zeros(10, dtype=np.float32)}, step=1)  # a small one fits
    before = sorted(p.name for p in directory.iterdir())
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_PAST_THE_LIMIT, journal, str(directory)],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == f"OSError {errno.EFBIG}", done.stderr[-2000:]
    assert sorted(p.name for p in directory.iterdir()) == before  # no partial or temp file
    study = optuna.load_study(study_name="ckpt", storage=open_storage(journal))
    attrs = _records.study_system_attrs(study)
    manifests = [k for k in attrs if k.startswith(_keys.CHECKPOINT_MANIFEST_PREFIX)]
    assert len(manifests) == 1


def test_a_blob_whose_manifest_cannot_be_written_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, directory = str(tmp_path / "s.journal"), tmp_path / "ckpt"
    storage = open_storage(journal)
    study = optuna.create_study(study_name="ckpt", storage=storage)
    manager = CheckpointManager(
        study=study, artifact_store=artifact_store_for(storage, artifact_store=str(directory))
    )

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", journal)

    monkeypatch.setattr(type(study._storage), "set_study_system_attr", full)
    with pytest.raises(OSError):
        manager.save({"w": np.zeros(10, dtype=np.float32)}, step=1)
    assert list(directory.iterdir()) == []


def test_dashboard_plots_on_a_full_disk_after_the_last_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("optuna_dashboard")
    from optuna_hpcnas.config import load_config
    from optuna_hpcnas.run import LaunchError
    from optuna_hpcnas.run._launch import _finish

    url = f"sqlite:///{tmp_path / 'plots.db'}"
    config = load_config(
        write_config(tmp_path / "nas.toml", tiny_config(study={"name": "p", "storage": url}))
    )
    study = optuna.create_study(study_name="p", storage=url, direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)

    def full(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr("optuna_hpcnas.dashboard.save_dashboard_plots", full)
    with pytest.raises(LaunchError, match="every trial finished, but .* disk is full"):
        _finish(config)


def _read_only_runner(tmp_path: Path) -> list[str]:
    """A command prefix that runs with ``tmp_path`` read-only, or a skip."""
    if os.geteuid() != 0:
        for p in tmp_path.iterdir():
            p.chmod(0o444)
        tmp_path.chmod(0o555)
        return []
    unshare = shutil.which("unshare")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    if unshare is None:
        pytest.skip("root without unshare: cannot make a read-only file system here")
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", script, str(tmp_path), "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {probe.stderr.decode()[-200:]}")
    return [unshare, "-m", "sh", "-c", script, str(tmp_path)]


def test_status_and_run_on_a_read_only_file_system(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="ro", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    # the last connection closed: SQLite removes its -wal and -shm files, which a reader
    # would then have to create (with them there, status can read a read-only copy)
    storage.engine.dispose()  # type: ignore[attr-defined]
    del study, storage
    config = write_config(
        tmp_path / "nas.toml", tiny_config(study={"name": "ro", "storage": url, "n_trials": 2})
    )
    prefix = _read_only_runner(tmp_path)
    try:
        for command in (
            ["status", "--storage", url],
            ["run", "--config", str(config), "--no-progress"],
        ):
            done = subprocess.run(
                [*prefix, sys.executable, "-m", "optuna_hpcnas", *command],
                env=ENV, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 2, done.stderr[-2000:]
            assert "Traceback" not in done.stderr
            errors = _error_lines(done.stderr)
            assert len(errors) == 1 and "read-only file system" in errors[0], done.stderr
    finally:
        tmp_path.chmod(0o755)
    study = optuna.load_study(study_name="ro", storage=url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]
