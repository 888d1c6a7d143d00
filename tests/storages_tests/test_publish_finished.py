"""``_records.PublishFinished``: trials finished on a local copy of a study written into it at
once, on every storage: into its budget trials queued without parameters (some left for the
finalists), or as new trials; two writers never fill one budget trial."""

from __future__ import annotations

import math
import threading

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.storages import open_storage

_SPACE = {"x": FloatDistribution(0.0, 1.0), "op": CategoricalDistribution(["conv", "pool"])}


def _finished_locally(values: list[float], seed: int = 0) -> list[FrozenTrial]:
    local = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed)
    )
    out = []
    for value in values:
        trial = local.ask(_SPACE)
        trial.set_user_attr("fidelity", "inherited")
        trial.storage.set_trial_system_attr(trial._trial_id, "hpcnas:test", value)
        local.tell(trial, value)
        out.append(local._storage.get_trial(trial._trial_id))
    return out


def _study(url: str) -> optuna.Study:
    return optuna.create_study(
        storage=open_storage(url), direction="maximize", study_name="publish", load_if_exists=True
    )


def test_a_batch_fills_the_budget_trials_queued_without_parameters(storage_url: str) -> None:
    study = _study(storage_url)
    _records.add_budget(study, 5, fixed=[("fcn", {"x": 0.5, "op": "conv"})])
    local = _finished_locally([0.1, 0.7, -math.inf])

    numbers = _records.PublishFinished(study, local, claim="c1", budget=True, reserve=1)()

    assert numbers == [1, 2, 3]  # trial 0 keeps its parameters, trial 4 waits for a finalist
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.WAITING] + [TrialState.COMPLETE] * 3 + [
        TrialState.WAITING
    ]
    assert "fixed_params" in trials[0].system_attrs
    for written, source in zip(trials[1:4], local):
        assert written.params == source.params
        assert written.distributions == source.distributions
        assert written.values == source.values
        assert written.user_attrs == source.user_attrs
        assert written.system_attrs["hpcnas:test"] == source.system_attrs["hpcnas:test"]
        assert written.system_attrs[_keys.RUN_CLAIM] == "c1"
        assert written.system_attrs[_keys.RUN_BUDGET_TRIAL] is True  # still a budget trial
        assert written.datetime_complete is not None
    assert trials[3].values == [-math.inf]
    assert study.best_trial.number == 2

    # no room beyond the reserve: nothing written; without a reserve, one of two fits
    more = _finished_locally([0.9, 0.8], seed=1)
    assert _records.PublishFinished(study, more, claim="c2", budget=True, reserve=1)() == []
    assert _records.PublishFinished(study, more, claim="c3", budget=True)() == [4]
    assert study.get_trials()[4].params == more[0].params


def test_new_trials_are_numbered_after_the_study(storage_url: str) -> None:
    study = _study(storage_url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    local = _finished_locally([0.3, 0.2, 0.1])

    numbers = _records.PublishFinished(study, local, claim="c", budget=False)()

    assert numbers == [2, 3, 4]
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    assert [t.params for t in trials[2:]] == [t.params for t in local]
    assert [t.value for t in trials[2:]] == [0.3, 0.2, 0.1]
    assert study.best_value == max(t.value for t in trials)  # type: ignore[type-var]


def test_two_writers_never_fill_one_budget_trial(shared_storage_url: str) -> None:
    """Two leaders write three batches of three each into ten budget trials at the same
    time: ten written, each once, the rest dropped."""
    study = _study(shared_storage_url)
    _records.add_budget(study, 10)
    written: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(index: int) -> None:
        try:
            own = _study(shared_storage_url)  # each its own connections
            start.wait()
            for batch in range(3):
                local = _finished_locally([0.5] * 3, seed=10 * index + batch)
                claim = f"w{index}-{batch}"
                publish = _records.PublishFinished(own, local, claim=claim, budget=True)
                written[index] += publish()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    both = written[0] + written[1]
    assert sorted(both) == list(range(10))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 10
    assert all(t.params for t in trials)


def test_a_lost_answer_is_found_by_its_claim_on_a_database(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    study = _study(url)
    _records.add_budget(study, 3)
    publish = _records.PublishFinished(
        study, _finished_locally([0.4, 0.6]), claim="lost", budget=True
    )
    assert publish.recover() == (False, None)  # nothing written yet: try again
    numbers = publish()
    assert publish.recover() == (True, numbers)  # written, its answer lost: not again
