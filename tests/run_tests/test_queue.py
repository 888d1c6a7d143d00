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
        "report_epoch",  # a report and the pruner's verdict
        "set_trial_attrs",
        "TellOnce",
        "CheckpointManager.save",  # the supernet checkpoints
        "store_utilisation",
    ):
        assert any(name in qualname for qualname in through), (name, sorted(set(through)))
