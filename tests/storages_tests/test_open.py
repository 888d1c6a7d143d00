"""open_storage: every spelling optuna-dashboard accepts, one-line errors, heartbeats, SQLite
first starts from several processes at once."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys
import textwrap
import time

import optuna
import pytest

from optuna_hpcnas.storages import describe_storage
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import storage_kind
from optuna_hpcnas.storages import StorageError
from optuna_hpcnas.storages import supports_heartbeat

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[2]

_EXPECTED_CLASS = {
    "sqlite": "RDBStorage",
    "postgresql": "RDBStorage",
    "mysql": "RDBStorage",
    "journal-file": "JournalStorage",
    "journal-redis": "JournalStorage",
    "grpc": "GrpcStorageProxy",
}


def test_every_backend_round_trips_a_study(storage_url: str) -> None:
    kind = storage_kind(storage_url)
    storage = open_storage(storage_url)
    assert type(storage).__name__ == _EXPECTED_CLASS[kind]
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    # A second, independent opening (another worker) sees the same trials.
    again = optuna.load_study(study_name="s", storage=open_storage(storage_url))
    assert [t.params for t in again.trials] == [t.params for t in study.trials]
    assert again.best_value == max(t.value for t in study.trials)
    assert not supports_heartbeat(study._storage)


def test_the_url_spellings_match_optuna_dashboard(tmp_path: Path) -> None:
    """The same strings open the same storage in optuna-dashboard's own loader."""
    from optuna_dashboard._storage_url import get_storage

    journal = str(tmp_path / "j.log")
    sqlite = f"sqlite:///{tmp_path / 'db.sqlite'}"
    for url in (journal, sqlite):
        study = optuna.create_study(storage=open_storage(url), study_name="shared")
        study.optimize(lambda t: t.suggest_int("n", 0, 9), n_trials=2)
    for url in (journal, sqlite):
        seen = get_storage(url)
        studies = seen.get_all_studies()
        assert [s.study_name for s in studies] == ["shared"]
        assert len(seen.get_all_trials(studies[0]._study_id)) == 2


@pytest.mark.parametrize(
    ("url", "kind", "described"),
    [
        ("sqlite:///nas.db", "sqlite", "SQLite sqlite:///nas.db"),
        (
            "postgresql+psycopg://nas:s3cret@db:5432/optuna",
            "postgresql",
            "PostgreSQL postgresql+psycopg://nas:***@db:5432/optuna",
        ),
        (
            "mysql+pymysql://root:pw@db/optuna",
            "mysql",
            "MySQL/MariaDB mysql+pymysql://root:***@db/optuna",
        ),
        ("mariadb+pymysql://u@db/optuna", "mysql", "MySQL/MariaDB mariadb+pymysql://u@db/optuna"),
        ("redis://:pw@cache:6379/0", "journal-redis", "Redis journal redis://:***@cache:6379/0"),
        ("grpc://proxy:13000", "grpc", "gRPC storage proxy grpc://proxy:13000"),
        ("runs/nas.journal", "journal-file", "journal file runs/nas.journal"),
        ("oracle://u@db/x", "rdb", "RDB oracle://u@db/x"),
    ],
)
def test_kind_and_description_from_the_spelling(url: str, kind: str, described: str) -> None:
    assert storage_kind(url) == kind
    assert describe_storage(url) == described


def test_bad_arguments_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="`url` is 3"):
        open_storage(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`url` is empty"):
        open_storage("  ")
    with pytest.raises(ValueError, match="need a `heartbeat_interval`"):
        open_storage("sqlite:///x.db", max_retry=3)
    with pytest.raises(TypeError, match="`heartbeat_interval` is 1.5"):
        open_storage("sqlite:///x.db", heartbeat_interval=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`grace_period`"):
        open_storage("sqlite:///x.db", heartbeat_interval=10, grace_period=5)
    assert list(tmp_path.iterdir()) == []  # refused before any file is created


def _cases(tmp: Path) -> list[tuple[str, str]]:
    directory = tmp / "adir"
    directory.mkdir()
    text = tmp / "notes.txt"
    text.write_text("hello\nworld\n")
    journal = tmp / "j.log"
    optuna.create_study(storage=open_storage(str(journal)))
    sqlite = tmp / "s.db"
    optuna.create_study(storage=f"sqlite:///{sqlite}")
    port = free_port()  # nothing listens there
    return [
        (str(directory), "is a directory, not a journal file"),
        (f"sqlite:///{directory}", "is a directory, not a SQLite database file"),
        (str(text), "is neither a SQLite database nor an Optuna journal"),
        (f"sqlite:///{text}", "is not a SQLite database"),
        (f"sqlite:///{journal}", "an Optuna journal: pass its path without sqlite:///"),
        (str(sqlite), f"is a SQLite database: use sqlite:///{sqlite}"),
        (str(tmp / "missing" / "j.log"), "does not exist"),
        ("foo://bar/x", "unknown scheme 'foo'"),
        (
            f"postgresql+psycopg://nas:s3cret@127.0.0.1:{port}/x",
            "server not reachable or refused the connection",
        ),
        (f"mysql+pymysql://root:s3cret@127.0.0.1:{port}/x", "server not reachable"),
        (f"redis://:s3cret@127.0.0.1:{port}/0", "Redis server not reachable"),
        (f"grpc://127.0.0.1:{port}", f"no gRPC storage proxy answers at 127.0.0.1:{port}"),
        ("grpc://proxy", "host and port required"),
        ("grpc://proxy:13000/study", "nothing after the port"),
    ]


def test_every_failure_is_one_line_naming_the_masked_url(tmp_path: Path) -> None:
    for url, problem in _cases(tmp_path):
        with pytest.raises(StorageError) as info:
            open_storage(url, connect_timeout=0.5)
        message = str(info.value)
        assert "\n" not in message, message
        assert "s3cret" not in message, message
        assert message.startswith("Cannot open storage "), message
        expected_url = url.replace(":s3cret@", ":***@")
        assert expected_url in message, message
        assert problem in message, message


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_heartbeats_on_rdb_retry_a_dead_workers_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hb.db'}"
    storage = open_storage(url, heartbeat_interval=1, grace_period=2, max_retry=1)
    assert supports_heartbeat(storage)
    assert storage.get_heartbeat_interval() == 1
    study = optuna.create_study(storage=storage)
    assert supports_heartbeat(study._storage)  # through Optuna's cache wrapper too
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    study._storage.record_heartbeat(trial._trial_id)
    time.sleep(3.2)  # SQLite stores heartbeats to the second: 2 s of grace may read as 3
    optuna.storages.fail_stale_trials(study)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    retry = study.get_trials(deepcopy=False)[1]
    assert retry.params == trial.params
    assert optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == 0
    assert not supports_heartbeat(open_storage(url))


_FIRST_START = textwrap.dedent(
    """
    import sys, time
    import optuna
    from optuna_hpcnas.storages import open_storage
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, start = sys.argv[1], float(sys.argv[2])
    while time.time() < start:
        pass
    study = optuna.create_study(
        storage=open_storage(url), study_name="nas", load_if_exists=True
    )
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    print("done")
    """
)


def test_concurrent_first_starts_on_a_new_sqlite_file_all_work(tmp_path: Path) -> None:
    """Unhandled, the losers die with `UNIQUE constraint failed: alembic_version` (or
    `table ... already exists`); opened again, they find the schema and work."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for round_ in range(1):
        work = tmp_path / f"round{round_}"
        work.mkdir()
        url = f"sqlite:///{work / 'nas.db'}"
        start = time.time() + 3.0  # past every interpreter's imports, so they collide
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _FIRST_START, url, str(start)],
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        results = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, results):
            assert p.returncode == 0, err
            assert out.strip() == "done"
            assert "Traceback" not in err, err
        study = optuna.load_study(study_name="nas", storage=url)
        assert len(study.trials) == 8
        # No lock file of ours next to the database (SQLite's write-ahead log and its index
        # live beside it while a connection is open)
        assert [f for f in os.listdir(work) if not f.endswith(("-wal", "-shm"))] == ["nas.db"]


def test_importing_the_package_loads_no_driver_and_no_torch() -> None:
    code = (
        "import sys, optuna_hpcnas.storages\n"
        "names = ('torch', 'sqlalchemy', 'redis', 'grpc', 'optuna')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print(heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_sqlite_uses_the_write_ahead_log_on_local_disks_only(tmp_path: Path) -> None:
    import sqlalchemy

    from optuna_hpcnas.storages._open import on_local_filesystem

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "server:/home /home nfs4 rw 0 0\n"
        "lustre@tcp:/fs /scratch lustre rw 0 0\n"
        "tmpfs /scratch/local tmpfs rw 0 0\n"
    )
    assert on_local_filesystem("/home/user/nas.db", mounts=str(mounts)) is False
    assert on_local_filesystem("/scratch/run/nas.db", mounts=str(mounts)) is False
    assert on_local_filesystem("/scratch/local/nas.db", mounts=str(mounts)) is True
    assert on_local_filesystem("/tmp/nas.db", mounts=str(mounts)) is True
    assert on_local_filesystem("/tmp/nas.db", mounts=str(tmp_path / "missing")) is False

    storage = open_storage(f"sqlite:///{tmp_path / 'nas.db'}")
    with storage.engine.connect() as conn:  # type: ignore[attr-defined]
        mode = conn.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar()
    expected = "wal" if on_local_filesystem(str(tmp_path / "nas.db")) else "delete"
    assert mode == expected
    study = optuna.create_study(storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    # another process reads what was committed, as optuna-dashboard would
    code = (
        "import optuna; s = optuna.load_study(study_name=None, "
        f"storage='sqlite:///{tmp_path / 'nas.db'}'); print(len(s.trials))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"


def test_a_writer_waits_for_the_sqlite_lock_and_gives_up_at_its_timeout(tmp_path: Path) -> None:
    import sqlite3
    import threading

    from optuna_hpcnas.storages._open import _begin_immediate

    path = tmp_path / "lock.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    writer = sqlite3.connect(path, isolation_level=None, timeout=5)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _begin_immediate(writer, timeout=0.05)
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 50  # restored
    release = threading.Timer(0.1, holder.execute, args=("COMMIT",))
    release.start()
    started = time.perf_counter()
    _begin_immediate(writer, timeout=5)  # got the lock once it was released
    waited = time.perf_counter() - started
    writer.execute("INSERT INTO t VALUES (1)")
    writer.execute("COMMIT")
    release.join()
    assert 0.05 < waited < 5
    assert holder.execute("SELECT count(*) FROM t").fetchone()[0] == 1


def test_heartbeat_storage_is_built_by_the_one_rdb_constructor(tmp_path: Path) -> None:
    """``checkpoints.heartbeat_storage`` and ``open_storage`` build the same SQLite storage:
    the write lock taken when a transaction begins, the write-ahead log on a local disk, the
    same lock timeout, heartbeats with Optuna's retry callback."""
    import sqlalchemy

    from optuna_hpcnas.checkpoints import CheckpointConfig
    from optuna_hpcnas.checkpoints import heartbeat_storage
    from optuna_hpcnas.storages import SQLITE_TIMEOUT
    from optuna_hpcnas.storages._open import on_local_filesystem

    config = CheckpointConfig(heartbeat_interval=5, grace_period=20, max_retry=2)
    for name, storage in (
        ("a", heartbeat_storage(f"sqlite:///{tmp_path / 'a.db'}", config)),
        ("b", open_storage(f"sqlite:///{tmp_path / 'b.db'}", heartbeat_interval=5,
                           grace_period=20, max_retry=2)),
    ):  # fmt: skip
        engine = storage.engine  # type: ignore[attr-defined]
        with engine.connect() as conn:
            mode = conn.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar()
            timeout = conn.execute(sqlalchemy.text("PRAGMA busy_timeout")).scalar()
        local = on_local_filesystem(str(tmp_path / f"{name}.db"))
        assert mode == ("wal" if local else "delete"), name
        assert timeout == int(SQLITE_TIMEOUT * 1000), name
        assert storage.heartbeat_interval == 5 and storage.grace_period == 20  # type: ignore[attr-defined]
        callback = storage.get_heartbeat_stale_trial_callback()  # type: ignore[attr-defined]
        assert isinstance(callback, optuna.storages.RetryHeartbeatStaleTrialCallback)


def test_a_reader_never_creates_a_storage(tmp_path: Path) -> None:
    from optuna_hpcnas.storages import StorageError

    for url, problem in (
        (f"sqlite:///{tmp_path / 'absent.db'}", "no such SQLite file"),
        (str(tmp_path / "absent.journal"), "no such journal file"),
    ):
        with pytest.raises(StorageError, match=problem):
            open_storage(url, must_exist=True)
    assert os.listdir(tmp_path) == []
    open_storage(f"sqlite:///{tmp_path / 'new.db'}")  # a writer creates it
    open_storage(f"sqlite:///{tmp_path / 'new.db'}", must_exist=True)
