"""The leader's queue: every storage call its threads make goes through one ``StudyCalls``
(the door a retry policy wraps), from the ask to the tell and the checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
import threading
from typing import Any

import optuna
import pytest

from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.run import _calls
from optuna_hpcnas.run import _study
from optuna_hpcnas.run import run_search
from tests.run_configs import tiny_config


def test_every_storage_call_of_the_leaders_threads_goes_through_study_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside = threading.local()
    through: list[str] = []  # what went through StudyCalls._call
    around: list[str] = []  # storage methods a storage thread called outside it

    def call(self: _calls.StudyCalls, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        through.append(getattr(fn, "__qualname__", type(fn).__name__))
        depth = getattr(inside, "depth", 0)
        inside.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            inside.depth = depth

    def watched(url: str, config: Any) -> Any:
        storage = opened(url, config)
        for name in dir(optuna.storages.BaseStorage):
            method = getattr(storage, name)
            if name.startswith("_") or not callable(method):
                continue

            def wrapper(*args: Any, _method: Any = method, _name: str = name, **kw: Any) -> Any:
                thread = threading.current_thread().name
                if thread.startswith("hpcnas-storage") and not getattr(inside, "depth", 0):
                    around.append(_name)
                return _method(*args, **kw)

            setattr(storage, name, wrapper)
        return storage

    opened = _study._storage
    monkeypatch.setattr(_calls.StudyCalls, "_call", call)
    monkeypatch.setattr(_study, "_storage", watched)
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    sections = {
        "study": {"name": "queue", "storage": url, "n_trials": 4},
        "checkpoints": {"enabled": True},
        "distributed": {"ask_ahead": "on"},
        "objective": {"population_steps": 1, "population_size": 2},
    }
    run_search(config_from_dict(tiny_config(**sections)))
    study = optuna.load_study(study_name="queue", storage=url)
    assert len(study.get_trials()) == 4 and all(t.state.is_finished() for t in study.trials)
    assert not around, sorted(set(around))
    for name in (
        "recover_dead_trials",  # the sweep
        "PopClaim",  # the budget trial
        "ExitStack.enter_context",  # its heartbeat
        "suggest_architecture",  # the sampler, its parameters and the architecture record
        "TrialPlan.for_study",
        "finished_architectures",  # the population
        "report_round",  # a report and the pruner's verdict
        "set_trial_attrs",
        "TellOnce",
        "CheckpointManager.save",  # the supernet checkpoints
        "store_utilisation",
    ):
        assert any(name in qualname for qualname in through), (name, sorted(set(through)))


@pytest.mark.parametrize("ask_ahead", ["on", "auto"])
def test_a_leader_asking_ahead_asks_for_its_first_trial_during_the_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ask_ahead: str
) -> None:
    """Asking ahead, the first ask (pop and sampler) runs on the ask thread while the
    supernet warms up, so the loop's first trial does not wait for it. One process asking in
    the loop (``auto``: where the Python API asks) has asked nothing by then."""
    from optuna_hpcnas.run import _search

    asked = threading.Event()
    seen: list[bool] = []
    suggest = _calls.StudyCalls.suggest
    warm_up = _search._warm_up

    def suggesting(self: _calls.StudyCalls, *args: Any) -> Any:
        asked.set()
        return suggest(self, *args)

    def warming_up(*args: Any) -> None:
        # a fake slow warm-up: it ends once the ask is done (or, not asking, at once)
        seen.append(asked.wait(timeout=60) if ask_ahead == "on" else asked.is_set())
        warm_up(*args)

    monkeypatch.setattr(_calls.StudyCalls, "suggest", suggesting)
    monkeypatch.setattr(_search, "_warm_up", warming_up)
    url = f"sqlite:///{tmp_path / 'ahead.db'}"
    sections = {
        "study": {"name": "ahead", "storage": url, "n_trials": 2},
        "distributed": {"ask_ahead": ask_ahead},
    }
    run_search(config_from_dict(tiny_config(**sections)))
    assert seen == [ask_ahead == "on"]
    study = optuna.load_study(study_name="ahead", storage=url)
    assert [t.state.is_finished() for t in study.get_trials()] == [True, True]


def test_the_trial_plan_is_read_from_the_storage_once_per_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    config = config_from_dict(tiny_config(study={"name": "plan", "storage": url, "n_trials": 1}))
    study = optuna.create_study(study_name="plan", storage=url, direction="maximize")
    reads: list[str] = []
    calls = _calls.StudyCalls(study, config)
    real = calls.window.call

    def counted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        reads.append(getattr(fn, "__qualname__", ""))
        return real(fn, *args, **kwargs)

    calls.window.call = counted  # type: ignore[method-assign]
    first, second = calls.plan(), calls.plan()
    assert first is second and first.maximize and first.report
    assert reads == ["TrialPlan.for_study"]  # the directions never change: one round trip
