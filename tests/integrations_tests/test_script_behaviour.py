"""The generated shell scripts behave as documented, with stand-ins for srun, scontrol and
mpirun (no Slurm or MPI needed): signals are forwarded, the job requeues, resume follows."""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import time

from optuna_hpcnas.integrations import mpirun_script
from optuna_hpcnas.integrations import slurm_script

# A launcher stand-in: records its arguments, then waits; on USR1/TERM it records the signal
# (as the ranks would checkpoint) and exits.
FAKE_LAUNCHER = """#!/usr/bin/env bash
echo "$0 $*" >> "$LOG"
trap 'echo "got USR1" >> "$LOG"; exit 0' USR1
trap 'echo "got TERM" >> "$LOG"; exit 143' TERM
echo started >> "$LOG"
for _ in $(seq 1 300); do sleep 0.1; done
echo "finished without a signal" >> "$LOG"
"""


def _fake_bin(tmp_path: Path, *names: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in names:
        path = bin_dir / name
        path.write_text(
            FAKE_LAUNCHER if name != "scontrol" else '#!/bin/sh\necho "$0 $*" >> "$LOG"\n'
        )
        path.chmod(0o755)
    return bin_dir


def _wait_for(log: Path, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {log.read_text() if log.exists() else '(no log)'}")


def _env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(tmp_path / "log"),
        "OPTUNA_STORAGE": "postgresql+psycopg://nas@db/optuna",
        "SLURM_JOB_ID": "4242",
        "TMPDIR": str(tmp_path),
        **extra,
    }


def test_slurm_usr1_is_forwarded_then_the_job_requeues(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path, "srun", "scontrol")
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script())
    log = tmp_path / "log"
    proc = subprocess.Popen(["bash", str(script)], env=_env(tmp_path, bin_dir), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _wait_for(log, "started")
    proc.send_signal(signal.SIGUSR1)  # what Slurm does 120 s before the time limit
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    text = log.read_text()
    assert "srun --mpi=pmix --kill-on-bad-exit=1 python -m mpi4py -m optuna_hpcnas run" in text
    assert "got USR1" in text and "finished without a signal" not in text
    assert "scontrol requeue 4242" in text
    assert text.index("got USR1") < text.index("scontrol requeue")
    assert "USR1 received" in out


def test_slurm_requeued_job_resumes_and_needs_the_storage(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path, "srun", "scontrol")
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script())
    log = tmp_path / "log"
    proc = subprocess.Popen(["bash", str(script)],
                            env=_env(tmp_path, bin_dir, SLURM_RESTART_COUNT="1"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _wait_for(log, "started")
    proc.send_signal(signal.SIGUSR1)
    proc.communicate(timeout=30)
    assert "optuna_hpcnas resume --config nas.toml" in log.read_text()
    env = _env(tmp_path, bin_dir)
    del env["OPTUNA_STORAGE"]
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode != 0 and "OPTUNA_STORAGE" in done.stderr
    assert "srun" not in (log.read_text().split("started")[-1])


def test_mpirun_wrapper_forwards_term_and_returns_the_status(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path, "mpirun")
    script = tmp_path / "hpcnas-mpirun.sh"
    script.write_text(mpirun_script())
    script.chmod(0o755)
    log = tmp_path / "log"
    proc = subprocess.Popen([str(script), "-n", "3", "run", "--config", "c.toml"],
                            env=_env(tmp_path, bin_dir, MPIRUN_ARGS="-hosts a,b"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _wait_for(log, "started")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    text = log.read_text()
    assert "mpirun -hosts a,b -n 3 python -m mpi4py -m optuna_hpcnas run --config c.toml" in text
    assert "got TERM" in text
    assert proc.returncode == 143  # the ranks' status, passed on
