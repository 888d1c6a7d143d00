from __future__ import annotations

from pathlib import Path
import random

import optuna
import pytest

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial


def make_study(url: str, name: str, *, multi: bool, n_trials: int = 12) -> optuna.Study:
    """A small search on ``digits-small`` with a cheap synthetic objective."""
    space = HierarchicalSearchSpace.preset("digits-small")
    directions = ["maximize", "minimize"] if multi else ["maximize"]
    # Run in memory, then copy: one transaction per trial instead of one per attribute.
    study = optuna.create_study(
        study_name=name,
        directions=directions,
        sampler=optuna.samplers.RandomSampler(seed=1),
    )
    prepare_study(study, ["accuracy", "flops"] if multi else ["accuracy"])

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        arch = space.suggest(trial)
        flops = float(sum((c.width or 8) * (c.kernel or 1) ** 2 for c in arch.cells) * 1000)
        acc = 0.8 + 0.15 * random.Random(trial.number).random()
        record_trial(trial, arch, flops=flops, latency_s=flops / 1e9, stage="quick")
        if trial.number == 3:
            raise optuna.TrialPruned()
        return (acc, flops) if multi else acc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=n_trials)
    optuna.copy_study(from_study_name=name, from_storage=study._storage, to_storage=url)
    return optuna.load_study(study_name=name, storage=url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'nas.db'}"


@pytest.fixture(scope="module")
def single_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, optuna.Study]:
    """A single-objective study shared by the read-only tests of a module."""
    url = f"sqlite:///{tmp_path_factory.mktemp('single') / 'nas.db'}"
    return url, make_study(url, "digits", multi=False)
