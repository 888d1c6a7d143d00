"""One-shot mode under ``hpcnas run``: the budget's trials are scored by inherited weights,
its last ``finalists`` repeat the best of them through the stages, and the export chooses
among those."""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import sys

import optuna
from optuna.distributions import CategoricalDistribution
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas._summary import export_choice
from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.run import run_search
from optuna_hpcnas.run._finalists import turn_into_finalist
from tests.run_configs import batched_one_shot_config
from tests.run_configs import tiny_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("batch", [1, 4])
def test_the_last_trials_of_the_budget_are_the_best_inherited_trained(
    tmp_path: Path, batch: int
) -> None:
    """Asked and told one by one, or in batches on the leader's copy (4, then the 2 left
    before the finalists' turn): the same study."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    config = config_from_dict(
        tiny_config(
            study={"storage": url, "n_trials": 8},
            space={"preset": "digits-elastic"},
            training={"sandwich": True, "paths_per_batch": 3},
            objective={"mode": "one-shot", "finalists": 2},
            distributed={"one_shot_batch": batch},
        )
    )
    run_search(config)
    study = optuna.load_study(study_name=config.study.name, storage=url)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert len(trials) == 8 and all(t.state.is_finished() for t in trials)
    inherited, finalists = trials[:6], trials[6:]
    for t in inherited:
        assert t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "inherited"
        assert t.user_attrs[_keys.OBJECTIVE_STEPS] == 0
        assert t.params and _keys.OBJECTIVE_ARCH in t.user_attrs
        assert t.datetime_start is not None and t.datetime_complete is not None
        assert (_keys.RUN_BATCH_SOURCE in t.system_attrs) == (batch > 1)
    ranked = sorted(
        (t for t in inherited if t.state == optuna.trial.TrialState.COMPLETE),
        key=lambda t: (-t.values[0], t.number),
    )
    distinct = []
    for t in ranked:  # the best architectures, each once
        if all(t.params != d.params for d in distinct):
            distinct.append(t)
    assert [t.user_attrs[_keys.OBJECTIVE_FINALIST_OF] for t in finalists] == [
        t.number for t in distinct[:2]
    ]
    for t in finalists:
        assert t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "trained"
        assert t.user_attrs[_keys.OBJECTIVE_STEPS] > 0
        assert t.params == study.trials[t.user_attrs[_keys.OBJECTIVE_FINALIST_OF]].params
    chosen = export_choice(study)
    assert chosen is not None and chosen[0].number in (6, 7)


def test_batches_without_a_budget_add_trials_until_the_finalists_turn(tmp_path: Path) -> None:
    """A timeout and no ``n_trials``: batches of candidates become new trials of the study
    until the finalists' share of the timeout, then the finalists train; nothing is left
    RUNNING or WAITING, and every batch told is written."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    config = config_from_dict(
        tiny_config(
            study={"storage": url, "n_trials": None, "timeout": 12},
            space={"preset": "digits-elastic"},
            training={"sandwich": True, "paths_per_batch": 3},
            objective={"mode": "one-shot", "finalists": 1, "finalists_share": 0.5},
            distributed={"one_shot_batch": 4},
        )
    )
    run_search(config)
    study = optuna.load_study(study_name=config.study.name, storage=url)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert all(t.state.is_finished() for t in trials)
    inherited = [t for t in trials if t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) == "inherited"]
    trained = [t for t in trials if t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) == "trained"]
    assert len(inherited) >= 4 and len(trained) >= 1
    # batched until the finalist's turn; after it, one by one (the finalist is not repeated)
    first = trained[0].number
    assert all((_keys.RUN_BATCH_SOURCE in t.system_attrs) == (t.number < first) for t in inherited)
    assert trained[0].user_attrs[_keys.OBJECTIVE_FINALIST_OF] in {t.number for t in inherited}
    assert len({t.number for t in trials}) == len(trials) == trials[-1].number + 1


def test_sigterm_writes_the_candidates_told_before_it(tmp_path: Path) -> None:
    """SIGTERM while a batch is part told: the run exits 143 with the told candidates written
    to the study (not held back until a batch fills) and nothing left RUNNING; the budget
    still adds up."""
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    config = batched_one_shot_config(tmp_path / "nas.toml", url)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "optuna_hpcnas", "-vv", "run", "--config", str(config),
         "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    told = 0
    for line in proc.stderr:  # the local copy's tells
        told += "told on the local copy" in line
        if told == 3:
            break
    assert told == 3
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    study = optuna.load_study(study_name="sig", storage=url)
    states = [t.state for t in study.get_trials()]
    assert states.count(optuna.trial.TrialState.RUNNING) == 0
    complete = states.count(optuna.trial.TrialState.COMPLETE)
    assert 3 <= complete < 200  # written at the signal, not with a whole batch
    assert len(states) == 300


def _study_with_inherited(values: list[float]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dist = {"op": CategoricalDistribution(["a", "b", "c", "d"])}
    for op, value in zip("abcd", values):
        study.add_trial(
            optuna.trial.create_trial(
                params={"op": op},
                distributions=dist,
                value=value,
                user_attrs={_keys.OBJECTIVE_FIDELITY: "inherited"},
            )
        )
    return study


def test_a_finalists_turn_fixes_the_trial_to_the_best_untrained_architecture() -> None:
    study = _study_with_inherited([0.2, 0.9, 0.5])
    dist = CategoricalDistribution(["a", "b", "c", "d"])
    trial = study.ask()
    # no budget and not late yet: a plain trial, the sampler's
    assert turn_into_finalist(study, trial, finalists=2, budget=False, late=False) is None
    assert turn_into_finalist(study, trial, finalists=2, budget=False, late=True) == 1
    assert trial.suggest_categorical("op", dist.choices) == "b"
    study.tell(trial, 0.95)
    second = study.ask()
    assert turn_into_finalist(study, second, finalists=2, budget=False, late=True) == 2
    assert second.suggest_categorical("op", dist.choices) == "c"
    study.tell(second, 0.6)
    third = study.ask()  # two finalists have started: no more
    assert turn_into_finalist(study, third, finalists=2, budget=False, late=True) is None
    # a published model keeps its place
    study.enqueue_trial({"op": "d"}, user_attrs={_keys.OBJECTIVE_REFERENCE: "fcn"})
    study.tell(third, 0.1)
    published = study.ask()
    assert turn_into_finalist(study, published, finalists=5, budget=False, late=True) is None


def test_two_leaders_that_chose_the_same_architecture_end_with_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leader B read the study before leader A wrote its choice, so both chose trial 1's
    architecture; on reading back, B (the higher number) sees A's and chooses again."""
    import optuna_hpcnas.evaluation as evaluation

    study = _study_with_inherited([0.2, 0.9, 0.5])
    first, second = study.ask(), study.ask()
    assert turn_into_finalist(study, first, finalists=2, budget=False, late=True) == 1
    real = evaluation.choose_finalists
    stale = [study.trials[1]]  # what B read before A's write
    calls = []

    def as_read(study: optuna.Study, n: int) -> list[optuna.trial.FrozenTrial]:
        calls.append(n)
        return stale if len(calls) == 1 else real(study, n)

    monkeypatch.setattr(evaluation, "choose_finalists", as_read)
    assert turn_into_finalist(study, second, finalists=2, budget=False, late=True) == 2
    assert len(calls) == 2
    assert second.suggest_categorical("op", ["a", "b", "c", "d"]) == "c"
