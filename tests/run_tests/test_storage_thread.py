"""The leader's storage thread: order, errors, and where its time is counted."""

from __future__ import annotations

import logging
from pathlib import Path
import threading
import time

import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.distributed import UtilisationTracker
from optuna_hpcnas.run._storage_thread import StorageThread


def test_calls_run_in_order_on_one_other_thread() -> None:
    tracker = UtilisationTracker()
    thread = StorageThread(tracker)
    seen: list[tuple[int, str]] = []

    def call(i: int) -> int:
        time.sleep(0.01 * (3 - i))  # the first call is the slowest
        seen.append((i, threading.current_thread().name))
        return i

    futures = [thread.submit(call, i) for i in range(3)]
    assert thread.wait(futures[-1]) == 2
    assert [i for i, _ in seen] == [0, 1, 2]
    assert len({name for _, name in seen}) == 1 and seen[0][1].startswith("hpcnas-storage")
    assert tracker.seconds["storage"] > 0.04  # the main thread's wait, not the calls
    thread.close()


def test_an_error_is_raised_once_where_it_is_waited_for_or_checked() -> None:
    thread = StorageThread(UtilisationTracker())

    def fail() -> None:
        raise RuntimeError("storage unreachable")

    failed = thread.submit(fail)
    with pytest.raises(RuntimeError, match="unreachable"):
        thread.wait(failed)
    thread.check()  # already raised by the wait: not again
    thread.submit(fail)
    with pytest.raises(RuntimeError, match="unreachable"):
        thread.drain()
    thread.drain()
    thread.close()


def test_close_finishes_queued_calls_and_logs_their_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    thread = StorageThread(UtilisationTracker())
    done: list[int] = []
    thread.submit(lambda: (time.sleep(0.05), done.append(1)))
    thread.submit(lambda: 1 / 0)
    with caplog.at_level(logging.ERROR):
        thread.close()
    assert done == [1]
    assert "ZeroDivisionError" in caplog.text


def test_drain_is_counted_as_drain_outside_the_loop_window() -> None:
    tracker = UtilisationTracker()
    thread = StorageThread(tracker)
    with tracker.loop():
        with tracker.track("compute"):
            time.sleep(0.5)  # long beside the loop's own bookkeeping, even on a loaded machine
        thread.submit(time.sleep, 0.05)
    thread.drain()
    report = tracker.report()
    assert report.loop_shares is not None and report.loop_shares["drain"] == 0.0
    assert report.loop_shares["compute"] > 0.9
    assert report.shares["drain"] > 0 and report.compute_share == report.loop_shares["compute"]
    thread.close()


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_trial_given_back_keeps_its_parameters(tmp_path: Path, kind: str) -> None:
    from optuna_hpcnas import HierarchicalSearchSpace

    storage: optuna.storages.BaseStorage
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'q.db'}"
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)
    else:
        backend = optuna.storages.journal.JournalFileBackend(str(tmp_path / "q.log"))
        storage = optuna.storages.JournalStorage(backend)
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(seed=1))
    _records.add_budget(study, 1)
    space = HierarchicalSearchSpace.preset("digits-small")
    trial = _records.pop_waiting_trial(study)
    assert trial is not None
    arch = space.suggest(trial)
    if kind == "sqlite":
        storage.record_heartbeat(trial._trial_id)  # type: ignore[attr-defined]
        time.sleep(2.2)  # the heartbeat is stale now (SQLite keeps whole seconds)
    assert _records.return_to_queue(trial)
    (waiting,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting.number == trial.number
    again = _records.pop_waiting_trial(study)
    assert again is not None and again.number == trial.number
    # its old heartbeat went with the give-back: a sweep does not take it for a dead one
    optuna.storages.fail_stale_trials(study)
    assert study.get_trials()[0].state == optuna.trial.TrialState.RUNNING
    assert space.suggest(again) == arch  # the same architecture, not a new draw
    study.tell(again, 0.5)
    assert not _records.return_to_queue(again)  # finished: left alone


@pytest.mark.parametrize("kind", ["sqlite", "journal", "memory"])
def test_attributes_in_one_write_are_read_back_and_refused_once_finished(
    tmp_path: Path, kind: str
) -> None:
    from optuna.exceptions import UpdateFinishedTrialError

    storage: str | optuna.storages.BaseStorage | None = None
    if kind == "sqlite":
        storage = f"sqlite:///{tmp_path / 'a.db'}"
    elif kind == "journal":
        backend = optuna.storages.journal.JournalFileBackend(str(tmp_path / "a.log"))
        storage = optuna.storages.JournalStorage(backend)
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    trial.set_user_attr("kept", 1)
    _records.set_trial_attrs(trial, user={"flops": 2.5, "kept": 3}, system={"g": [1, 2]})
    assert trial.user_attrs == {"kept": 3, "flops": 2.5}  # the trial's own view too
    study.tell(trial, 1.0)
    (frozen,) = study.get_trials()
    assert frozen.user_attrs == {"kept": 3, "flops": 2.5} and frozen.system_attrs["g"] == [1, 2]
    with pytest.raises(UpdateFinishedTrialError):
        _records.set_trial_attrs(trial, user={"late": 1}, system={})


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_an_ask_writes_its_parameters_and_architecture_at_once(tmp_path: Path, kind: str) -> None:
    """``_records.suggest_architecture`` stores what ``space.suggest`` and
    ``record_architecture`` store, in one transaction on an RDB storage."""
    import sqlalchemy

    from optuna_hpcnas import HierarchicalSearchSpace

    space = HierarchicalSearchSpace.preset("digits-small")
    stored = []
    for batched in (False, True):
        storage: optuna.storages.BaseStorage
        if kind == "sqlite":
            storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / f'{batched}.db'}")
        else:
            path = str(tmp_path / f"{batched}.log")
            storage = optuna.storages.JournalStorage(
                optuna.storages.journal.JournalFileBackend(path)
            )
        study = optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(3))
        begins: list[int] = []
        if kind == "sqlite":
            engine = storage.engine  # type: ignore[attr-defined]
            sqlalchemy.event.listen(engine, "begin", lambda conn, b=begins: b.append(1))
        trial = study.ask()
        begins.clear()
        if batched:
            arch = _records.suggest_architecture(space, trial)
        else:
            arch = space.suggest(trial)
            _records.record_architecture(trial, arch)
        study.tell(trial, 0.5)
        (frozen,) = study.get_trials()
        stored.append((arch, frozen.params, frozen.distributions, frozen.user_attrs, len(begins)))
    (arch, params, dists, attrs, plain), (arch2, params2, dists2, attrs2, once) = stored
    assert (arch, params, dists, attrs) == (arch2, params2, dists2, attrs2)
    assert attrs[_keys.OBJECTIVE_ARCH] == arch.to_json() and len(params) > 5
    if kind == "sqlite":
        assert once <= plain - (len(params) - 1), (plain, once)
