"""Every example runs, reduced (2 trials, a few steps or one warm-up epoch), and leaves the
study it promises."""

from __future__ import annotations

import os
from pathlib import Path
import runpy
import subprocess
import sys

import optuna
from optuna.trial import TrialState
import pytest

from tests.mpi_helpers import mpirun_path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


_SUPERNET = ["--epochs", "1", "--max-batches", "2"]
_SCRATCH = ["--steps", "10"]  # optimisation steps of each candidate's training


def _run_example(
    name: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> str:
    # In-process (runpy), as `python examples/<name>.py ...` would: torch is imported once.
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [name, *args])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    return capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, extra, studies, expected",
    [
        # the supernet ones: 1 warm-up epoch, 2 batches an epoch and 2 steps a stage pass
        ("cnn_digits.py", _SUPERNET, ["cnn-digits"], "best accuracy"),
        ("sequence_attention.py", _SCRATCH, ["sequence-attention"], "mean accuracy of trials"),
        ("hardware_aware.py", _SUPERNET, ["hardware-aware"], "Pareto front within"),
        ("qubo_search.py", _SCRATCH, ["qubo-search-qubo", "qubo-search-random"], "QUBO best:"),
        ("own_operator.py", _SCRATCH, ["own-operator"], "\n  se "),  # the user's operator
    ],
)
def test_example_runs_reduced(
    script: str,
    extra: list[str],
    studies: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    storage = f"sqlite:///{tmp_path / 'examples.db'}"
    args = ["--trials", "2", "--storage", storage, *extra]
    if script == "cnn_digits.py":
        args += ["--weights", str(tmp_path / "supernet.pt")]
    out = _run_example(script, args, monkeypatch, capsys)
    assert expected in out
    assert f"hpcnas best --storage {storage}" in out
    for name in studies:
        study = optuna.load_study(study_name=name, storage=storage)
        complete = study.get_trials(states=(TrialState.COMPLETE,))
        finished = [t for t in study.trials if t.state.is_finished()]
        assert len(finished) == 2 and complete  # the staged pruner may stop one
        for t in complete:
            assert "arch_description" in t.user_attrs
        assert study.metric_names is not None
    if script == "cnn_digits.py":
        assert (tmp_path / "supernet.pt").stat().st_size > 10_000  # for `hpcnas export`


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.services
def test_distributed_example_with_the_mpirun_wrapper(postgres_url: str, tmp_path: Path) -> None:
    """examples/distributed_postgres/run.sh -> integrations/mpirun/hpcnas-mpirun.sh -> mpirun,
    two ranks (two evaluation groups) searching one PostgreSQL study."""
    env = {
        **os.environ,
        "OPTUNA_STORAGE": postgres_url,
        "RANKS": "2",
        "MPIRUN": mpirun_path(),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom"),
    }
    proc = subprocess.run(
        [
            str(EXAMPLES / "distributed_postgres" / "run.sh"),
            "--n-trials", "4",
            "--set", "distributed.group_size=1",
            "--set", "metrics.port=0",
            "--set", "training.epochs=1",
            "--set", "training.warmup_max_batches=2",
            "--set", "stages.stages=[{name='quick', steps=2, lr=1e-3, promote=0.34}, "
            "{name='medium', steps=6, lr=1e-2}]",
            "--set", "stages.eval_every=2",
            "--set", "data.max_samples=200",
        ],
        capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hpcnas dashboard" in proc.stdout  # rank 0's closing hints, once
    assert proc.stdout.count("next: hpcnas best") == 1
    # The password-free URL of the fixture appears only masked-or-absent in the logs.
    study = optuna.load_study(study_name="distributed-digits", storage=postgres_url)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 4 and all(t.state.is_finished() for t in trials)
    groups = {t.system_attrs.get("hpcnas:distributed:group") for t in trials}
    assert groups - {None} <= {0, 1}
    assert study.metric_names == ["accuracy"]


def test_mpirun_wrapper_propagates_failure(tmp_path: Path) -> None:
    env = {**os.environ, "MPIRUN": mpirun_path(), "PYTHON": sys.executable,
           "PYTHONPATH": str(REPO)}  # fmt: skip
    env.pop("OPTUNA_STORAGE", None)
    proc = subprocess.run(
        [str(REPO / "integrations/mpirun/hpcnas-mpirun.sh"), "-n", "2", "status"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "OPTUNA_STORAGE is not set" in proc.stderr
    assert proc.stderr.count("hpcnas status: error: no storage given") == 2  # both ranks


@pytest.mark.slow
def test_own_operator_from_toml(tmp_path: Path) -> None:
    """``[[space.operator]]``: the user's operator (``examples/own_ops.py``) in every cell."""
    storage = f"sqlite:///{tmp_path / 'own.db'}"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config",
         str(EXAMPLES / "own_operator.toml"), "--n-trials", "2", "--no-progress",
         "--set", f"study.storage={storage}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="own-operator-toml", storage=storage)
    first = study.trials[0]
    assert first.params["node.cell0.op"] == "se" and first.state == TrialState.COMPLETE
    assert '"se"' in first.user_attrs["arch"]
