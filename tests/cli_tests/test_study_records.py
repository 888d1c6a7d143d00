"""What ``hpcnas export`` and ``deploy`` take from a study record: data, never code.

A ``[data] factory`` names code; anyone who can write to a shared storage can write the record,
so a factory read back from it is not imported (``--config`` or ``--data-factory`` must name
it on the command line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import re
import subprocess
import sys

import numpy as np
import optuna

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas._records import run_data_of
from optuna_hpcnas._records import set_study_system_attr
from tests.cli_tests._marker_factory import MARK_ENV
from tests.run_configs import tiny_config
from tests.run_configs import write_config

HPCNAS = str(Path(sys.executable).with_name("hpcnas"))
ROOT = Path(__file__).resolve().parents[2]
FACTORY = "tests.cli_tests._marker_factory:digits_with_mark"


def _hpcnas(*args: str, cwd: Path, mark: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPTUNA_STORAGE"}
    env.update({"PYTHONPATH": str(ROOT), MARK_ENV: str(mark), "OMP_NUM_THREADS": "1"})
    return subprocess.run(
        [HPCNAS, *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env
    )


def _problems(stderr: str) -> list[str]:
    """The lines of ``stderr`` other than INFO log lines."""
    return [line for line in stderr.strip().splitlines() if not re.match(r"\S+ INFO ", line)]


def test_a_factory_recorded_in_the_study_is_never_run(tmp_path: Path) -> None:
    mark = tmp_path / "factory-ran"
    write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "records", "storage": "sqlite:///nas.db", "n_trials": 2},
            data={"factory": FACTORY, "max_samples": 200},
        ),
    )
    run = _hpcnas("run", "--config", "nas.toml", "--no-progress", cwd=tmp_path, mark=mark)
    assert run.returncode == 0, run.stderr[-2000:]
    assert mark.read_text() == "ran"  # the config named it: the run called it
    mark.unlink()

    # What another writer of the storage could have put there: any importable callable.
    study = optuna.load_study(study_name="records", storage=f"sqlite:///{tmp_path / 'nas.db'}")
    recorded = run_data_of(study)
    assert recorded is not None
    assert recorded["factory"] == FACTORY

    for command in ("export", "deploy"):
        refused = _hpcnas(
            command, "--storage", "sqlite:///nas.db", "--out", command, cwd=tmp_path, mark=mark
        )
        assert refused.returncode == 2, refused.stderr[-2000:]
        lines = _problems(refused.stderr)
        assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert FACTORY in lines[0] and "--data-factory" in lines[0] and "--config" in lines[0]
        assert not mark.exists(), f"`hpcnas {command}` ran the recorded factory"
        assert not (tmp_path / command).exists()

    typed = _hpcnas(
        "export",
        "--storage",
        "sqlite:///nas.db",
        "--data-factory",
        FACTORY,
        "--untrained",
        "--no-onnx",
        "--out",
        "typed",
        cwd=tmp_path,
        mark=mark,
    )
    assert typed.returncode == 0, typed.stderr[-2000:]
    assert mark.read_text() == "ran"  # typed by the user on the command line
    assert "test accuracy" in typed.stdout


def test_a_damaged_data_record_is_one_line(tmp_path: Path) -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    arch = space.sample(np.random.default_rng(0))
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    study = optuna.create_study(study_name="damaged", storage=url, direction="maximize")
    set_study_system_attr(study, _keys.RUN_DATA, json.dumps({"name": "digits", "unknown": 1}))
    study.add_trial(
        optuna.trial.create_trial(value=0.5, user_attrs={_keys.OBJECTIVE_ARCH: arch.to_json()})
    )
    out = _hpcnas("export", "--storage", url, cwd=tmp_path, mark=tmp_path / "m")
    assert out.returncode == 2
    lines = _problems(out.stderr)
    assert len(lines) == 1 and "records a [data] table that is not valid" in lines[0], lines
