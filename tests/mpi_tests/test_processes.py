"""``[distributed] processes``: ``hpcnas run`` typed in a shell starts its own ranks (it
re-runs itself under the mpich wheel's ``mpirun``), as ``mpirun -n N hpcnas run`` would."""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import optuna
import pytest

from optuna_hpcnas import _keys
from tests.run_configs import tiny_config
from tests.run_configs import write_config

pytestmark = pytest.mark.mpi


def _hpcnas_run(config: Path, *flags: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``hpcnas run --config CONFIG`` as a user types it: no launcher in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    return subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=config.parent,
        env={**env, "OMP_NUM_THREADS": "1"},
    )


def test_hpcnas_run_starts_the_ranks_the_config_asks_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "local-ranks", "n_trials": 6, "storage": url},
            sampler={"name": "random", "seed": 0},
            pruner={"name": "none"},
            distributed={"processes": 2},
        ),
    )
    proc = _hpcnas_run(config, "--no-progress", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting 2 ranks" in proc.stderr
    assert proc.stdout.count("study 'local-ranks': 6 complete") == 1  # rank 0 prints, once
    study = optuna.load_study(study_name="local-ranks", storage=url)
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(6))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    (run,) = json.loads(attrs[_keys.DISTRIBUTED_UTILISATION])
    assert sorted(r["rank"] for r in run["ranks"]) == [0, 1]  # two evaluation groups
    assert sum(r["trials"] for r in run["ranks"]) == 6


def test_a_failed_rank_is_the_commands_exit_status(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={"name": "bad", "n_trials": 2, "storage": "sqlite:///nas.db"},
            data={"name": "npz", "path": str(tmp_path / "missing.npz")},
            distributed={"processes": 2},
        ),
    )
    proc = _hpcnas_run(config, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "missing.npz" in proc.stderr and "Traceback" not in proc.stderr
