"""``hpcnas run`` on data of any shape and size: it completes, or says why in one line (exit
2) on every rank; never a traceback, never ``MPI_Abort``.

Hypothesis draws the data (1 to 5,000 samples, signals of 8 to 2,000 positions with 1 to 16
channels or images up to 48 x 48, 2 to 50 classes, imbalanced ones included) and the batch
size; the search is two trials of a few steps, so what is tested is that every shape builds,
trains, validates and reports, not what it learns.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
import subprocess
import sys
import tempfile
from typing import Any

from hypothesis import example
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import optuna
import pytest

from optuna_hpcnas.cli import main
from tests.mpi_helpers import mpirun_path
from tests.run_configs import write_config

# Elements of one data set at most (samples x positions x channels): every axis reaches its
# extreme, not all of them at once, and an example stays a few seconds on one core.
MAX_ELEMENTS = 1_500_000


@st.composite
def data_sets(draw: st.DrawFn, *, image: bool | None = None) -> dict[str, Any]:
    """A data set; ``image`` fixes the kind (``None``: either)."""
    if image is None:
        image = draw(st.booleans())
    if image:
        shape = (draw(st.integers(1, 4)), draw(st.integers(1, 48)), draw(st.integers(1, 48)))
    else:
        shape = (draw(st.integers(8, 2000)), draw(st.integers(1, 16)))
    n = draw(st.integers(10, 5000))
    n = max(10, min(n, MAX_ELEMENTS // int(np.prod(shape))))
    classes = draw(st.integers(2, 50))
    decay = draw(st.sampled_from([1.0, 0.7, 0.3]))  # 1.0: balanced; 0.3: a few rare classes
    batch = draw(st.sampled_from(["auto", 2, 3, 7, 16, 64, 128]))
    return {"shape": shape, "n": n, "classes": classes, "decay": decay, "batch": batch}


def _write_case(folder: Path, case: dict[str, Any]) -> Path:
    rng = np.random.default_rng(0)
    weights = case["decay"] ** np.arange(case["classes"])
    y = rng.choice(case["classes"], size=case["n"], p=weights / weights.sum())
    x = rng.normal(size=(case["n"], *case["shape"])).astype(np.float32)
    np.savez(folder / "data.npz", x_train=x, y_train=y)
    image = len(case["shape"]) == 3
    return write_config(
        folder / "nas.toml",
        {
            "study": {
                "name": "shape",
                "n_trials": 2,
                "storage": f"sqlite:///{folder / 'nas.db'}",
            },
            "space": {"preset": "digits-small" if image else "signal-1d"},
            "data": {"name": "npz", "path": str(folder / "data.npz")},
            "sampler": {"name": "random", "seed": 0},
            "pruner": {"name": "staged"},
            "stages": {
                "stages": [
                    {"name": "quick", "steps": 2, "lr": 1e-3, "promote": 0.5},
                    {"name": "full", "steps": 2, "lr": 1e-2},
                ],
                "eval_every": 2,
            },
            "training": {"epochs": 1, "warmup_max_batches": 2, "paths_per_batch": 2},
            "objective": {"batch_size": case["batch"], "latency_repeats": 1},
            "distributed": {"processes": 1},
        },
    )


def _check_outcome(code: int, err: str, folder: Path) -> None:
    assert "Traceback" not in err and "MPI_Abort" not in err, err[-3000:]
    if code == 0:
        study = optuna.load_study(study_name="shape", storage=f"sqlite:///{folder / 'nas.db'}")
        trials = study.get_trials(deepcopy=False)
        assert len(trials) == 2 and all(t.state.is_finished() for t in trials)
        # a trial may fail for its own reason (a candidate), never for the data's shape
        for t in trials:
            reason = t.user_attrs.get("fail_reason", "")
            assert not reason or reason.startswith(("non-finite", "out of memory")), reason
        return
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors and len(set(errors)) == 1, err[-3000:]  # the same line on every rank
    assert errors[0].startswith("hpcnas run: error: ")


def check_any_shape(case: dict[str, Any]) -> None:
    """``hpcnas run`` on ``case`` in this process completes or exits 2 with one line."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        config = _write_case(folder, case)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["-q", "run", "--config", str(config), "--no-progress"])
        _check_outcome(code, err.getvalue(), folder)


# Signals here, images in test_any_image_shape.py: two files, so that pytest-xdist runs them
# side by side (a file per worker).
@settings(
    max_examples=7,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=data_sets(image=False))
# the corners, and the shapes that crashed before: a training split of 1 modulo the batch
# (3,201 of MNIST-1D's 4,001 signals), a flatten stem of 600 features, 1,460 positions
@example(case={"shape": (40, 1), "n": 4001, "classes": 10, "decay": 1.0, "batch": 64})
@example(case={"shape": (40, 1), "n": 5000, "classes": 50, "decay": 0.7, "batch": "auto"})
@example(case={"shape": (100, 6), "n": 40, "classes": 4, "decay": 1.0, "batch": "auto"})
@example(case={"shape": (1460, 1), "n": 100, "classes": 10, "decay": 1.0, "batch": "auto"})
@example(case={"shape": (2000, 16), "n": 46, "classes": 3, "decay": 1.0, "batch": 7})
def test_any_signal_shape_completes_or_is_one_line(case: dict[str, Any]) -> None:
    check_any_shape(case)


@pytest.mark.mpi
@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=data_sets())
def test_any_data_shape_under_mpirun(case: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        config = _write_case(folder, case)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        command = [mpirun_path(), "-n", "2", sys.executable, "-m", "mpi4py", "-m"]
        proc = subprocess.run(
            [*command, "optuna_hpcnas", "-q", "run", "--config", str(config), "--no-progress"],
            capture_output=True, text=True, env=env, cwd=folder, timeout=300,
        )  # fmt: skip
        _check_outcome(proc.returncode, proc.stderr, folder)


def test_a_data_set_too_small_to_split_is_one_line(tmp_path: Path) -> None:
    """Ten samples of 50 classes leave no validation split: one line, not a crash."""
    config = _write_case(
        tmp_path, {"shape": (20, 1), "n": 10, "classes": 50, "decay": 1.0, "batch": "auto"}
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["-q", "run", "--config", str(config), "--no-progress"])
    _check_outcome(code, err.getvalue(), tmp_path)
