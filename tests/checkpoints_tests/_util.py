from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys
import time

ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoints_tests._worker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Wait until the worker writes ``path``; fail with its output if it dies first."""
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"worker exited with {proc.returncode} early:\n{out}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"worker never wrote {path}")
        time.sleep(0.05)


def finish(proc: subprocess.Popen[bytes], timeout: float = 180.0) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode()
