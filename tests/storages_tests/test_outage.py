"""The storage outage window without servers: which errors are connection-level, the
backoff, the window's retries, its two log lines and its end, and the calls made idempotent
for a retry whose first try reached the storage (a tell and a pop whose answers were lost)."""

from __future__ import annotations

from collections.abc import Callable
import logging
from pathlib import Path
import random
import sqlite3
import threading
from typing import Any

import optuna
from optuna.exceptions import StorageInternalError
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
import psycopg
import psycopg.errors
import pymysql.err
import pytest
import redis.exceptions
import sqlalchemy.exc

from optuna_hpcnas import _records
from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.config import ConfigError
from optuna_hpcnas.storages import Backoff
from optuna_hpcnas.storages import is_connection_error
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import OutageWindow
from optuna_hpcnas.storages import quiet_disconnect_warnings
from optuna_hpcnas.storages import StorageUnavailable

URL = "postgresql+psycopg://nas:s3cret@db.example:5432/optuna"


def _wrapped(orig: BaseException) -> BaseException:
    """As Optuna's RDB storage raises it: StorageInternalError from SQLAlchemy's error."""
    try:
        try:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, orig)
        except sqlalchemy.exc.SQLAlchemyError as e:
            raise StorageInternalError("An exception is raised during the commit.") from e
    except StorageInternalError as e:
        return e


@pytest.mark.parametrize(
    "error",
    [
        _wrapped(psycopg.OperationalError("connection failed: Connection refused")),
        _wrapped(psycopg.errors.ConnectionTimeout("connection timeout expired")),  # frozen
        _wrapped(psycopg.errors.AdminShutdown("terminating connection")),
        _wrapped(psycopg.errors.CannotConnectNow("the database system is starting up")),
        sqlalchemy.exc.DBAPIError("SELECT 1", {}, Exception("x"), connection_invalidated=True),
        _wrapped(pymysql.err.OperationalError(2006, "MySQL server has gone away")),
        _wrapped(pymysql.err.OperationalError(2003, "Can't connect to MySQL server")),
        redis.exceptions.ConnectionError("Error 111 connecting. Connection refused."),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionError("GRPC connection timeout"),  # Optuna's gRPC client, waiting
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:30],
)
def test_connection_level_errors_of_every_backend_are_retried(error: BaseException) -> None:
    assert is_connection_error(error)


@pytest.mark.parametrize(
    "error",
    [
        _wrapped(sqlite3.OperationalError("database is locked")),
        _wrapped(psycopg.errors.UniqueViolation("duplicate key")),
        _wrapped(psycopg.errors.QueryCanceled("canceling statement due to statement timeout")),
        _wrapped(psycopg.errors.DeadlockDetected("deadlock detected")),
        _wrapped(pymysql.err.OperationalError(1213, "Deadlock found")),
        sqlalchemy.exc.DBAPIError("SELECT 1", {}, Exception("x"), connection_invalidated=False),
        redis.exceptions.ResponseError("WRONGTYPE"),
        UpdateFinishedTrialError("Trial#3 has already finished"),
        ValueError("Cannot tell a COMPLETE trial."),
        KeyError("No trial with trial_id 7 exists."),
        RuntimeError("boom"),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:30],
)
def test_other_errors_are_not_connection_level(error: BaseException) -> None:
    assert not is_connection_error(error)


def test_a_grpc_proxy_that_went_away_is_connection_level(tmp_path: Path) -> None:
    pytest.importorskip("grpc", reason="grpcio is not installed (optuna-hpcnas[grpc])")
    from optuna_hpcnas.storages import start_storage_proxy
    from tests.storages_tests.conftest import free_port

    port = free_port()
    server = start_storage_proxy(f"sqlite:///{tmp_path / 'p.db'}", port=port)
    proxy = open_storage(f"grpc://127.0.0.1:{port}")
    proxy.get_all_studies()
    server.stop(grace=None).wait()
    with pytest.raises(Exception) as info:
        proxy.get_all_studies()
    assert type(info.value).__module__.startswith("grpc")
    assert info.value.code().name == "UNAVAILABLE"  # type: ignore[attr-defined]
    assert is_connection_error(info.value)


# ---------------------------------------------------------------------------- backoff
def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    b = Backoff(base=0.1, cap=2.0)
    rng = random.Random(7)
    delays = [b.delay(n, rng) for n in range(12)]
    for n, d in enumerate(delays):
        ceiling = min(2.0, 0.1 * 2**n)
        assert ceiling / 2 <= d <= ceiling
    assert max(delays) <= 2.0 and delays[-1] >= 1.0
    again = [b.delay(n, random.Random(7)) for n in range(3)]
    other = [b.delay(n, random.Random(8)) for n in range(3)]
    assert again == [Backoff(base=0.1, cap=2.0).delay(n, random.Random(7)) for n in range(3)]
    assert again != other  # jitter: two workers do not retry in step
    assert b.delay(10**6, rng) <= 2.0  # no overflow


@pytest.mark.parametrize(
    "kwargs", [{"base": 0}, {"cap": float("nan")}, {"cap": -1}, {"factor": 0.5}]
)
def test_backoff_refuses_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


# ---------------------------------------------------------------------------- the window
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _window(tolerance: float = 30.0, quiet: float = 0.0) -> tuple[OutageWindow, _Clock]:
    clock = _Clock()
    window = OutageWindow(
        URL,
        tolerance=tolerance,
        quiet=quiet,
        backoff=Backoff(base=0.5, cap=4.0),
        rng=random.Random(0),
        clock=clock,
        sleep=clock.sleep,
    )
    return window, clock


def _failing(n: int, error: Callable[[], BaseException]) -> Callable[[], str]:
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= n:
            raise error()
        return f"answered after {calls['n']} tries"

    return fn


def _outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("_outage")]


def test_the_window_retries_with_backoff_and_logs_one_line_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    window, clock = _window()
    caplog.set_level(logging.WARNING)
    error = lambda: _wrapped(psycopg.OperationalError("connection failed"))  # noqa: E731
    assert window.call(_failing(6, error)) == "answered after 7 tries"
    assert len(clock.slept) == 6
    assert all(0.25 <= s <= 4.0 for s in clock.slept) and clock.slept[-1] >= 2.0
    lines = _outage_lines(caplog)
    assert len(lines) == 2, lines
    assert (
        "went away" in lines[0] and "nas:***@db.example" in lines[0] and "s3cret" not in lines[0]
    )
    assert "OperationalError: connection failed" in lines[0]  # the driver's, not Optuna's
    assert "is back after" in lines[1]
    assert window.outages == 1 and not window.down
    assert window.call(lambda: 1) == 1 and len(_outage_lines(caplog)) == 2


def test_past_the_window_every_call_fails_fast_with_the_masked_storage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    window, clock = _window(tolerance=10.0)
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageUnavailable) as info:
        window.call(_failing(10**6, lambda: redis.exceptions.ConnectionError("refused")))
    message = str(info.value)
    assert "unreachable for 10 s" in message and "outage_tolerance_s = 10" in message
    assert "nas:***@db.example" in message and "s3cret" not in message
    assert 10.0 <= clock.now <= 10.2  # the last wait is cut to the window
    assert window.gave_up and len(_outage_lines(caplog)) == 1  # no "back" line
    called = []
    with pytest.raises(StorageUnavailable):
        window.call(lambda: called.append(1))
    assert not called
    with pytest.raises(StorageUnavailable):
        window.check()


def test_errors_not_about_the_connection_fail_fast() -> None:
    window, clock = _window()
    for error in (
        lambda: UpdateFinishedTrialError("finished"),
        lambda: _wrapped(sqlite3.OperationalError("database is locked")),
        lambda: ValueError("bad value"),
    ):
        fn = _failing(1, error)
        with pytest.raises((UpdateFinishedTrialError, StorageInternalError, ValueError)):
            window.call(fn)
    assert clock.slept == [] and not window.down


def test_a_zero_window_gives_up_at_the_first_connection_error() -> None:
    window, clock = _window(tolerance=0)
    with pytest.raises(StorageUnavailable):
        window.call(_failing(1, lambda: ConnectionResetError("reset")))
    assert clock.slept == []


def test_sweeps_wait_while_the_storage_is_away_and_a_quiet_time_after() -> None:
    window, clock = _window(quiet=6.0)
    assert window.sweeps_allowed()
    window.failed(ConnectionRefusedError())
    assert not window.sweeps_allowed()
    clock.now += 3
    window.succeeded()
    assert not window.sweeps_allowed()
    clock.now += 5.9
    assert not window.sweeps_allowed()
    clock.now += 0.2
    assert window.sweeps_allowed()


def test_threads_that_find_the_storage_gone_together_log_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    window = OutageWindow(URL, tolerance=60)
    caplog.set_level(logging.WARNING)
    barrier = threading.Barrier(8)

    def lose() -> None:
        barrier.wait()
        window.failed(ConnectionRefusedError())

    threads = [threading.Thread(target=lose) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    window.succeeded()
    window.succeeded()
    assert [("went away" in m, "is back" in m) for m in _outage_lines(caplog)] == [
        (True, False),
        (False, True),
    ]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "120", True])
def test_outage_tolerance_is_checked_when_the_config_is_read(value: Any) -> None:
    data = {"study": {"n_trials": 2}, "storage": {"outage_tolerance_s": value}}
    with pytest.raises(ConfigError, match="outage_tolerance_s"):
        config_from_dict(data)
    assert config_from_dict({"study": {"n_trials": 2}}).storage.outage_tolerance_s == 120
    zero = {"study": {"n_trials": 2}, "storage": {"outage_tolerance_s": 0}}
    assert config_from_dict(zero).storage.outage_tolerance_s == 0


def test_optunas_fallback_warning_on_a_lost_connection_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("optuna.storages._rdb.storage")
    caplog.set_level(logging.WARNING)
    with quiet_disconnect_warnings():
        logger.warning("Caught an error from sqlalchemy: server closed the connection. Fall")
        logger.warning("Caught an error from sqlalchemy: too many SQL variables. Falling back")
    logger.warning("Caught an error from sqlalchemy: server closed the connection. Fall")
    kept = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(kept) == 2 and "too many" in kept[0]


# ---------------------------------------------------------------------------- lost answers
def _lose_answer_once(owner: Any, name: str, *, landed: bool = True) -> list[int]:
    """``owner.name`` takes effect (``landed``; else it never reaches the storage), then
    raises a connection error, the first time only: the answer never came back."""
    original = getattr(owner, name)
    calls: list[int] = []

    def lossy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return original(*args, **kwargs)
        if landed:
            original(*args, **kwargs)
        raise ConnectionResetError(104, "Connection reset by peer")

    setattr(owner, name, lossy)
    return calls


def _lose_pop_answer_once(kind: str, study: optuna.Study, *, landed: bool = True) -> list[int]:
    """The next pop of a budget trial takes effect (``landed``) and its answer is lost
    (once)."""
    if kind == "rdb":
        return _lose_answer_once(_records, "_pop_claimed", landed=landed)
    return _lose_answer_once(study._storage, "set_trial_state_values", landed=landed)


def _study(kind: str, tmp_path: Path, n_waiting: int = 3) -> optuna.Study:
    url = f"sqlite:///{tmp_path / 'o.db'}" if kind == "rdb" else str(tmp_path / "o.journal")
    study = optuna.create_study(storage=open_storage(url), study_name="o")
    _records.add_budget(study, n_waiting)
    return study


@pytest.mark.parametrize("kind", ["rdb", "journal"])
def test_a_tell_whose_answer_was_lost_is_not_told_twice(kind: str, tmp_path: Path) -> None:
    window, _ = _window()
    study = _study(kind, tmp_path, 0)
    trial = study.ask()
    calls = _lose_answer_once(study._storage, "set_trial_state_values")
    window.call(_records.TellOnce(study, trial, TrialState.COMPLETE, [0.5]))
    assert len(calls) == 1  # the retry read the state instead of telling again
    frozen = study._storage.get_trial(trial._trial_id)
    assert frozen.state == TrialState.COMPLETE and frozen.values == [0.5]


def test_a_lost_tell_of_a_trial_another_worker_failed_is_refused(tmp_path: Path) -> None:
    window, _ = _window()
    study = _study("rdb", tmp_path, 0)
    trial = study.ask()
    original = study._storage.set_trial_state_values

    def swept_meanwhile(trial_id: int, state: TrialState, values: Any = None) -> bool:
        original(trial_id, TrialState.FAIL)  # another worker's sweep, then the line drops
        raise ConnectionResetError(104, "Connection reset by peer")

    study._storage.set_trial_state_values = swept_meanwhile  # type: ignore[method-assign]
    with pytest.raises(UpdateFinishedTrialError):
        window.call(_records.TellOnce(study, trial, TrialState.COMPLETE, [0.5]))
    assert study._storage.get_trial(trial._trial_id).state == TrialState.FAIL


@pytest.mark.parametrize("kind", ["rdb", "journal"])
def test_a_pop_whose_answer_was_lost_takes_the_trial_it_claimed(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window, _ = _window()
    study = _study(kind, tmp_path)
    calls = _lose_pop_answer_once(kind, study)
    trial = window.call(_records.PopClaim(study, "token-1"))
    assert trial is not None and len(calls) == 1
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.RUNNING) == 1 and states.count(TrialState.WAITING) == 2
    assert study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING
    # the next pop, another token, takes another trial
    other = window.call(_records.PopClaim(study, "token-2"))
    assert other is not None and other.number != trial.number


@pytest.mark.parametrize("landed", [True, False])
def test_a_lost_journal_pop_that_another_thread_read_first_is_still_found(
    tmp_path: Path, landed: bool
) -> None:
    """The pop's claim lands in the journal and its answer is lost before the popping thread
    reads the journal back; another thread of the process (a lease, a tell) reads it first,
    and Optuna's replay then records no owner for the popping thread. The retry still takes
    the claimed trial (not a second one, leaving the first RUNNING with no worker); a claim
    that never landed is not taken for one."""
    study = _study("journal", tmp_path)
    _lose_answer_once(study._storage._backend, "append_logs", landed=landed)
    claim = _records.PopClaim(study, "token-1")
    with pytest.raises(ConnectionResetError):
        claim()
    reader = threading.Thread(target=study._storage.get_all_trials, args=(study._study_id,))
    reader.start()
    reader.join()
    done, trial = claim.recover()
    states = [t.state for t in study.get_trials(deepcopy=False)]
    if not landed:
        assert (done, trial) == (False, None) and TrialState.RUNNING not in states
        return
    assert done and trial is not None
    assert study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING
    assert states.count(TrialState.RUNNING) == 1 and states.count(TrialState.WAITING) == 2


@pytest.mark.parametrize("kind", ["rdb", "journal"])
def test_a_lost_pop_of_the_trial_this_worker_gave_back_takes_it_again(
    kind: str, tmp_path: Path
) -> None:
    # the worker took a trial and gave it back unstarted; its next pop takes the same
    # trial, and the answer is lost: the retry must find that claim, not take another
    window, _ = _window()
    study = _study(kind, tmp_path)
    given = window.call(_records.PopClaim(study, "token-1"))
    assert given is not None and _records.return_to_queue(given)
    calls = _lose_pop_answer_once(kind, study)
    trial = window.call(_records.PopClaim(study, "token-2"))
    assert trial is not None and len(calls) == 1
    assert trial.number == given.number
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.RUNNING) == 1 and states.count(TrialState.WAITING) == 2


def test_a_journal_pop_of_a_trial_it_gave_back_that_another_writer_took_first_moves_on(
    tmp_path: Path,
) -> None:
    """This worker gave a trial back; its next pop claims that trial just after another
    writer did: Optuna's pop reads "claimed" as "the trial this thread owns", still the
    given-back trial unless the pop forgot it first, and would take a trial another worker
    runs. The pop moves on to the next WAITING trial instead."""
    study = _study("journal", tmp_path)
    given = _records.pop_waiting_trial(study, claim="token-1")
    assert given is not None and _records.return_to_queue(given)
    other = open_storage(str(tmp_path / "o.journal"))
    backend = study._storage._backend
    append = backend.append_logs

    def after_the_other(logs: list[dict[str, Any]]) -> None:
        backend.append_logs = append  # once
        other.set_trial_state_values(given._trial_id, TrialState.RUNNING)
        append(logs)

    backend.append_logs = after_the_other
    trial = _records.pop_waiting_trial(study, claim="token-2")
    assert trial is not None and trial.number != given.number
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.RUNNING) == 2 and states.count(TrialState.WAITING) == 1


@pytest.mark.parametrize("kind", ["rdb", "journal"])
def test_a_pop_that_never_landed_takes_a_new_trial_beside_the_one_running(
    kind: str, tmp_path: Path
) -> None:
    # the worker runs a trial; its next pop fails before reaching the storage: the retry
    # must not take the running trial for this pop's claim
    window, _ = _window()
    study = _study(kind, tmp_path)
    running = window.call(_records.PopClaim(study, "token-1"))
    assert running is not None
    calls = _lose_pop_answer_once(kind, study, landed=False)
    trial = window.call(_records.PopClaim(study, "token-2"))
    assert trial is not None and len(calls) == 2
    assert trial.number != running.number
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.RUNNING) == 2 and states.count(TrialState.WAITING) == 1
