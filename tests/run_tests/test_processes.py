"""``[distributed] processes`` resolved and turned into the ``mpirun`` command (the launch
itself is tests/mpi_tests/test_processes.py)."""

from __future__ import annotations

import logging
import sys

import pytest

from optuna_hpcnas._process import start_time
from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.run import _processes
from optuna_hpcnas.run import LaunchError
from optuna_hpcnas.run import local_processes
from optuna_hpcnas.run import relaunch_command
from tests.run_configs import tiny_config


def _config(processes: object, **sections: dict[str, object]):  # type: ignore[no-untyped-def]
    distributed = {"processes": processes, **sections.pop("distributed", {})}
    return config_from_dict(tiny_config(distributed=distributed, **sections))


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)


def test_auto_is_one_rank_per_usable_cpu_in_whole_groups() -> None:
    assert local_processes(_config("auto"), cores=4) == 4
    assert local_processes(_config("auto", training={"threads": 2}), cores=4) == 2
    assert local_processes(_config("auto", distributed={"group_size": 2}), cores=3) == 2
    assert local_processes(_config("auto"), cores=1) == 1
    assert local_processes(_config(3), cores=1) == 3  # a number is taken as written


@pytest.mark.parametrize("bad", ["two", 0, 1.5, True])
def test_a_wrong_value_names_the_key(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="processes"):
        _config(bad)


def test_the_command_re_runs_this_command_line_under_mpirun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_processes, "find_mpirun", lambda: "/opt/mpi/bin/mpiexec")
    argv = ["run", "--config", "nas.toml", "--n-trials", "8"]
    assert relaunch_command(_config(2), argv) == [
        "/opt/mpi/bin/mpiexec", "-n", "2", sys.executable, "-m", "mpi4py", "-m", "optuna_hpcnas",
        *argv,
    ]  # fmt: skip
    assert relaunch_command(_config(1), argv) is None
    monkeypatch.setenv("PMI_SIZE", "2")  # already under a launcher: it decides
    monkeypatch.setenv("PMI_RANK", "0")
    assert relaunch_command(_config(2), argv) is None


def test_without_mpirun_a_number_is_an_error_and_auto_runs_here(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_processes, "find_mpirun", lambda: None)
    monkeypatch.setattr(_processes, "available_cores", lambda: 2)
    with pytest.raises(LaunchError, match=r"processes = 2 needs mpirun.*optuna-hpcnas\[mpi\]"):
        relaunch_command(_config(2), ["run"])
    with caplog.at_level(logging.WARNING):
        assert relaunch_command(_config("auto"), ["run"]) is None
    assert "running in one process" in caplog.text


def test_the_exit_status_is_the_jobs() -> None:
    assert _processes.run_relaunched([sys.executable, "-c", "raise SystemExit(75)"]) == 75
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert _processes.run_relaunched([sys.executable, "-c", killed]) == 128 + 15


def test_a_rank_killed_by_a_signal_is_128_plus_the_signal(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # mpich's mpiexec reports a rank's signal on stderr and exits with the signal's number
    mpiexec = (
        "import sys; sys.stderr.write('=   KILLED BY SIGNAL: 9 (Killed)\\n'); raise SystemExit(9)"
    )
    assert _processes.run_relaunched([sys.executable, "-c", mpiexec]) == 128 + 9
    assert "KILLED BY SIGNAL: 9" in capfd.readouterr().err  # the job's stderr still shown
    assert _processes.run_relaunched([sys.executable, "-c", "raise SystemExit(9)"]) == 9


def test_a_rank_stops_when_the_launching_process_is_gone() -> None:
    import os
    import subprocess
    import time

    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    rank = (
        "import signal, sys, time\n"
        "from optuna_hpcnas.run import follow_launcher\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
        "assert follow_launcher(interval=0.1) is not None\n"
        "time.sleep(60)\n"
    )
    start = start_time(launcher.pid)
    env = {**os.environ, _processes.LAUNCHER_ENV: f"{launcher.pid}:{start}"}
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", rank], env=env, timeout=60, check=False)
    launcher.wait()
    assert proc.returncode == 143 and time.monotonic() - began < 30
    # not started by hpcnas run: nothing to follow
    env.pop(_processes.LAUNCHER_ENV)
    code = "from optuna_hpcnas.run import follow_launcher; assert follow_launcher() is None"
    subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=True)
