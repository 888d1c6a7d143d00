"""Issue 23: ``hpcnas run`` exits with 128 + signal from its first moment (before the data,
the study or the warm-up), and right after the warm-up, with nothing left RUNNING."""

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

from tests.run_configs import tiny_config
from tests.run_configs import write_config

REPO = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(study={"name": "sig", "storage": url, "n_trials": 3}),
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config), "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, url


def _handles(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for ``signum`` (``SigCgt`` in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _nothing_running(url: str) -> None:
    try:
        study = optuna.load_study(study_name="sig", storage=url)
    except KeyError:  # stopped before the study was created
        return
    assert study.get_trials(states=(TrialState.RUNNING,)) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_in_the_first_moment_exits_128_plus_signal(
    tmp_path: Path, signum: signal.Signals
) -> None:
    proc, url = _start(tmp_path)
    deadline = time.monotonic() + 60
    while not _handles(proc.pid, signum):  # the first moment a handler can exist
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err[-2000:]  # was -signum: killed outright
    assert "Traceback" not in err
    _nothing_running(url)


def test_a_signal_right_after_the_warm_up_exits_143(tmp_path: Path) -> None:
    proc, url = _start(tmp_path)
    assert proc.stderr is not None
    for line in proc.stderr:  # the log line that ends the warm-up
        if "Supernet warm-up" in line:
            break
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    _nothing_running(url)
