"""One evaluation core: the same seed, architecture and settings give the same validation
metric through the Python API, ``hpcnas run`` in one process and ``mpirun -n 2`` with
groups of one rank."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys

import optuna
import pytest
import torch

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.config import DataConfig
from optuna_hpcnas.evaluation import ObjectiveConfig
from optuna_hpcnas.evaluation import SupernetObjective
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.run import utilisation_from_study
from optuna_hpcnas.supernet import SupernetTrainingConfig
from tests.mpi_helpers import run_mpi
from tests.run_configs import tiny_config
from tests.run_configs import write_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = tiny_config(
    study={"name": "same", "n_trials": 2},
    pruner={"name": "none"},  # no decision that depends on which trial finished first
    sampler={"name": "random", "seed": 0},
)


def _enqueue(study: optuna.Study) -> None:
    """One architecture queued twice (trial 0 and trial 1)."""
    space = HierarchicalSearchSpace.preset("digits-small")
    params = space.to_params(list(space.enumerate())[700])
    for _ in range(2):
        study.enqueue_trial(params, skip_if_exists=False)


def _enqueued_study(url: str) -> None:
    _enqueue(optuna.create_study(study_name="same", storage=url, direction="maximize"))


def _values(url: str) -> dict[int, tuple[float, dict[int, float]]]:
    study = optuna.load_study(study_name="same", storage=url)
    out = {}
    for t in study.get_trials():
        assert t.state == optuna.trial.TrialState.COMPLETE, (t.number, t.user_attrs)
        out[t.number] = (t.values[0], dict(t.intermediate_values))
    return out


def _api_values() -> dict[int, tuple[float, dict[int, float]]]:
    """The Python API, as a user writes it, with the settings of CONFIG."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        space = HierarchicalSearchSpace.preset("digits-small")
        data = DataConfig(**CONFIG["data"]).load()
        process_keys = ("threads", "warmup_max_batches")
        training = {k: v for k, v in CONFIG["training"].items() if k not in process_keys}
        objective = SupernetObjective(
            space,
            data,
            training=SupernetTrainingConfig(**training),
            plan=StagePlan(**CONFIG["stages"]),
            config=ObjectiveConfig(**CONFIG["objective"]),
            seed=CONFIG["training"].get("seed", 0),
        )
        objective.train_supernet(max_batches=CONFIG["training"]["warmup_max_batches"])
        study = optuna.create_study(direction="maximize")
        _enqueue(study)
        study.optimize(objective, n_trials=2)
    finally:
        torch.set_num_threads(threads)
    return {t.number: (t.values[0], dict(t.intermediate_values)) for t in study.get_trials()}


def _assert_same(
    a: dict[int, tuple[float, dict[int, float]]], b: dict[int, tuple[float, dict[int, float]]]
) -> None:
    assert sorted(a) == sorted(b) == [0, 1]
    for n in a:
        assert a[n][0] == pytest.approx(b[n][0], abs=1e-6)
        assert sorted(a[n][1]) == sorted(b[n][1]) == [3, 6]
        for step in a[n][1]:
            assert a[n][1][step] == pytest.approx(b[n][1][step], abs=1e-6)


@pytest.mark.mpi
def test_api_one_process_and_mpirun_give_the_same_metric(tmp_path: Path) -> None:
    api = _api_values()
    config = write_config(tmp_path / "nas.toml", CONFIG)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    one = f"sqlite:///{tmp_path / 'one.db'}"
    _enqueued_study(one)
    proc = subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config)]
        + ["--storage", one, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same(api, _values(one))

    two = f"sqlite:///{tmp_path / 'two.db'}"
    _enqueued_study(two)
    proc = run_mpi(
        2,
        ["-m", "optuna_hpcnas", "run", "--config", str(config), "--storage", two]
        + ["--no-progress", "--set", "distributed.group_size=1"],
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="same", storage=two)
    ranks = utilisation_from_study(study)[-1]["ranks"]
    assert [r["group"] for r in ranks] == [0, 1]  # two groups of one rank shared the budget
    _assert_same(api, _values(two))


def test_one_process_run_samples_and_prunes_as_the_api(tmp_path: Path) -> None:
    """The sampler's draws and the staged pruner's verdicts of a one-process ``hpcnas run``
    (reports written on the storage thread, its verdicts awaited only when they could stop
    the trial) are the API's, trial by trial."""
    from optuna_hpcnas.config import config_from_dict
    from optuna_hpcnas.run import run_search

    sections = {
        "study": {"name": "same", "n_trials": 6},
        "pruner": {"name": "staged"},
        # TPE past its start-up draws: each ask depends on every trial finished before it
        "sampler": {"name": "tpe", "seed": 5, "kwargs": {"n_startup_trials": 2}},
    }
    url = f"sqlite:///{tmp_path / 'run.db'}"
    config = config_from_dict(
        tiny_config(**{**sections, "study": {**sections["study"], "storage": url}})
    )
    run_search(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        space = HierarchicalSearchSpace.preset("digits-small")
        objective = SupernetObjective(
            space,
            config.data.load(),
            training=config.training.supernet,
            plan=config.stages,
            config=config.objective,
            seed=config.training.supernet.seed,
        )
        objective.train_supernet(max_batches=config.training.warmup_max_batches)
        api = optuna.create_study(
            direction="maximize",
            sampler=config.sampler.build(seed_offset=0),
            pruner=config.pruner.build(config.stages),
        )
        api.optimize(objective, n_trials=6)
    finally:
        torch.set_num_threads(threads)
    ran = optuna.load_study(study_name="same", storage=url).get_trials()
    states = [t.state for t in ran]
    assert states == [t.state for t in api.get_trials()]
    assert optuna.trial.TrialState.PRUNED in states  # the pruner decided something
    for a, b in zip(ran, api.get_trials()):
        assert a.params == b.params
        assert sorted(a.intermediate_values) == sorted(b.intermediate_values)
        for step, value in a.intermediate_values.items():
            assert value == pytest.approx(b.intermediate_values[step], abs=1e-6)
        if a.values is not None:
            assert a.values[0] == pytest.approx(b.values[0], abs=1e-6)
