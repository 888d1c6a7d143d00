"""``hpcnas run`` end to end: a real (tiny) search in a subprocess, scraped while it runs."""

from __future__ import annotations

import os
from pathlib import Path
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.metrics_tests.test_metrics import _value
from tests.run_configs import tiny_config

REPO = Path(__file__).resolve().parents[2]


def _config_text(*, storage: str, n_trials: int, port: int, refresh: float) -> str:
    import tomli_w

    return tomli_w.dumps(
        tiny_config(
            study={"name": "digits", "storage": storage, "n_trials": n_trials},
            pruner={"name": "none"},
            stages={"stages": [{"name": "quick", "steps": 2, "lr": 1e-3}]},
            metrics={"enabled": True, "port": port, "refresh_seconds": refresh},
        )
    )


def _serves_or_exits(proc: subprocess.Popen[str], port: int) -> bool:
    """Whether ``proc`` serves metrics on ``port`` before it exits (within 240 s)."""
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5):
                return True
        except OSError:
            time.sleep(0.1)
    return proc.poll() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hpcnas(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "optuna_hpcnas", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def test_a_metrics_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        config = tmp_path / "nas.toml"
        config.write_text(
            _config_text(
                storage=f"sqlite:///{tmp_path / 'nas.db'}", n_trials=1, port=port, refresh=1.0
            )
        )
        proc = _hpcnas("run", "--config", str(config), cwd=tmp_path)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert f"hpcnas run: error: [metrics] cannot serve on 127.0.0.1:{port}" in err


@pytest.mark.slow
def test_run_serves_moving_metrics_then_resume_and_status(tmp_path: Path) -> None:
    config = tmp_path / "nas.toml"
    for _ in range(3):  # another test may take the free port before the run binds it
        port = _free_port()
        config.write_text(
            # the storage is re-read every 50 ms, far below one trial's time, so successive
            # scrapes see the search move whatever the machine's speed
            _config_text(
                storage=f"sqlite:///{tmp_path / 'nas.db'}", n_trials=5, port=port, refresh=0.05
            )
        )
        proc = _hpcnas("run", "--config", str(config), cwd=tmp_path)
        if _serves_or_exits(proc, port):
            break
        _, err = proc.communicate()
        assert "[metrics] cannot serve" in err, err
    completed: list[float] = []
    progress: list[float] = []
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            time.sleep(0.2)  # not serving yet (or already closed)
            continue
        value = _value(text, "hpcnas_trials", state="COMPLETE")
        if value is not None and (not completed or value != completed[-1]):
            completed.append(value)
            progress.append(_value(text, "hpcnas_search_progress_ratio") or 0.0)
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # The scrapes saw the search advance: more completed trials and more progress over time.
    assert len(completed) >= 2, (completed, err)
    assert completed == sorted(completed) and completed[-1] > completed[0]
    assert progress == sorted(progress) and progress[-1] > progress[0]
    # Not a TTY: one plain line per finished trial, and the hints for what to do next.
    lines = [line for line in err.splitlines() if re.search(r" trial \d+ COMPLETE", line)]
    assert len(lines) == 5 and "[5/5 finished]" in lines[-1]
    assert "next: hpcnas best --storage sqlite:///" in out and "hpcnas dashboard" in out

    status = _hpcnas("status", "--config", str(config), cwd=tmp_path)
    out, _ = status.communicate(timeout=60)
    assert "trials       5  COMPLETE 5" in out and "compute      rank 0:" in out
    resume = _hpcnas("resume", "--config", str(config), cwd=tmp_path)
    out, _ = resume.communicate(timeout=60)
    assert resume.returncode == 0 and "no trial left to run" in out


def test_run_config_errors_name_key_and_allowed_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optuna_hpcnas.cli import main

    config = tmp_path / "nas.toml"
    config.write_text(
        _config_text(storage=f"sqlite:///{tmp_path / 'x.db'}", n_trials=2, port=0, refresh=2.0)
    )
    for args, expected in (
        (["--set", "sampler.name=cmaes"], "must be one of ['tpe', 'random'"),
        (["--set", "study.bogus=1"], "Unknown key `bogus` in [study]; allowed keys: ['name'"),
        (["--set", "nope"], "section.key=value"),
        (["--study-name", "other"], "no such SQLite file"),
        # accepted before, then wrong: queued for minutes, never stopped, crashed later
        (["--set", "study.n_trials=1000000000000"], "`n_trials` is 1000000000000, but must be <="),
        (["--set", "study.timeout=nan"], "`timeout` is nan, but must be a finite number"),
        (["--set", "objective.max_flops=nan"], "`max_flops` is nan, but must be a finite"),
        (["--set", "sampler.seed=100000000000000000000"], "but must be <= 2147483647"),
        (["--set", "metrics.port=70000"], "`port` is 70000, but must be <= 65535"),
    ):
        command = "resume" if "--study-name" in args else "run"
        assert main([command, "--config", str(config), *args]) == 2
        err = capsys.readouterr().err
        assert expected in err, err
