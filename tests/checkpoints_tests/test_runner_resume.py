"""``hpcnas run`` killed or preempted, then run again: nothing finished is lost or repeated.

A real (tiny) search in a subprocess on SQLite: SIGKILL in the middle of a trial, then the same
command again (the heartbeat retries the killed trial, the supernet comes back from the newest
checkpoint in the study's database); SIGUSR1 (Slurm preemption) checkpoints, queues the
running trial for retry and exits within 30 s.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
import re
import signal
import sqlite3
import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import RDBArtifactStore

REPO = Path(__file__).resolve().parents[2]
N_TRIALS = 4

CONFIG = """
[study]
name = "resume"
storage = "{storage}"
n_trials = {n_trials}

[sampler]
name = "random"
seed = 0

[pruner]
name = "none"

[stages]                       # a pass over digits' 1,078 training images in batches of 8
stages = [
    {{ name = "quick", steps = 135, lr = 1e-3 }},
    {{ name = "medium", steps = 135, lr = 1e-2 }},
]
eval_every = 135

[training]
epochs = 1
paths_per_batch = 2
warmup_max_batches = 2
threads = 1

[objective]
optimizer = "adam"
batch_size = 8
population_steps = 2
latency_repeats = 1

[checkpoints]
enabled = true
every_n_steps = 2
heartbeat_interval = 1
grace_period = 2
"""


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config)],
            cwd=config.parent, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        )  # fmt: skip


def _setup(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "nas.db"
    config = tmp_path / "nas.toml"
    config.write_text(CONFIG.format(storage=f"sqlite:///{db}", n_trials=N_TRIALS))
    return config, f"sqlite:///{db}"


def _states(db: Path) -> dict[int, str]:
    """``trial_id -> state`` read straight from SQLite (no Optuna cache, no writes)."""
    if not db.exists():
        return {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
        try:
            rows = con.execute("SELECT trial_id, state FROM trials").fetchall()
        except sqlite3.OperationalError:
            return {}  # tables not created yet
    return {int(i): str(s) for i, s in rows}


def _has_heartbeat(db: Path, trial_id: int) -> bool:
    """A heartbeat, and the whole architecture suggested: the trial is being evaluated (the
    heartbeat starts when the trial is taken, before the sampler has suggested it)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
        try:
            rows = con.execute(
                "SELECT 1 FROM trial_heartbeats WHERE trial_id = ?", (trial_id,)
            ).fetchall()
            arch = con.execute(
                "SELECT 1 FROM trial_user_attributes WHERE trial_id = ? AND key = 'arch'",
                (trial_id,),
            ).fetchall()
        except sqlite3.OperationalError:
            return False
    return bool(rows) and bool(arch)


def _wait_mid_trial(proc: subprocess.Popen[bytes], db: Path, *, completed: int) -> int:
    """Block until ``completed`` trials are COMPLETE and another one runs with a heartbeat."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the search ended before it could be interrupted"
        states = _states(db)
        running = [i for i, s in states.items() if s == "RUNNING"]
        done = sum(s == "COMPLETE" for s in states.values())
        if done >= completed and running and _has_heartbeat(db, running[0]):
            return running[0]
        time.sleep(0.05)
    raise AssertionError(f"no running trial after {completed} complete: {_states(db)}")


def _checkpoints(url: str) -> list[int]:
    study = optuna.load_study(study_name="resume", storage=url)
    manager = CheckpointManager(study=study, artifact_store=RDBArtifactStore(url))
    return [info.step for info in manager.list_checkpoints()]


@pytest.mark.slow
def test_killed_run_resumes_with_the_same_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, url = _setup(tmp_path)
    db, log = tmp_path / "nas.db", tmp_path / "run.log"
    proc = _start(config, log)
    killed_id = _wait_mid_trial(proc, db, completed=1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    study = optuna.load_study(study_name="resume", storage=url)
    before = {t.number: t for t in study.get_trials() if t.state == TrialState.COMPLETE}
    killed = next(t for t in study.get_trials() if t._trial_id == killed_id)
    assert killed.state == TrialState.RUNNING and before
    saved_steps = _checkpoints(url)
    assert saved_steps, "no supernet checkpoint was saved before the kill"
    first_log = log.read_text()

    time.sleep(2.5)  # the grace period: the killed trial's heartbeat is now stale
    rerun = _start(config, log)
    assert rerun.wait(timeout=180) == 0, log.read_text()
    second_log = log.read_text()[len(first_log) :]

    study = optuna.load_study(study_name="resume", storage=url)
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # Exactly the budget: the finished trials kept as they were, none run twice, none added.
    assert len(complete) == N_TRIALS, [(t.number, t.state) for t in trials]
    for number, t in before.items():
        again = next(c for c in complete if c.number == number)
        assert again.values == t.values and again.params == t.params
    assert sorted(t.number for t in trials) == list(range(N_TRIALS + 1))
    # The killed trial failed and its retry (same architecture) completed.
    killed = next(t for t in trials if t._trial_id == killed_id)
    assert killed.state == TrialState.FAIL
    retries = [t for t in complete if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].params == killed.params
    # The supernet came back from the newest checkpoint written before the kill.
    match = re.search(r"Restored the supernet from checkpoint \S+ \(step (\d+)", second_log)
    assert match is not None, second_log
    assert int(match.group(1)) == max(saved_steps)
    assert "resuming them without adding new ones" in second_log
    # and the chain goes on from there (steps counted across runs).
    assert max(_checkpoints(url)) > max(saved_steps)

    # `hpcnas export --finetune` without --weights inherits the newest checkpoint's weights.
    from optuna_hpcnas.config import DataConfig
    from optuna_hpcnas.deploy._export import trained_module
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.search_space import Architecture

    arch = Architecture.from_json(study.best_trial.user_attrs[_keys.OBJECTIVE_ARCH])
    recipe = ScratchTrainingConfig(steps=0, latency_repeats=0)
    with caplog.at_level(logging.INFO, logger="optuna_hpcnas.deploy._export"):
        trained_module(study, arch, DataConfig().load(), mode="finetune", recipe=recipe)
    newest = f"supernet.{max(_checkpoints(url)):010d}."
    assert f"Inherited weights from supernet checkpoint {newest}" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGINT])  # SIGINT: Ctrl-C
def test_a_signal_checkpoints_and_queues_the_running_trial(
    tmp_path: Path, signum: signal.Signals
) -> None:
    config, url = _setup(tmp_path)
    db, log = tmp_path / "nas.db", tmp_path / "run.log"
    proc = _start(config, log)
    running_id = _wait_mid_trial(proc, db, completed=0)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum, log.read_text()

    text = log.read_text()
    assert f"Received {signum.name}" in text
    assert re.search(rf"Received {signum.name}.*\n(.*\n)*.*Saved supernet checkpoint", text), text
    study = optuna.load_study(study_name="resume", storage=url)
    trials = study.get_trials()
    stopped = next(t for t in trials if t._trial_id == running_id)
    assert stopped.state == TrialState.FAIL
    assert stopped.system_attrs[_keys.CHECKPOINT_PREEMPTED] == signum.name
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == stopped.number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    assert retry[0].params == stopped.params
    assert _checkpoints(url), "the signal did not checkpoint the supernet"
