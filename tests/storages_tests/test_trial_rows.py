"""A trial's rows written in one transaction (``_records._write_trial_rows``) on SQLite,
PostgreSQL and MySQL: attributes overwrite as Optuna's upserts do, a finished trial takes no
write, parameters keep Optuna's distribution check; and an ask's reads do not grow with the
run's queued budget (issue 22, compute share)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.exceptions import UpdateFinishedTrialError
import pytest

from optuna_hpcnas import _records
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import EvolutionarySampler


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rows.db'}"
    fixture = "postgres_url" if request.param == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))


def test_attributes_are_upserted_together(storage_url: str) -> None:
    study = optuna.create_study(storage=storage_url)
    trial = study.ask()
    trial.set_user_attr("kept", 1)
    trial.set_user_attr("changed", "old")
    _records.set_trial_attrs(
        trial, user={"changed": "new", "added": [1, 2]}, system={"layout": "dp1xpp1"}
    )
    frozen = optuna.load_study(study_name=study.study_name, storage=storage_url).trials[0]
    assert frozen.user_attrs == {"kept": 1, "changed": "new", "added": [1, 2]}
    assert frozen.system_attrs["layout"] == "dp1xpp1"
    assert trial.user_attrs["changed"] == "new"  # the trial's own cache follows


def test_a_finished_trial_takes_none_of_the_rows(storage_url: str) -> None:
    study = optuna.create_study(storage=storage_url)
    trial = study.ask()
    study.tell(trial, 1.0)
    with pytest.raises(UpdateFinishedTrialError):
        _records.set_trial_attrs(trial, user={"late": 1}, system={"late": 2})
    frozen = study._storage.get_trial(trial._trial_id)
    assert "late" not in frozen.user_attrs and "late" not in frozen.system_attrs


def test_parameters_keep_optunas_distribution_check(storage_url: str) -> None:
    study = optuna.create_study(storage=storage_url)
    study.ask().suggest_categorical("op", ["conv", "pool"])
    rdb = _records.rdb_backend(study._storage)
    trial = study.ask()
    clash = CategoricalDistribution(["attention"])
    with pytest.raises(ValueError, match="dynamic value space"):
        _records._write_trial_rows(
            rdb, trial._trial_id, params=[("op", 0.0, clash)], user={}, system={}
        )
    same = CategoricalDistribution(["conv", "pool"])
    _records._write_trial_rows(
        rdb, trial._trial_id, params=[("op", 1.0, same)], user={"u": 1}, system={}
    )
    assert study._storage.get_trial(trial._trial_id).params == {"op": "pool"}


@pytest.fixture
def statements() -> Iterator[list[str]]:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    seen: list[str] = []

    def count(*args: object) -> None:
        seen.append(str(args[2]))

    event.listen(Engine, "after_cursor_execute", count)
    yield seen
    event.remove(Engine, "after_cursor_execute", count)


def _ask_statements(tmp_path: Path, budget: int, seen: list[str]) -> int:
    """Statements of the 4th ask of a run whose budget queued ``budget`` trials."""
    space = HierarchicalSearchSpace.preset("digits-small")
    url = f"sqlite:///{tmp_path / f'budget{budget}.db'}"
    study = optuna.create_study(storage=url, sampler=EvolutionarySampler(seed=0))
    _records.add_budget(study, budget)
    for _ in range(3):
        trial = _records.pop_waiting_trial(study)
        assert trial is not None
        _records.suggest_architecture(space, trial)
        study.tell(trial, 0.5)
    trial = _records.pop_waiting_trial(study)
    assert trial is not None
    seen.clear()
    _records.suggest_architecture(space, trial)
    return len(seen)


def test_an_ask_reads_the_queued_budget_once(tmp_path: Path, statements: list[str]) -> None:
    # Every queued budget trial is numbered after the asked one: the claim's check of "trials
    # that may have proposed since" read each of them, a dozen statements apiece.
    small = _ask_statements(tmp_path, 6, statements)
    large = _ask_statements(tmp_path, 60, statements)
    assert large == small
    assert small <= 30


def test_other_storages_read_a_few_later_trials_then_the_study(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from optuna_hpcnas.samplers import _proposals

    study = optuna.create_study()  # in memory: trials after the asked one are read one by one
    _records.add_budget(study, 40)
    trial = _records.pop_waiting_trial(study)
    assert trial is not None
    storage = study._storage
    reads = {"one": 0, "all": 0}
    get_trial, get_all = storage.get_trial, storage.get_all_trials

    def one(trial_id: int) -> object:
        reads["one"] += 1
        return get_trial(trial_id)

    def every(*args: object, **kwargs: object) -> object:
        reads["all"] += 1
        return get_all(*args, **kwargs)

    monkeypatch.setattr(storage, "get_trial", one)
    monkeypatch.setattr(storage, "get_all_trials", every)
    frozen = get_trial(trial._trial_id)
    later = _proposals._recent_trials(storage, study._study_id, frozen, [])
    assert len(later) == 39  # every queued trial is checked ...
    assert reads == {"one": _proposals._WALK, "all": 1}  # ... in a bounded number of reads
    last = get_trial(get_all(study._study_id)[-1]._trial_id)
    reads.update(one=0, all=0)
    assert _proposals._recent_trials(storage, study._study_id, last, []) == []
    assert reads == {"one": 0, "all": 0}  # nothing after it: nothing read
