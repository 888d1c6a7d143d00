"""TrialLease and recover_expired_trials: no orphaned trial on storages without heartbeats."""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.storages import lease_expiry
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import recover_expired_trials
from optuna_hpcnas.storages import TrialLease

from .conftest import backend_url
from .conftest import sweep_in_threads

ROOT = Path(__file__).resolve().parents[2]
_X = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def _study(url: str, name: str = "lease") -> optuna.Study:
    return optuna.create_study(storage=open_storage(url), study_name=name)


def _states(study: optuna.Study) -> list[TrialState]:
    return [t.state for t in study.get_trials(deepcopy=False)]


def test_lease_is_recorded_at_once_and_renewed_until_exit(journal_path: str) -> None:
    study = _study(journal_path)
    trial = study.ask(_X)
    assert lease_expiry(study.trials[0]) is None
    with TrialLease(trial, interval=0.2, grace_period=0.5) as lease:
        first = lease_expiry(study.trials[0])
        assert first is not None and first > time.time()
        assert lease.trial_number == trial.number == 0
        time.sleep(0.7)
        renewed = lease_expiry(study.trials[0])
        assert renewed is not None and renewed > first + 0.3
    after_exit = lease_expiry(study.trials[0])
    time.sleep(0.5)
    assert lease_expiry(study.trials[0]) == after_exit  # no renewal after the block
    study.tell(trial, 0.5)
    assert lease.renew() is False  # a finished trial has nothing to renew


def test_lease_arguments_are_validated(journal_path: str) -> None:
    study = _study(journal_path)
    trial = study.ask(_X)
    with pytest.raises(TypeError, match="`trial` is 3"):
        TrialLease(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`interval` is 0"):
        TrialLease(trial, interval=0)
    with pytest.raises(ValueError, match="must exceed `interval`"):
        TrialLease(trial, interval=2, grace_period=1)
    with pytest.raises(ValueError, match="`grace_period` is -1"):
        recover_expired_trials(study, grace_period=-1)
    with pytest.raises(TypeError, match="`max_retry` is 'x'"):
        recover_expired_trials(study, grace_period=1, max_retry="x")  # type: ignore[arg-type]


def test_expired_lease_is_failed_and_queued_once_as_optuna_retries(journal_path: str) -> None:
    study = _study(journal_path)
    study.enqueue_trial({"x": 0.25}, user_attrs={"origin": "queue"})
    trial = study.ask(_X)
    trial.set_user_attr("note", "kept")
    with TrialLease(trial, interval=0.1, grace_period=1.5):
        pass
    live = study.ask(_X)  # a second trial with a fresh lease is left alone
    with TrialLease(live, interval=5.0):
        assert recover_expired_trials(study, grace_period=60) == []
        time.sleep(1.6)
        assert recover_expired_trials(study, grace_period=60) == [0]
        assert recover_expired_trials(study, grace_period=60) == []
        trials = study.get_trials(deepcopy=False)
        assert _states(study) == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    failed, retry = trials[0], trials[2]
    assert "lease expired" in failed.system_attrs[_keys.STORAGES_RECOVERED]
    assert RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == 0
    assert retry.system_attrs["retry_history"] == [0]
    assert retry.system_attrs["fixed_params"] == {"x": 0.25}
    assert retry.user_attrs == {"origin": "queue", "note": "kept"}
    assert _keys.STORAGES_LEASE not in retry.system_attrs
    assert _keys.STORAGES_RECOVERED not in retry.system_attrs
    # The next ask takes the retry, with the same parameters.
    again = study.ask(_X)
    assert again.number == 2 and again.params == {"x": 0.25}


def test_trial_without_lease_or_heartbeat_is_recovered_after_grace(journal_path: str) -> None:
    study = _study(journal_path)
    study.ask(_X)
    assert recover_expired_trials(study, grace_period=30) == []  # just started
    time.sleep(0.3)
    assert recover_expired_trials(study, grace_period=0.2) == [0]
    reason = study.trials[0].system_attrs[_keys.STORAGES_RECOVERED]
    assert "no lease and no heartbeat" in reason
    assert _states(study) == [TrialState.FAIL, TrialState.WAITING]


def test_max_retry_stops_requeueing(journal_path: str) -> None:
    study = _study(journal_path)
    for _ in range(2):
        study.ask(_X)  # the first time a new trial, then the retry
        time.sleep(0.15)
        assert len(recover_expired_trials(study, grace_period=0.1, max_retry=1)) == 1
    assert _states(study) == [TrialState.FAIL, TrialState.FAIL]
    assert study.trials[1].system_attrs["retry_history"] == [0]


def test_trials_with_a_heartbeat_are_left_to_optuna(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hb.db'}"
    study = optuna.create_study(storage=open_storage(url, heartbeat_interval=30))
    beating = study.ask(_X)
    study._storage.record_heartbeat(beating._trial_id)
    study.ask(_X)  # no heartbeat yet: the orphan case Optuna never recovers
    time.sleep(0.3)
    assert recover_expired_trials(study, grace_period=0.2) == [1]
    assert _states(study)[:2] == [TrialState.RUNNING, TrialState.FAIL]


def test_concurrent_sweeps_requeue_a_trial_once(storage_url: str) -> None:
    """On SQLite (and the gRPC proxy over it) this needs open_storage's BEGIN IMMEDIATE."""
    shared_storage_url = storage_url
    study = _study(shared_storage_url, "race")
    for _ in range(6):
        study.ask(_X)
    time.sleep(0.3)
    # Each sweeper opens the storage itself, as separate workers would.
    sweepers = [
        optuna.load_study(study_name="race", storage=open_storage(shared_storage_url))
        for _ in range(6)
    ]
    won = sweep_in_threads(sweepers, lambda s: recover_expired_trials(s, grace_period=0.2))
    assert sorted(won) == list(range(6))
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL] * 6 + [TrialState.WAITING] * 6
    retried = sorted(RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials[6:])
    assert retried == list(range(6))


@pytest.mark.parametrize(
    ("kind", "moment"),
    [
        # The storages without heartbeats, killed before and after the lease is written...
        *[
            pytest.param(k, m, marks=[pytest.mark.services] if k == "journal-redis" else [])
            for k in ("journal-file", "journal-redis", "grpc")
            for m in ("before-lease", "in-lease")
        ],
        # ...and an RDB server before its first heartbeat (MySQL runs the same code path).
        pytest.param("postgresql", "before-lease", marks=pytest.mark.services),
    ],
)
def test_worker_killed_right_after_the_ask_is_recovered(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, moment: str
) -> None:
    """kill -9 at the moment the issue names: taken from the queue, nothing else done."""
    shared_storage_url = backend_url(request, kind, tmp_path)
    study = _study(shared_storage_url, "killed")
    study.enqueue_trial({"x": 0.75})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.storages_tests._worker",
            shared_storage_url,
            "killed",
            moment,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "0"
    assert _states(study) == [TrialState.RUNNING]
    has_lease = lease_expiry(study.trials[0]) is not None
    assert has_lease == (moment == "in-lease")
    if moment == "in-lease":  # its process, recorded with the lease, is gone: at once
        assert recover_expired_trials(study, grace_period=600.0) == [0]
    else:
        assert recover_expired_trials(study, grace_period=1.0) == []  # within its grace
        time.sleep(1.2)
        assert recover_expired_trials(study, grace_period=1.0) == [0]
    # The next worker runs the retry; nothing is left RUNNING or WAITING.
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=1)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].params == {"x": 0.75} and trials[1].value == 0.75


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_fail_and_requeue_is_the_one_retry_of_sweeps_and_signals(tmp_path: Path) -> None:
    """A swept and a preempted trial are failed and retried by one function: the reason on
    the failed trial only, the storage's own retry callback (its max_retry) when it has one,
    one winner when two callers race."""
    from optuna_hpcnas.checkpoints import mark_trial_for_retry
    from optuna_hpcnas.storages import fail_and_requeue

    url = f"sqlite:///{tmp_path / 'retry.db'}"
    storage = open_storage(url, heartbeat_interval=60, max_retry=1)
    study = optuna.create_study(storage=storage, study_name="retry")
    trial = study.ask(_X)
    assert mark_trial_for_retry(study, trial._trial_id, reason="SIGTERM", max_retry=5)
    assert not mark_trial_for_retry(study, trial._trial_id, reason="SIGTERM")  # finished
    failed, retry = study.get_trials()
    assert failed.state == TrialState.FAIL
    assert failed.system_attrs[_keys.CHECKPOINT_PREEMPTED] == "SIGTERM"
    assert retry.state == TrialState.WAITING and retry.params == failed.params
    assert _keys.CHECKPOINT_PREEMPTED not in retry.system_attrs
    assert RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == failed.number

    again = study.ask()  # the retry, run and lost again: the storage allows one retry only
    assert again.number == retry.number
    won = [
        fail_and_requeue(
            study, again._trial_id, reason_key=_keys.STORAGES_RECOVERED, reason=r, max_retry=9
        )
        for r in ("sweep a", "sweep b")
    ]
    assert won == [True, False]
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.FAIL]
    assert study.trials[1].system_attrs[_keys.STORAGES_RECOVERED] == "sweep a"


def test_a_trial_whose_process_on_this_host_is_gone_is_recovered_at_once(
    journal_path: str,
) -> None:
    import socket

    from optuna_hpcnas._process import start_time

    study = _study(journal_path)
    trial = study.ask(_X)
    with TrialLease(trial, interval=30, grace_period=600):
        owner = study.trials[0].system_attrs[_keys.STORAGES_OWNER]
        assert owner["pid"] == os.getpid() and owner["number"] == trial.number
        assert recover_expired_trials(study, grace_period=600) == []  # this process runs it
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    record = {"number": trial.number, "host": socket.gethostname(), "pid": dead.pid}
    record["start"] = start_time(dead.pid)
    dead.kill()
    dead.wait()
    storage = study._storage
    for other in (  # none of these says the trial's own process is gone
        {**record, "host": "another-host"},
        {**record, "number": trial.number + 1},  # a record a retry inherited
        {**record, "start": None},  # a bare pid could be a newer process
    ):
        storage.set_trial_system_attr(trial._trial_id, _keys.STORAGES_OWNER, other)
        assert recover_expired_trials(study, grace_period=600) == []
    storage.set_trial_system_attr(trial._trial_id, _keys.STORAGES_OWNER, record)
    assert recover_expired_trials(study, grace_period=600) == [trial.number]
    assert _states(study) == [TrialState.FAIL, TrialState.WAITING]
    reason = study.trials[0].system_attrs[_keys.STORAGES_RECOVERED]
    assert f"pid {dead.pid} on this host" in str(reason)


def test_a_worker_killed_right_after_its_pop_leaves_a_trial_recovered_at_once(
    tmp_path: Path,
) -> None:
    """An RDB pop records its process as the owner in the pop's own transaction: a worker
    killed before its heartbeat or lease began is found dead by its process, not by a grace."""
    url = f"sqlite:///{tmp_path / 'pop.db'}"
    study = optuna.create_study(study_name="pop", storage=open_storage(url))
    study.enqueue_trial({"x": 0.5})
    popper = (
        "import optuna, os, signal;"
        "from optuna_hpcnas import _records;"
        "from optuna_hpcnas.storages import open_storage;"
        f"study = optuna.load_study(study_name='pop', storage=open_storage({url!r}));"
        "trial = _records.pop_waiting_trial(study, claim='token');"
        "print(trial.number, flush=True);"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    popped = subprocess.run(
        [sys.executable, "-c", popper], capture_output=True, text=True, timeout=120
    )
    assert popped.returncode == -signal.SIGKILL, popped.stderr[-2000:]
    assert popped.stdout.split() == ["0"]
    (trial,) = study.get_trials()
    assert trial.state == TrialState.RUNNING
    assert trial.system_attrs[_keys.STORAGES_OWNER]["number"] == 0
    assert recover_expired_trials(study, grace_period=600) == [0]
    assert _states(study) == [TrialState.FAIL, TrialState.WAITING]
