"""Launch real ``mpirun`` jobs from tests (the ``mpich`` wheel's launcher, oversubscribed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from optuna_hpcnas.distributed._groups import find_mpirun


def mpirun_path() -> str:
    """The ``mpirun`` next to this interpreter (the venv's mpich wheel), else on PATH."""
    found = find_mpirun()
    if found is None:
        pytest.fail("mpirun not found: install the `mpi` extra (mpi4py + mpich)")
    return found


def run_mpi(
    n: int,
    args: list[str],
    *,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``mpirun -n N python -m mpi4py ARGS`` with one OpenMP thread per rank."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [mpirun_path(), "-n", str(n), sys.executable, "-m", "mpi4py", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )
