"""The CPUs a process may use (affinity, cgroup CPU quota) and passive OpenMP waiting."""

from __future__ import annotations

from pathlib import Path

import pytest

from optuna_hpcnas._threads import available_cores
from optuna_hpcnas._threads import cgroup_cpu_limit
from optuna_hpcnas._threads import passive_openmp  # re-exported


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_of_the_process_or_any_parent(tmp_path: Path) -> None:
    root, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    _write(proc, "0::/jobs/job1\n")
    _write(root / "jobs" / "job1" / "cpu.max", "150000 100000\n")
    _write(root / "jobs" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, proc) == pytest.approx(1.5)
    _write(root / "jobs" / "cpu.max", "100000 100000\n")  # a tighter parent binds
    assert cgroup_cpu_limit(root, proc) == pytest.approx(1.0)


def test_container_reads_its_own_mount_root(tmp_path: Path) -> None:
    root, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    _write(proc, "0::/kubepods/pod1/abc\n")  # the host's path, not mounted inside
    _write(root / "cpu.max", "50000 100000\n")
    assert cgroup_cpu_limit(root, proc) == pytest.approx(0.5)


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    root, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    _write(proc, "5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n")
    _write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_quota_us", "200000\n")
    _write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, proc) == pytest.approx(2.0)
    _write(root / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(root, proc) is None


def test_no_quota_and_unreadable_files_mean_no_limit(tmp_path: Path) -> None:
    root, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    assert cgroup_cpu_limit(root, proc) is None
    _write(proc, "0::/\n")
    _write(root / "cpu.max", "garbage\n")
    assert cgroup_cpu_limit(root, proc) is None
    assert available_cores() >= 1


def test_openmp_waits_passively_unless_told_otherwise() -> None:
    env: dict[str, str] = {}
    passive_openmp(env)
    assert env["OMP_WAIT_POLICY"] == "passive"
    env = {"OMP_WAIT_POLICY": "active"}
    passive_openmp(env)
    assert env["OMP_WAIT_POLICY"] == "active"


def test_hpcnas_sets_passive_waiting_before_torch_loads() -> None:
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from optuna_hpcnas import cli\n"
        "try:\n"
        "    cli.main(['status', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "passive False"


def test_importing_the_package_makes_openmp_wait_passively() -> None:
    import subprocess
    import sys

    code = "import os, optuna_hpcnas; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "passive"
    env["OMP_WAIT_POLICY"] = "active"  # the user's choice stays
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "active"
