"""The example script, reduced: rerunning the same command resumes from its checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys

import optuna
import pytest

from ._util import ROOT


@pytest.mark.slow
def test_example_resumes_when_rerun(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "examples" / "checkpointed_digits_search.py")]
    first = subprocess.run(
        [*cmd, "--storage", url, "--trials", "2", "--steps", "3"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "resumed" not in first.stdout
    second = subprocess.run(
        [*cmd, "--storage", url, "--trials", "3", "--steps", "3"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "(step 6)" in second.stdout  # 2 trials x 3 steps were checkpointed
    study = optuna.load_study(study_name="digits-nas", storage=url)
    assert len(study.trials) == 3
