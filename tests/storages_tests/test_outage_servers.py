"""Storage outages with real servers started here on free ports (PostgreSQL by ``pg_ctl`` on
a temporary directory, Redis with an append-only file), stopped and started again in the
middle of ``hpcnas run``, as a user types it, in one process and under ``mpirun -n 2``:
a 10 s outage is ridden out (exit 0, every trial told once, none lost or retried), one
longer than a 3 s window ends every rank with exit 75 and one line, and ``hpcnas resume``
finishes the budget; so does a server frozen with SIGSTOP past the window. Heartbeats go on
across an outage, sweeps wait after it, and a worker that died during it is recovered once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
import time

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _records
from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.run._calls import StudyCalls
from optuna_hpcnas.storages import EXIT_STORAGE_UNAVAILABLE
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.testing.outages import OutageResult
from optuna_hpcnas.testing.outages import postgres_bin
from optuna_hpcnas.testing.outages import PostgresServer
from optuna_hpcnas.testing.outages import RedisServer
from optuna_hpcnas.testing.outages import run_outage_scenario
from tests.conftest import _skip_or_fail

pytestmark = [pytest.mark.services, pytest.mark.slow]
N_TRIALS = 8  # more than two leaders hold at the stop (two running, two asked ahead)


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    if postgres_bin() is None:
        _skip_or_fail("PostgreSQL's pg_ctl/initdb not found (install postgresql)")
    with PostgresServer() as server:
        yield server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    pytest.importorskip("redis", reason="redis is not installed (optuna-hpcnas[redis])")
    try:
        server = RedisServer()
    except FileNotFoundError as e:
        _skip_or_fail(str(e))
    with server:
        yield server


def _check_clean(result: OutageResult, ranks: int) -> None:
    """One line each way per leader, nothing else about it: no traceback, no MPI_Abort."""
    out = result.output
    assert "Traceback" not in out and "MPI_Abort" not in out and "BAD TERMINATION" not in out
    assert "Caught an error from sqlalchemy" not in out, out[-3000:]
    # one outage line per leader; on a busy machine a leader may get one more answer while
    # the server shuts down, and then logs the rest of the outage as a second, its own line
    assert ranks <= len(result.lines("went away")) <= 2 * ranks, out[-3000:]


def _check_ridden_out(result: OutageResult, ranks: int) -> None:
    out = result.output[-3000:]
    assert result.exit_status == 0, out
    assert result.outage_s >= 10
    _check_clean(result, ranks)
    assert ranks <= len(result.lines("is back after")) <= 2 * ranks, out
    assert (result.finished, result.left, result.failed, result.duplicated) == (
        N_TRIALS,
        0,
        0,
        0,
    ), f"{out}\n{result.unfinished}"
    assert result.resume_after_s is not None and result.resume_after_s < 15, out


def _check_gave_up_then_resumed(result: OutageResult, ranks: int, tolerance: int = 3) -> None:
    out = result.output[-3000:]
    assert result.exit_status == EXIT_STORAGE_UNAVAILABLE, out
    _check_clean(result, ranks)
    # a leader that got one more answer while the server shut down logged "is back" once
    # before its second "went away"; the last outage of every leader ends in the error
    went_away, back = len(result.lines("went away")), len(result.lines("is back after"))
    assert back == went_away - ranks, out
    errors = result.lines("hpcnas run: error: storage")
    assert len(errors) == ranks, out  # one line per rank, naming the storage
    assert all(
        f"outage_tolerance_s = {tolerance}" in line and "hpcnas resume" in line for line in errors
    )
    assert result.stop_to_exit_s < tolerance + 30, out  # within 30 s of the end of the window
    assert result.resumed is not None and result.resumed[0] == 0, result.resumed
    assert "Traceback" not in result.resumed[1]
    counts = (result.finished, result.left, result.lost, result.duplicated)
    assert counts == (result.n_trials, 0, 0, 0)


# Each backend both ways, each way in one process and under mpirun (four runs, not eight:
# a run through an outage takes 30-60 s on two shared cores).
def test_postgresql_outage_of_10s_is_ridden_out(postgres: PostgresServer, tmp_path: Path) -> None:
    result = run_outage_scenario(postgres, tmp_path, ranks=1, outage_s=10, n_trials=N_TRIALS)
    _check_ridden_out(result, 1)


@pytest.mark.mpi
def test_redis_journal_outage_of_10s_is_ridden_out_under_mpirun(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    result = run_outage_scenario(redis_server, tmp_path, ranks=2, outage_s=10, n_trials=N_TRIALS)
    _check_ridden_out(result, 2)


@pytest.mark.mpi
def test_postgresql_outage_past_the_window_exits_75_under_mpirun_and_resume_finishes(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # a budget the two ranks cannot finish before the stop, even on a loaded machine where
    # the stop comes late: both leaders must meet the outage
    result = run_outage_scenario(
        postgres, tmp_path, ranks=2, outage_s=7, tolerance_s=3, n_trials=3 * N_TRIALS
    )
    _check_gave_up_then_resumed(result, 2)


def test_redis_journal_outage_past_the_window_exits_75_and_resume_finishes(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    result = run_outage_scenario(
        redis_server, tmp_path, ranks=1, outage_s=7, tolerance_s=3, n_trials=N_TRIALS
    )
    _check_gave_up_then_resumed(result, 1)


def _check_frozen_past_the_window(
    server: PostgresServer | RedisServer, tmp_path: Path, freeze_s: float
) -> None:
    """Frozen ``freeze_s`` under a 4 s tolerance: exit 75 at least 1 s before the thaw, then
    ``hpcnas resume`` finishes. The exit comes 8-11 s after the freeze on 2 loaded cores (the
    window, then the retry in flight); the freezes leave room above that."""
    result = run_outage_scenario(
        server, tmp_path, ranks=1, outage_s=freeze_s, tolerance_s=4, n_trials=N_TRIALS,
        freeze=True,
    )  # fmt: skip
    assert result.stop_to_exit_s < freeze_s - 1, result.output[-3000:]  # within the freeze
    _check_gave_up_then_resumed(result, 1, tolerance=4)


def test_a_frozen_redis_past_the_window_exits_75_and_resume_finishes(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """SIGSTOP: the server keeps its connections and answers nothing. Every call gives up
    after a quarter of the tolerance (the URL's socket_timeout), so the run exits 75 instead
    of hanging for good."""
    _check_frozen_past_the_window(redis_server, tmp_path, freeze_s=16)


def test_a_frozen_postgresql_past_the_window_exits_75_and_resume_finishes(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """SIGSTOP of the postmaster and every backend. libpq has no read timeout: the storage's
    watchdog cuts a connection that waits a quarter of the tolerance, and a new one gives up
    after connect_timeout, so the run exits 75 instead of hanging for good. The freeze is 2 s
    longer than Redis's: a retry in flight when the window closes may wait libpq's shortest
    connect_timeout, 2 s, where a Redis retry waits the call timeout, 1 s."""
    _check_frozen_past_the_window(postgres, tmp_path, freeze_s=18)


def test_freeze_and_thaw_skip_backends_that_exit_meanwhile(postgres: PostgresServer) -> None:
    """Backends come and go while the server is frozen and thawed (a client connecting and
    leaving in a loop): a backend that exits between the listing and its signal is skipped,
    never an error, and the thawed server answers."""
    import threading

    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres.url, poolclass=sqlalchemy.pool.NullPool)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            try:
                with engine.connect() as connection:
                    connection.execute(sqlalchemy.text("SELECT 1"))
            except sqlalchemy.exc.OperationalError:
                time.sleep(0.01)

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(100):
            postgres.freeze()
            postgres.thaw()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    with engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT 1")).scalar() == 1


# ---------------------------------------------------------------------------- heartbeats
def test_heartbeats_go_on_across_an_outage_and_a_dead_worker_is_recovered_once(
    postgres: PostgresServer,
) -> None:
    """Two workers hold a trial each (heartbeat 1 s, grace 3 s); the server is away 6 s.
    Right after it is back a sweep is skipped; once the quiet time is over both trials are
    alive (their heartbeats went on). Then worker A dies: one sweep fails its trial and
    queues one retry; sweeps by the others find nothing more to do."""
    data = {
        "study": {"name": "hb", "storage": postgres.url, "n_trials": 4},
        "checkpoints": {"heartbeat_interval": 1, "grace_period": 3},
        "storage": {"outage_tolerance_s": 60},
    }
    config = config_from_dict(data)

    def worker() -> StudyCalls:
        storage = open_storage(postgres.url, heartbeat_interval=1, grace_period=3, max_retry=3)
        study = optuna.create_study(study_name="hb", storage=storage, load_if_exists=True)
        return StudyCalls(study, config)

    a, b, c = worker(), worker(), worker()
    _records.add_budget(a.study, 4)
    trial_a, trial_b = a.take(), b.take()
    assert trial_a is not None and trial_b is not None
    alive_a, alive_b = a.keep_alive(trial_a), b.keep_alive(trial_b)
    try:
        postgres.stop()
        time.sleep(6)
        postgres.start()
        deadline = time.monotonic() + 30
        while b.window.down or not b.window.outages:  # b's heartbeat finds it back
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not b.window.sweeps_allowed()
        b.sweep()  # skipped: a's heartbeat may not have been sent since
        assert a.study._storage.get_trial(trial_a._trial_id).state == TrialState.RUNNING
        time.sleep(b.window.quiet + 0.5)
        assert b.window.sweeps_allowed()
        b.sweep()
        c.sweep()
        states = {t.number: t.state for t in a.study.get_trials(deepcopy=False)}
        assert states[trial_a.number] == states[trial_b.number] == TrialState.RUNNING
        alive_a.close()  # worker A dies: its heartbeats stop, its trial stays RUNNING
        time.sleep(3.5)
        for sweeper in (b, c, b):
            sweeper.sweep()
    finally:
        alive_a.close()
        alive_b.close()
    trials = b.study.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.number for t in failed] == [trial_a.number]
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == trial_a.number]
    assert len(retries) == 1 and retries[0].state == TrialState.WAITING
    assert b.study._storage.get_trial(trial_b._trial_id).state == TrialState.RUNNING


def test_errors_not_about_the_connection_fail_fast_on_a_live_server(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_from_dict({"study": {"name": "ff", "storage": postgres.url, "n_trials": 1}})
    study = optuna.create_study(study_name="ff", storage=open_storage(postgres.url))
    calls = StudyCalls(study, config)
    trial = study.ask()
    study.tell(trial, 1.0)
    started = time.monotonic()
    with pytest.raises(UpdateFinishedTrialError):
        calls.constrain(trial, "c", 1.0)  # a finished trial: the server answered, no retry
    with pytest.raises(KeyError):
        calls.checkpoint(study._storage.get_trial, 10**6)
    assert time.monotonic() - started < 2
    assert not calls.window.outages and "went away" not in caplog.text
