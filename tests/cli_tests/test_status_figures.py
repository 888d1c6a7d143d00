"""``hpcnas status``'s throughput figures count evaluation time, not time spent asked ahead."""

from __future__ import annotations

import datetime

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas._summary import study_status


def test_a_trial_asked_ahead_counts_its_evaluation_only() -> None:
    t0 = datetime.datetime(2026, 1, 1, 12, 0, 0)
    study = optuna.create_study()

    def add(start_s: float, end_s: float, system: dict[str, object]) -> None:
        study.add_trial(
            optuna.trial.FrozenTrial(
                number=0,  # renumbered by add_trial
                state=TrialState.COMPLETE,
                value=0.5,
                datetime_start=t0 + datetime.timedelta(seconds=start_s),
                datetime_complete=t0 + datetime.timedelta(seconds=end_s),
                params={"x": 0.1},
                distributions={"x": FloatDistribution(0, 1)},
                user_attrs={},
                system_attrs=system,
                intermediate_values={},
                trial_id=0,
            )
        )

    # asked at 0 while the trial before it trained, evaluated from 10 to 20
    add(0, 20, {_keys.DISTRIBUTED_EVALUATION_SECONDS: 10.0})
    add(10, 20, {})  # no record (Python API, older runs): Optuna's clock
    status = study_status(study)
    assert status["elapsed_seconds"] == 20.0
    assert status["mean_evaluation_seconds"] == 10.0
    assert status["mean_concurrency"] == 1.0  # not 1.5
