"""Load test at a reduced size on every shared backend (bench/storage_load.py: full size)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.testing.storages import architecture_score
from optuna_hpcnas.testing.storages import check_load_study
from optuna_hpcnas.testing.storages import run_load_test

from .conftest import backend_url


@pytest.mark.parametrize(
    ("kind", "sampler"),
    [
        ("journal-file", "evolutionary"),
        ("journal-file", "qubo"),
        pytest.param("journal-redis", "evolutionary", marks=pytest.mark.services),
        ("grpc", "evolutionary"),
        pytest.param("postgresql", "evolutionary", marks=pytest.mark.services),
        pytest.param("mysql", "evolutionary", marks=pytest.mark.services),
    ],
)
def test_workers_lose_and_repeat_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, sampler: str
) -> None:
    url = backend_url(request, kind, tmp_path)
    # Past the samplers' random start (10 and 5 trials), so bred and solver-made proposals
    # are claimed too; QUBOSampler's solver is the slow part.
    n_workers, n_trials = (4, 8) if sampler == "evolutionary" else (2, 6)
    result = run_load_test(
        url, sampler=sampler, n_workers=n_workers, n_trials=n_trials, timeout=300
    )
    n = n_workers * n_trials
    assert result.problems == ()
    assert result.states == {"COMPLETE": n}
    # 1,536 architectures: none may be evaluated twice, whichever worker proposed it.
    assert result.repeated_architectures == 0
    assert result.n_unique_architectures == n


def _add(
    study: optuna.Study, space: HierarchicalSearchSpace, number: int, **changes: object
) -> None:
    arch = space.sample(np.random.default_rng(number))
    value = architecture_score(arch)
    attrs = {
        _keys.OBJECTIVE_ARCH: arch.to_json(),
        _keys.LOADTEST_WORKER: 0,
        _keys.LOADTEST_NUMBER: number,
    }
    attrs.update(changes.pop("user_attrs", {}))  # type: ignore[call-overload]
    trial = optuna.trial.create_trial(
        params=space.to_params(arch),
        distributions={k: space.distributions()[k] for k in space.to_params(arch)},
        value=changes.pop("value", value),
        intermediate_values=changes.pop("intermediate_values", {0: value}),
        user_attrs=attrs,
    )
    study.add_trial(trial)


def test_the_check_finds_each_kind_of_damage() -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    study = optuna.create_study(direction="maximize")
    _add(study, space, 0)
    _add(study, space, 1, value=0.5)
    _add(study, space, 2, intermediate_values={})
    _add(study, space, 3, user_attrs={_keys.LOADTEST_NUMBER: 7})
    _add(study, space, 4, user_attrs={_keys.OBJECTIVE_ARCH: "{}"})
    _add(study, space, 5, user_attrs={_keys.OBJECTIVE_ARCH: "{}"})
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    check = check_load_study(study, n_workers=1, n_trials=6)
    text = "\n".join(check.problems)
    assert "expected 6 COMPLETE trials" in text
    assert "trial 1: value 0.5 is not the score" in text
    assert "trial 2: intermediate values {} differ" in text
    assert "trial 3: ran as number 7, stored as 3" in text
    assert "trial 4: stored architecture differs" in text
    assert "trials per worker differ from 6" in text
    clean = optuna.create_study(direction="maximize")
    for n in range(3):
        _add(clean, space, n)
    _add(clean, space, 3, user_attrs={})
    same_arch = clean.trials[0]
    clean.add_trial(
        optuna.trial.create_trial(
            params=same_arch.params,
            distributions=same_arch.distributions,
            value=same_arch.value,
            intermediate_values=same_arch.intermediate_values,
            user_attrs={**same_arch.user_attrs, _keys.LOADTEST_NUMBER: 4},
        )
    )
    check = check_load_study(clean, n_workers=1, n_trials=5)
    assert check.problems == ()
    assert (check.repeated, check.n_unique) == (1, 4)
