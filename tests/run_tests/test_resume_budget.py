"""Issue 23: ``hpcnas resume`` keeps the recorded budget after a kill at any moment of queuing,
and never counts a dead RUNNING trial as remaining (it waits for its grace, sweeps it and
runs its one retry)."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.config import load_config
from optuna_hpcnas.run._study import queue_budget
from optuna_hpcnas.run._study import trials_to_resume
from optuna_hpcnas.storages import open_storage
from tests.run_configs import tiny_config
from tests.run_configs import write_config

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")


def _config(tmp_path: Path, n_trials: int) -> Path:
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    return write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "budget", "storage": url, "n_trials": n_trials},
            pruner={"name": "none"},
            checkpoints={"heartbeat_interval": 1, "grace_period": 2},
        ),
    )


def _killed_study(config_path: Path, *, budget: int, queued: int, dead: int) -> optuna.Study:
    """A study as a run killed while queuing leaves it: ``budget`` recorded, ``queued`` of it
    queued, ``dead`` of those taken by workers that died right after their last heartbeat."""
    config = load_config(config_path)
    storage = open_storage(config.study.resolved_storage(), heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="budget", storage=storage, direction="maximize")
    _records.record_budget(study, budget)
    _records.add_budget(study, queued)
    for _ in range(dead):
        trial = _records.pop_waiting_trial(study)
        assert trial is not None
        study._storage.record_heartbeat(trial._trial_id)
    return study


def _finished_once(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that count against the budget: finished, and not failed for a retry."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and _keys.STORAGES_RETRY not in t.system_attrs
    ]


def test_a_kill_while_queuing_is_resumed_to_the_recorded_budget(tmp_path: Path) -> None:
    config_path = _config(tmp_path, 100)
    study = _killed_study(config_path, budget=100, queued=62, dead=0)
    config = load_config(config_path)
    assert trials_to_resume(config) == 100  # was 62: the budget shrank to what was queued
    assert _records.queued_budget(study) == 100
    # resuming again, or running the same config again, adds nothing on top
    assert trials_to_resume(config) == 100
    queue_budget(study, config)
    assert len(study.get_trials(deepcopy=False)) == 100


def test_a_run_started_again_completes_the_queue_of_a_kill_while_queuing(tmp_path: Path) -> None:
    config_path = _config(tmp_path, 10)
    study = _killed_study(config_path, budget=10, queued=3, dead=0)
    _records.pop_waiting_trial(study)  # one trial taken: the run had started
    queue_budget(study, load_config(config_path))
    assert _records.queued_budget(study) == 10 and len(study.get_trials()) == 10


def test_dead_running_trials_are_swept_before_they_are_counted(tmp_path: Path) -> None:
    config_path = _config(tmp_path, 6)
    study = _killed_study(config_path, budget=6, queued=6, dead=2)
    started = time.monotonic()
    # at once after the kill: the heartbeats are fresh, the resume waits for their grace
    assert trials_to_resume(load_config(config_path)) == 6  # 4 waiting + 2 retries
    assert time.monotonic() - started >= 1.5
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.FAIL) == 2 and TrialState.RUNNING not in states


@pytest.mark.slow
def test_hpcnas_resume_finishes_exactly_the_budget(tmp_path: Path) -> None:
    """Both faults at once, through the command: 2 of a budget of 3 queued, 1 of them taken
    by a worker that died a moment ago."""
    config_path = _config(tmp_path, 3)
    study = _killed_study(config_path, budget=3, queued=2, dead=1)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "optuna_hpcnas", "resume", "--config", str(config_path)]
    done = subprocess.run(
        [*cmd, "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study.get_trials(deepcopy=False)
    assert [t for t in trials if not t.state.is_finished()] == []  # nothing RUNNING or WAITING
    assert len(_finished_once(study)) == 3, [(t.number, t.state) for t in trials]
    failed = [t for t in trials if _keys.STORAGES_RETRY in t.system_attrs]
    assert len(failed) == 1
    assert all(trials[t.system_attrs[_keys.STORAGES_RETRY]].state.is_finished() for t in failed)
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "no trial left to run" in again.stdout
