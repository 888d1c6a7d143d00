"""SIGUSR1 / SIGTERM under ``mpirun``: every rank checkpoints its group's supernet, queues its
running trial for retry and exits within 30 s; ``hpcnas resume`` then finishes the budget."""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import RDBArtifactStore
from tests.mpi_helpers import mpirun_path
from tests.run_configs import batched_one_shot_config
from tests.run_configs import tiny_config
from tests.run_configs import write_config

# Long enough that the two groups are seen running together on a loaded machine (the runs
# are stopped mid-way; a resume finishes the rest).
N_TRIALS = 16


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _ranks(pid: int) -> list[int]:
    ranks = []
    for child in _descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"optuna_hpcnas" in cmdline and b"mpi4py" in cmdline:
            ranks.append(child)
    return ranks


def _two_groups_mid_trial(
    tmp_path: Path,
    checkpoints: dict[str, object],
    objective: dict[str, object],
    n_trials: int = N_TRIALS,
) -> tuple[subprocess.Popen[str], str, Path, list[str], dict[str, str]]:
    """``hpcnas run`` on 2 ranks in 2 groups, returned once both groups run a trial:
    the job, the storage URL, the config, the launch command and its environment.
    ``n_trials``: the budget (see ``N_TRIALS``)."""
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "sig", "storage": url, "n_trials": n_trials},
            pruner={"name": "none"},
            data={"max_samples": 600},
            objective={"batch_size": 8, **objective},
            # 75 steps a stage: a pass over the 600 samples in batches of 8
            stages={
                "stages": [
                    {"name": "quick", "steps": 75, "lr": 1e-3, "promote": 0.5},
                    {"name": "medium", "steps": 75, "lr": 1e-2},
                ],
                "eval_every": 75,
            },
            checkpoints=checkpoints,
            # no trial asked ahead: two RUNNING trials are one in evaluation per group
            distributed={"group_size": 1, "ask_ahead": "off"},
        ),
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [mpirun_path(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "optuna_hpcnas"]
    proc = subprocess.Popen(
        [*cmd, "run", "--config", str(config), "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while True:  # both groups in the middle of a trial
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no two running trials"
        try:
            study = optuna.load_study(study_name="sig", storage=url)
            running = study.get_trials(states=(TrialState.RUNNING,))
        except Exception:  # the study is being created
            running = []
        if len(running) == 2:
            return proc, url, config, cmd, env
        time.sleep(0.1)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_under_mpirun_checkpoints_every_group_and_resume_finishes(
    tmp_path: Path, signum: signal.Signals
) -> None:
    proc, url, config, cmd, env = _two_groups_mid_trial(
        tmp_path,
        {"enabled": True, "every_n_steps": 2, "heartbeat_interval": 1, "grace_period": 2},
        {"population_steps": 2},
    )
    ranks = _ranks(proc.pid)
    assert len(ranks) == 2, ranks
    sent = time.monotonic()
    for pid in ranks:  # as Slurm does: the signal reaches every task
        os.kill(pid, signum)
    output, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30, output[-3000:]
    assert proc.returncode == 128 + int(signum), output[-3000:]

    study = optuna.load_study(study_name="sig", storage=url)
    stopped = study.get_trials(states=(TrialState.FAIL,))
    assert len(stopped) == 2, [(t.number, t.state) for t in study.get_trials()]
    assert all(t.system_attrs[_keys.CHECKPOINT_PREEMPTED] == signum.name for t in stopped)
    retries = [
        t
        for t in study.get_trials(states=(TrialState.WAITING,))
        if "failed_trial" in t.system_attrs
    ]
    assert sorted(t.system_attrs["failed_trial"] for t in retries) == sorted(
        t.number for t in stopped
    )
    store = RDBArtifactStore(url)
    for namespace in ("supernet", "supernet-g1"):  # every group leader's own chain
        manager = CheckpointManager(study=study, artifact_store=store, namespace=namespace)
        assert manager.list_checkpoints(), namespace
    assert "Trial" in output and "queued for retry" in output

    time.sleep(2.5)  # past the grace period
    resume = subprocess.run(
        [*cmd, "resume", "--config", str(config), "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    assert "Restored the supernet from checkpoint" in resume.stderr
    study = optuna.load_study(study_name="sig", storage=url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == N_TRIALS
    again = subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "resume", "--config", str(config)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and "no trial left to run" in again.stdout


def _world_rank(pid: int) -> int:
    """The MPI rank of a process (MPICH's ``PMI_RANK``, Open MPI's ``OMPI_COMM_WORLD_RANK``)."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for entry in env:
        for key in (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK="):
            if entry.startswith(key):
                return int(entry[len(key) :])
    raise AssertionError(f"no rank in the environment of {pid}")


@pytest.mark.mpi
@pytest.mark.slow
def test_signal_to_rank_0_alone_gives_back_every_group_trial(tmp_path: Path) -> None:
    """Rank 0 alone gets SIGTERM; rank 1 (the other group's leader) learns of it at
    its next step, gives back its trial too, and the job exits 143: nothing RUNNING."""
    # a heartbeat of 60 s: the grace period would not give the trials back in the test
    proc, url, _, _, _ = _two_groups_mid_trial(
        tmp_path, {"heartbeat_interval": 60}, {}, n_trials=60
    )  # never resumed: a budget as long as the run may take
    time.sleep(0.5)  # both past their first steps
    rank0 = next(pid for pid in _ranks(proc.pid) if _world_rank(pid) == 0)
    sent = time.monotonic()
    os.kill(rank0, signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30, output[-3000:]
    assert proc.returncode == 143, output[-3000:]
    study = optuna.load_study(study_name="sig", storage=url)
    trials = study.get_trials()
    assert [t for t in trials if t.state == TrialState.RUNNING] == [], output[-3000:]
    stopped = [t for t in trials if t.system_attrs.get(_keys.CHECKPOINT_PREEMPTED) == "SIGTERM"]
    assert len(stopped) == 2, [(t.number, t.state) for t in trials]
    assert "Another rank of the job received SIGTERM" in output


@pytest.mark.mpi
@pytest.mark.slow
def test_sigterm_between_batched_trials_stops_a_two_rank_group_at_once(tmp_path: Path) -> None:
    """One group of two ranks scores inherited candidates in one-shot batches (no optimizer
    step, so no step boundary): SIGTERM to both ranks stops the leader at its next trial, its
    follower with it, both exit 143 long before the forced exit, and the candidates told so far
    are written."""
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    config = batched_one_shot_config(
        tmp_path / "nas.toml",
        url,
        checkpoints={"exit_deadline": 30},  # the longest: the forced exit comes after it
        distributed={"group_size": 2},
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [mpirun_path(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "optuna_hpcnas"]
    proc = subprocess.Popen(
        [*cmd, "-vv", "run", "--config", str(config), "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    told, seen = 0, []
    for line in proc.stdout:  # the leader's tells on its local copy
        seen.append(line)
        told += "told on the local copy" in line
        if told == 3:
            break
    assert told == 3, "".join(seen)[-3000:]
    ranks = _ranks(proc.pid)
    assert len(ranks) == 2, ranks
    sent = time.monotonic()
    for pid in ranks:  # as Slurm does: the signal reaches every task
        os.kill(pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=150)
    assert time.monotonic() - sent < 30, output[-3000:]
    assert proc.returncode == 143, output[-3000:]
    assert "No step boundary" not in output, output[-3000:]  # not the watchdog's forced exit
    assert "GroupError" not in output and "Traceback" not in output, output[-3000:]
    study = optuna.load_study(study_name="sig", storage=url)
    states = [t.state for t in study.get_trials()]
    assert states.count(TrialState.RUNNING) == 0
    assert 3 <= states.count(TrialState.COMPLETE) < 200  # written at the signal
    assert len(states) == 300
