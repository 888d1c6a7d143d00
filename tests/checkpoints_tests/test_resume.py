"""Resume after faults, with real worker processes on a digits weight-sharing search."""

from __future__ import annotations

import json
from pathlib import Path
import signal
import time

import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import PreemptionGuard
from optuna_hpcnas.checkpoints import RDBArtifactStore

from ._util import finish
from ._util import spawn
from ._util import wait_for

N_TRIALS = 5
STOP_AT = 2


def _origin(t: optuna.trial.FrozenTrial) -> int:
    return t.system_attrs.get("failed_trial", t.number)


def _check_resumed_study(url: str, before: dict[int, float], stopped: int) -> None:
    study = optuna.load_study(study_name="faults", storage=url)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # No completed trial lost: every trial complete before the fault is still there, unchanged.
    assert {t.number: t.value for t in complete if t.number in before} == before
    # None duplicated: each original trial completed exactly once.
    origins = [_origin(t) for t in complete]
    assert len(origins) == len(set(origins)) == N_TRIALS
    # The stopped one failed and was retried with its parameters.
    killed = trials[stopped]
    assert killed.state == TrialState.FAIL
    retries = [t for t in complete if t.system_attrs.get("failed_trial") == stopped]
    assert len(retries) == 1 and retries[0].params == killed.params
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def _snapshot(url: str) -> tuple[dict[int, float], int]:
    study = optuna.load_study(study_name="faults", storage=url)
    store = RDBArtifactStore(url)
    latest = CheckpointManager(study=study, artifact_store=store).list_checkpoints()[-1]
    store.dispose()
    done = {t.number: t.value for t in study.trials if t.state == TrialState.COMPLETE}
    return done, latest.step


def _resume(url: str, log: Path) -> dict:
    rc, out = finish(spawn("search", "--url", url, "--log", str(log), "--n-trials", str(N_TRIALS)))
    assert rc == 0, out
    return json.loads(log.read_text().splitlines()[-1])


@pytest.mark.slow
def test_kill_9_mid_trial_then_resume(sqlite_url: str, tmp_path: Path) -> None:
    marker, log = tmp_path / "in_trial", tmp_path / "log.jsonl"
    proc = spawn(
        "search", "--url", sqlite_url, "--marker", str(marker), "--log", str(log),
        "--n-trials", str(N_TRIALS), "--stop-at", str(STOP_AT), "--block",
    )  # fmt: skip
    try:
        wait_for(marker, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    before, last_step = _snapshot(sqlite_url)
    study = optuna.load_study(study_name="faults", storage=sqlite_url)
    assert study.trials[STOP_AT].state == TrialState.RUNNING  # SIGKILL left it running
    assert len(before) == STOP_AT
    time.sleep(2.5)  # grace_period=2: the dead worker's heartbeat is now stale

    resumed = _resume(sqlite_url, log)
    assert resumed["resumed_step"] == last_step > 0
    _check_resumed_study(sqlite_url, before, STOP_AT)


@pytest.mark.slow
def test_sigusr1_checkpoints_retries_and_exits(sqlite_url: str, tmp_path: Path) -> None:
    marker, log = tmp_path / "in_trial", tmp_path / "log.jsonl"
    proc = spawn(
        "search", "--url", sqlite_url, "--marker", str(marker), "--log", str(log),
        "--n-trials", str(N_TRIALS), "--stop-at", str(STOP_AT),
    )  # fmt: skip
    wait_for(marker, proc)
    signalled_at = json.loads(marker.read_text())["step"]
    _, periodic_step = _snapshot(sqlite_url)
    proc.send_signal(signal.SIGUSR1)
    rc, out = finish(proc, timeout=30)  # the guarantee: out within 30 s
    assert rc == 128 + signal.SIGUSR1, out

    study = optuna.load_study(study_name="faults", storage=sqlite_url)
    stopped = study.trials[STOP_AT]
    assert stopped.state == TrialState.FAIL
    assert stopped.system_attrs[_keys.CHECKPOINT_PREEMPTED] == "SIGUSR1"
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert [t.system_attrs["failed_trial"] for t in waiting] == [STOP_AT]  # queued at once
    store = RDBArtifactStore(sqlite_url)
    newest = CheckpointManager(study=study, artifact_store=store).list_checkpoints()[-1]
    store.dispose()
    assert newest.metadata["reason"] == "SIGUSR1"
    assert newest.step == signalled_at and newest.step != periodic_step  # taken "now"
    before = {t.number: t.value for t in study.trials if t.state == TrialState.COMPLETE}

    resumed = _resume(sqlite_url, log)
    assert resumed["resumed_step"] == signalled_at
    _check_resumed_study(sqlite_url, before, STOP_AT)


@pytest.mark.slow
def test_sigterm_watchdog_exits_when_the_loop_is_stuck(sqlite_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "in_trial"
    proc = spawn("stuck", "--url", sqlite_url, "--marker", str(marker), "--deadline", "1.5")
    wait_for(marker, proc)
    proc.send_signal(signal.SIGTERM)
    rc, out = finish(proc, timeout=30)
    assert rc == 128 + signal.SIGTERM, out
    study = optuna.load_study(study_name="faults", storage=sqlite_url)
    assert study.trials[0].state == TrialState.FAIL
    assert study.trials[0].system_attrs[_keys.CHECKPOINT_PREEMPTED] == "SIGTERM"
    assert [t.system_attrs.get("failed_trial") for t in study.trials[1:]] == [0]
    assert study.trials[1].state == TrialState.WAITING
    assert marker.with_suffix(".held").read_text() == "written"  # before_exit ran first


def test_guard_restores_handlers_and_validates() -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    with PreemptionGuard(signals=["SIGUSR1"]) as guard:
        assert signal.getsignal(signal.SIGUSR1) != previous
        guard.check()  # nothing pending: no-op
        assert not guard.requested
    assert signal.getsignal(signal.SIGUSR1) == previous
    with pytest.raises(ValueError, match="`deadline` is 60"):
        PreemptionGuard(deadline=60)
    with pytest.raises(ValueError, match="'SIGNOPE'"):
        PreemptionGuard(signals=["SIGNOPE"])


def test_guard_in_process_marks_trial_and_raises(sqlite_url: str) -> None:
    from optuna_hpcnas.checkpoints import heartbeat_storage
    from optuna_hpcnas.checkpoints import Preempted

    study = optuna.create_study(storage=heartbeat_storage(sqlite_url))
    saved: list[int] = []
    with PreemptionGuard(checkpoint=lambda: saved.append(1), signals=["SIGUSR1"]) as guard:

        def objective(trial: optuna.Trial) -> float:
            trial.suggest_int("x", 0, 10)
            with guard.watch(trial):
                signal.raise_signal(signal.SIGUSR1)
                guard.check()
            return 0.0

        with pytest.raises(Preempted) as exc:
            study.optimize(objective, n_trials=1)
    assert exc.value.code == 128 + signal.SIGUSR1 and saved == [1]
    first, retry = study.trials
    assert first.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert retry.params == first.params
