"""``pip install optuna-hpcnas`` without extras is enough for both samplers: a fresh virtual
environment gets the project and its core dependencies only (from the package index, through
pip's cache), then runs both samplers on a small study."""

from __future__ import annotations

import json
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

REPO = Path(__file__).resolve().parents[2]
# Packages of the extras (and of the dev environment running this test) the core must not need.
NOT_INSTALLED = ("torch", "sklearn", "scipy", "plotly", "optuna_dashboard", "mpi4py", "pyarrow")

SCRIPT = """
import importlib.util, json, sys
import optuna
from optuna_hpcnas import HierarchicalSearchSpace, _keys
from optuna_hpcnas.samplers import EvolutionarySampler, QUBOSampler

optuna.logging.set_verbosity(optuna.logging.WARNING)
space = HierarchicalSearchSpace.preset("digits-small")

def objective(trial):
    arch = space.suggest(trial)
    return float(sum(c.op != "conv3x3" for c in arch.cells)) + 0.01 * (arch.cells[0].width or 0)

def origin(trial):
    evolution = trial.system_attrs.get(_keys.EVOLUTION_ORIGIN)
    if evolution is not None:
        return evolution["operation"]
    qubo = trial.system_attrs.get(_keys.QUBO_INFO, {})
    return "annealing" if qubo.get("n_samples", 0) > 0 else "random"

out = {"installed": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]}
start = {"seed": 0, "n_startup_trials": 3}
for sampler in (EvolutionarySampler(**start), QUBOSampler(**start)):
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=8)
    out[type(sampler).__name__] = [origin(t) for t in study.trials if t.state.name == "COMPLETE"]
print(json.dumps(out))
"""


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv[:4]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_both_samplers_run_with_core_dependencies_only(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy, so the build writes nothing into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for package in ("optuna_hpcnas", "qubo"):
        shutil.copytree(REPO / package, source / package, ignore=ignore)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    python = str(venv / "bin" / "python")
    # No extras: exactly `pip install optuna-hpcnas`, with pip's cache and the default index.
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)], 400)
    proc = _run([python, "-c", SCRIPT, *NOT_INSTALLED], timeout=60)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["installed"] == []
    # Three random start-up trials each, then children of evolution and of the annealer.
    evolution, annealing = result["EvolutionarySampler"], result["QUBOSampler"]
    assert len(evolution) == len(annealing) == 8, result
    assert evolution[:3] == annealing[:3] == ["random"] * 3, result
    assert "random" not in evolution[3:] and annealing[3:] == ["annealing"] * 5, result
