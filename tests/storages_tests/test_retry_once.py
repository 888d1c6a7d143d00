"""Issue 23 item 7: a dead trial gets exactly one retry, whoever sweeps it and however often
(concurrent threads and processes, a sweeper killed half-way, resumes that sweep again)."""

from __future__ import annotations

from collections import Counter
import os
from pathlib import Path
import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import recover_expired_trials

from .conftest import backend_url
from .conftest import sweep_in_threads

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
ROOT = Path(__file__).resolve().parents[2]
_X = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)]
N_DEAD = 4

# A sweeper process: once every sweeper is connected, sweeps the study for half a second.
_SWEEPER = """
import os, sys, time
from pathlib import Path
import optuna
from optuna_hpcnas.storages import open_storage, recover_expired_trials
optuna.logging.set_verbosity(optuna.logging.ERROR)
url, ready, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
storage = open_storage(url, heartbeat_interval=1, grace_period=2)
study = optuna.load_study(study_name="once", storage=storage)
(ready / str(os.getpid())).touch()
while len(list(ready.iterdir())) < n:  # every sweeper connected: they start together
    time.sleep(0.002)
won = []
end = time.time() + 0.5
while time.time() < end:
    won += recover_expired_trials(study, grace_period=0.5, max_retry=3)
print(" ".join(map(str, won)))
"""


def _dead_study(url: str) -> optuna.Study:
    """``N_DEAD`` RUNNING trials of dead workers: half with a heartbeat that stopped, half
    killed before their first heartbeat."""
    study = optuna.create_study(
        storage=open_storage(url, heartbeat_interval=1, grace_period=2), study_name="once"
    )
    for i in range(N_DEAD):
        trial = study.ask(_X)
        if i % 2 == 0:
            study._storage.record_heartbeat(trial._trial_id)
    # past the heartbeat grace (2 s; SQLite's clock counts whole seconds) and the lease's
    time.sleep(3.2)
    return study


def _retries(study: optuna.Study) -> Counter[int]:
    """Retry trials per retried trial (the last of each one's ``retry_history``)."""
    out: Counter[int] = Counter()
    for t in study.get_trials(deepcopy=False):
        history = t.system_attrs.get("retry_history")
        if history:
            out[history[-1]] += 1
    return out


def _assert_each_retried_once(study: optuna.Study) -> None:
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials[:N_DEAD]] == [TrialState.FAIL] * N_DEAD
    assert [t.state for t in trials[N_DEAD:]] == [TrialState.WAITING] * N_DEAD
    assert _retries(study) == Counter(range(N_DEAD))
    for t in trials[:N_DEAD]:  # the retry is recorded in the original
        retry = trials[t.system_attrs[_keys.STORAGES_RETRY]]
        assert retry.system_attrs["retry_history"] == [t.number]
        assert _keys.STORAGES_RETRY not in retry.system_attrs


@pytest.mark.parametrize("kind", _BACKENDS)
def test_concurrent_sweeper_processes_retry_each_dead_trial_once(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    url = backend_url(request, kind, tmp_path)
    study = _dead_study(url)
    ready = tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SWEEPER, url, str(ready), "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    won: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        won += [int(n) for n in out.split()]
    assert sorted(won) == list(range(N_DEAD))  # each failed by one sweeper
    _assert_each_retried_once(study)


@pytest.mark.parametrize("kind", _BACKENDS)
def test_concurrent_sweeper_threads_and_later_resumes_retry_once(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    url = backend_url(request, kind, tmp_path)
    study = _dead_study(url)
    sweepers = [
        optuna.load_study(
            study_name="once", storage=open_storage(url, heartbeat_interval=1, grace_period=2)
        )
        for _ in range(4)
    ]

    def sweep(s: optuna.Study) -> list[int]:  # three sweeps each
        return [
            n for _ in range(3) for n in recover_expired_trials(s, grace_period=0.5, max_retry=3)
        ]

    assert sorted(sweep_in_threads(sweepers, sweep)) == list(range(N_DEAD))
    # every resume sweeps again: nothing new
    for _ in range(2):
        assert recover_expired_trials(study, grace_period=0.5, max_retry=3) == []
    _assert_each_retried_once(study)


def test_a_sweeper_killed_half_way_leaves_the_trial_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure, the retry and its record are one transaction: a sweeper that dies after
    adding the retry rolls back all of it, and the next sweep retries the trial once."""
    from optuna.storages import RDBStorage

    url = f"sqlite:///{tmp_path / 'half.db'}"
    study = _dead_study(url)
    prepared = RDBStorage._get_prepared_new_trial

    def dies_after_adding(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        prepared(self, *args, **kwargs)
        raise KeyboardInterrupt  # the process going away mid-transaction

    with monkeypatch.context() as m:
        m.setattr(RDBStorage, "_get_prepared_new_trial", dies_after_adding)
        with pytest.raises(KeyboardInterrupt):
            recover_expired_trials(study, grace_period=0.5, max_retry=3)
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING] * N_DEAD
    assert sorted(recover_expired_trials(study, grace_period=0.5, max_retry=3)) == list(
        range(N_DEAD)
    )
    _assert_each_retried_once(study)


def test_a_retry_that_dies_is_retried_once_and_max_retry_ends_the_chain(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chain.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="chain")
    study.ask(_X)
    time.sleep(0.6)
    assert recover_expired_trials(study, grace_period=0.5, max_retry=1) == [0]
    retry = _records.pop_waiting_trial(study)  # the retry, taken and killed again
    assert retry is not None and retry.number == 1
    time.sleep(0.6)
    assert recover_expired_trials(study, grace_period=0.5, max_retry=1) == [1]
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert trials[0].system_attrs[_keys.STORAGES_RETRY] == 1
    assert trials[1].system_attrs[_keys.STORAGES_RETRY] is None  # max_retry=1 reached
    assert trials[1].system_attrs["retry_history"] == [0]
