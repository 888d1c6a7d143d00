"""``[distributed] processes``: ``hpcnas run`` typed in a shell starts its own ranks (it
re-runs itself under the mpich wheel's ``mpirun``), as ``mpirun -n N hpcnas run`` would."""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import optuna
import pytest

from optuna_hpcnas import _keys
from tests.run_configs import tiny_config
from tests.run_configs import write_config

pytestmark = pytest.mark.mpi


def _hpcnas_run(config: Path, *flags: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``hpcnas run --config CONFIG`` as a user types it: no launcher in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    return subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=config.parent,
        env={**env, "OMP_NUM_THREADS": "1"},
    )


def test_hpcnas_run_starts_the_ranks_the_config_asks_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "local-ranks", "n_trials": 6, "storage": url},
            sampler={"name": "random", "seed": 0},
            pruner={"name": "none"},
            distributed={"processes": 2},
        ),
    )
    proc = _hpcnas_run(config, "--no-progress", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting 2 ranks" in proc.stderr
    assert proc.stdout.count("study 'local-ranks': 6 complete") == 1  # rank 0 prints, once
    study = optuna.load_study(study_name="local-ranks", storage=url)
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(6))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    (run,) = json.loads(attrs[_keys.DISTRIBUTED_UTILISATION])
    assert sorted(r["rank"] for r in run["ranks"]) == [0, 1]  # two evaluation groups
    assert sum(r["trials"] for r in run["ranks"]) == 6


def test_a_failed_rank_is_the_commands_exit_status(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "bad", "n_trials": 2, "storage": "sqlite:///nas.db"},
            data={"name": "npz", "path": str(tmp_path / "missing.npz")},
            distributed={"processes": 2},
        ),
    )
    proc = _hpcnas_run(config, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "missing.npz" in proc.stderr and "Traceback" not in proc.stderr


def _started_mid_trial(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], str]:
    """``hpcnas run`` with ``processes = 2`` in a session of its own, returned once each of
    its two ranks runs a trial; and its storage URL."""
    import time

    url = f"sqlite:///{tmp_path / 'nas.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": name, "n_trials": 6, "storage": url},
            pruner={"name": "none"},
            data={"max_samples": 600},
            objective={"batch_size": 8},
            # 150 steps a stage: seconds per trial, long enough to be caught running
            stages={"stages": [{"name": "full", "steps": 150, "lr": 1e-3}], "eval_every": 75},
            # a grace no test waits out: a dead trial is found by its process alone
            checkpoints={"heartbeat_interval": 1, "grace_period": 600},
            distributed={"processes": 2, "ask_ahead": "off"},
        ),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config), "--no-progress"],
        cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no two running trials"
        try:
            study = optuna.load_study(study_name=name, storage=url)
            running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        except Exception:  # the study is being created
            running = []
        if len(running) == 2:
            return proc, url
        time.sleep(0.2)


def _ranks_of(tmp_path: Path) -> list[int]:
    """The pids of the ranks running this test's config."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        program = cmdline.split(b"\0", 1)[0]
        launcher = program.endswith((b"mpirun", b"mpiexec", b"mpiexec.hydra"))
        if b"mpi4py" in cmdline and str(tmp_path).encode() in cmdline and not launcher:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_ends_the_run_with_128_plus_it(tmp_path: Path) -> None:
    import signal

    proc, _ = _started_mid_trial(tmp_path, "killed-rank")
    ranks = _ranks_of(tmp_path)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, output[-3000:]


@pytest.mark.slow
def test_killing_the_runs_process_group_leaves_no_rank(tmp_path: Path) -> None:
    import signal
    import time

    proc, url = _started_mid_trial(tmp_path, "killed-group")
    assert len(_ranks_of(tmp_path)) == 2
    os.killpg(proc.pid, signal.SIGKILL)  # the shell's job, killed as a whole
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 40
    while _ranks_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ranks_of(tmp_path), "ranks outlived the run's process group"
    # the ranks died with the job (hard): their trials are found dead by their processes, on
    # this host, long before the heartbeats' grace of 600 s
    from optuna_hpcnas.storages import recover_expired_trials

    study = optuna.load_study(study_name="killed-group", storage=url)
    running = [t.number for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))]
    assert len(running) == 2
    assert sorted(recover_expired_trials(study, grace_period=600)) == running
    trials = study.get_trials()
    assert optuna.trial.TrialState.RUNNING not in [t.state for t in trials]
    assert all(any(r.system_attrs.get("failed_trial") == n for r in trials) for n in running)
