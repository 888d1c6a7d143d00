"""A batch of finished trials written into an Optuna journal (file or Redis) in at most two
appends, found again after a lost answer, and readable by Optuna's own backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.storages import open_storage

from .test_publish_finished import _finished_locally

JOURNALS = ["journal-file", pytest.param("journal-redis", marks=pytest.mark.services)]


@pytest.fixture(params=JOURNALS)
def journal_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    from .conftest import backend_url

    return backend_url(request, request.param, tmp_path)


def _study(url: str) -> optuna.Study:
    return optuna.create_study(
        storage=open_storage(url), direction="maximize", study_name="batch", load_if_exists=True
    )


class _Appends:
    """Counts the backend's appends; ``fail`` makes the next one raise before or after its
    logs land (a server gone, or an answer lost)."""

    def __init__(self, storage: JournalStorage) -> None:
        self.calls = 0
        self.fail: str | None = None
        backend = storage._backend
        self._append: Callable[[list[dict[str, Any]]], None] = backend.append_logs
        backend.append_logs = self  # type: ignore[method-assign]

    def __call__(self, logs: list[dict[str, Any]]) -> None:
        self.calls += 1
        fail, self.fail = self.fail, None
        if fail == "before":
            raise ConnectionError("storage away")
        self._append(logs)
        if fail == "after":
            raise ConnectionError("answer lost")


def test_a_budget_batch_is_two_appends_and_a_new_one_is_one(journal_url: str) -> None:
    study = _study(journal_url)
    _records.add_budget(study, 6)
    appends = _Appends(study._storage)  # type: ignore[arg-type]

    numbers = _records.PublishFinished(
        study, _finished_locally([0.1, 0.2, 0.3, 0.4]), claim="b", budget=True
    )()
    assert numbers == [0, 1, 2, 3]
    assert appends.calls == 2  # the claims, then every key of the four trials

    appends.calls = 0
    assert _records.PublishFinished(
        study, _finished_locally([0.5, 0.6], seed=1), claim="n", budget=False
    )() == [6, 7]
    assert appends.calls == 1
    states = [t.state for t in study.get_trials()]
    assert (
        states == [TrialState.COMPLETE] * 4 + [TrialState.WAITING] * 2 + [TrialState.COMPLETE] * 2
    )


@pytest.mark.parametrize("budget", [True, False])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failed_append_is_tried_again_without_writing_twice(
    journal_url: str, budget: bool, when: str
) -> None:
    study = _study(journal_url)
    _records.add_budget(study, 4)
    local = _finished_locally([0.3, 0.9, 0.5])
    appends = _Appends(study._storage)  # type: ignore[arg-type]
    publish = _records.PublishFinished(study, local, claim="retry", budget=budget)

    appends.fail = when
    with pytest.raises(ConnectionError):
        publish()
    numbers = publish()  # the outage window's next try

    assert numbers == ([0, 1, 2] if budget else [4, 5, 6])
    trials = study.get_trials()
    written = [t for t in trials if t.system_attrs.get(_keys.RUN_CLAIM) == "retry"]
    assert [t.number for t in written] == numbers
    assert [t.params for t in written] == [t.params for t in local]
    assert [t.values for t in written] == [t.values for t in local]
    assert [t.user_attrs for t in written] == [t.user_attrs for t in local]
    assert all(t.state == TrialState.COMPLETE for t in written)
    assert len(trials) == (4 if budget else 7)  # nothing created twice
    assert sum(t.state == TrialState.WAITING for t in trials) == (1 if budget else 4)


@pytest.mark.parametrize("budget_trials", [3, 4])
def test_a_claim_lost_to_another_writer_is_made_good_on_the_next_queued_trial(
    journal_url: str, budget_trials: int
) -> None:
    """A claim read first from another writer wins the trial: the batch claims the next
    queued trial instead, or drops its tail when none is left."""
    study = _study(journal_url)
    _records.add_budget(study, budget_trials)
    other = _study(journal_url)  # another storage object: another writer
    first = other._storage.get_all_trials(other._study_id)[0]._trial_id

    class _RaceAhead(_Appends):
        def __call__(self, logs: list[dict[str, Any]]) -> None:
            if self.calls == 0:  # the other writer's claim lands just before ours
                assert other._storage.set_trial_state_values(first, TrialState.RUNNING)
            super().__call__(logs)

    appends = _RaceAhead(study._storage)  # type: ignore[arg-type]
    numbers = _records.PublishFinished(
        study, _finished_locally([0.1, 0.2, 0.3]), claim="race", budget=True
    )()

    assert numbers == list(range(1, budget_trials))
    assert appends.calls == (2 if budget_trials == 3 else 3)  # claims, more claims, keys
    trials = study.get_trials()
    assert trials[0].state == TrialState.RUNNING and not trials[0].params
    assert [t.state for t in trials[1:]] == [TrialState.COMPLETE] * (budget_trials - 1)
    assert [t.value for t in trials[1:]] == [0.1, 0.2, 0.3][: budget_trials - 1]


@pytest.mark.services
def test_the_redis_journal_is_read_by_optunas_own_backend_and_in_chunks(
    redis_url: str,
) -> None:
    from optuna.storages.journal import JournalRedisBackend

    from optuna_hpcnas.storages._redis_journal import BatchedRedisBackend

    study = _study(redis_url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    _records.PublishFinished(study, _finished_locally([0.7] * 5), claim="c", budget=False)()
    ours = [(t.number, t.params, t.values) for t in study.get_trials()]

    plain = JournalStorage(JournalRedisBackend(redis_url))
    theirs = optuna.load_study(study_name="batch", storage=plain).get_trials()
    assert [(t.number, t.params, t.values) for t in theirs] == ours
    # Optuna's backend appends; ours reads it, a few logs per MGET
    optuna.load_study(study_name="batch", storage=plain).enqueue_trial({"x": 0.25})

    chunked = BatchedRedisBackend(redis_url, read_chunk=3)
    calls: list[int] = []
    mget = chunked._redis.mget

    def counting(keys: list[str]) -> Any:
        calls.append(len(keys))
        return mget(keys)

    chunked._redis.mget = counting  # type: ignore[method-assign]
    logs = list(chunked.read_logs(0))
    assert logs == list(JournalRedisBackend(redis_url).read_logs(0))
    assert all(n <= 3 for n in calls) and sum(calls) == len(logs)
    reread = JournalStorage(chunked)
    trials = optuna.load_study(study_name="batch", storage=reread).get_trials()
    assert [(t.number, t.params, t.values) for t in trials[:-1]] == ours
    assert trials[-1].state == TrialState.WAITING


def test_a_trials_attributes_are_one_append(journal_url: str) -> None:
    from optuna.exceptions import UpdateFinishedTrialError

    study = _study(journal_url)
    trial = study.ask()
    trial.set_user_attr("kept", 1)
    trial.set_user_attr("changed", "old")
    appends = _Appends(study._storage)  # type: ignore[arg-type]

    _records.set_trial_attrs(
        trial, user={"changed": "new", "added": [1, 2]}, system={"layout": "dp1xpp1", "g": 2}
    )

    assert appends.calls == 1
    frozen = _study(journal_url).trials[0]  # another reader of the journal
    assert frozen.user_attrs == {"kept": 1, "changed": "new", "added": [1, 2]}
    assert frozen.system_attrs["layout"] == "dp1xpp1" and frozen.system_attrs["g"] == 2

    study.tell(trial, 1.0)
    with pytest.raises(UpdateFinishedTrialError):
        _records.set_trial_attrs(trial, user={"late": 1}, system={"late": 2})
    assert appends.calls == 2  # the tell; nothing for the finished trial
    study.ask()  # the storage reads on without an error
    assert "late" not in study.trials[0].user_attrs
