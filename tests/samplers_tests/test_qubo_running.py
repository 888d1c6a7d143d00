"""QUBOSampler with RUNNING trials: ``fantasize_running`` fits the objective surrogate and the
feasibility model as if each running trial had returned their prediction for it."""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.samplers import QUBOSampler
from qubo import BayesianPosterior
from qubo import BayesianQuadratic
from qubo import QuadraticModel
from qubo import Surrogate

optuna.logging.set_verbosity(optuna.logging.WARNING)

NAMES = [f"x{i}" for i in range(4)]
_RNG = np.random.default_rng(5)
VALUE = _RNG.normal(size=(len(NAMES), 4))
COST = _RNG.uniform(1.0, 10.0, (len(NAMES), 4))
LIMIT = 20.0
N_COMPLETE = 10


def _code(params: dict[str, Any]) -> np.ndarray:
    return np.array([params[n] for n in NAMES])


def _objective(trial: optuna.Trial) -> float:
    code = _code({n: trial.suggest_int(n, 0, 3) for n in NAMES})
    return float(VALUE[np.arange(len(NAMES)), code].sum())


def _constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
    code = _code(trial.params)
    return [float(COST[np.arange(len(NAMES)), code].sum()) - LIMIT]


class _RecordingSurrogate(Surrogate):
    """A least-squares linear model that records the data of every draw."""

    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def draw(
        self, bits: np.ndarray, values: np.ndarray, rng: np.random.Generator
    ) -> QuadraticModel:
        x, y = np.asarray(bits, dtype=float), np.asarray(values, dtype=float)
        self.calls.append((x, y))
        linear = np.linalg.lstsq(x, y - y.mean(), rcond=None)[0]
        return QuadraticModel(linear, np.zeros((x.shape[1], x.shape[1])))


class _RecordingFeasibility(BayesianQuadratic):
    """The sampler's feasibility model, recording the data of every fit."""

    def __init__(self) -> None:
        super().__init__(exploration=0.0)
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def fit(self, bits: np.ndarray, values: np.ndarray) -> BayesianPosterior:
        self.calls.append((np.asarray(bits, dtype=float), np.asarray(values, dtype=float)))
        return super().fit(bits, values)


def _sampler(**kwargs: Any) -> QUBOSampler:
    return QUBOSampler(seed=0, n_startup_trials=4, num_reads=8, **kwargs)


def _study(sampler: QUBOSampler) -> optuna.Study:
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective, n_trials=N_COMPLETE)
    return study


def _ask(study: optuna.Study) -> optuna.Trial:
    trial = study.ask()
    for name in NAMES:
        trial.suggest_int(name, 0, 3)
    return trial


@pytest.mark.parametrize("surrogate", ["bayes", "fm"])
def test_without_running_trials_the_option_changes_nothing(surrogate: str) -> None:
    runs = []
    for fantasize in (True, False):
        sampler = _sampler(
            surrogate=surrogate, constraints_func=_constraints, fantasize_running=fantasize
        )
        study = optuna.create_study(sampler=sampler)
        study.optimize(_objective, n_trials=16)
        runs.append([t.params for t in study.trials])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("fantasize", [True, False])
def test_the_surrogate_sees_each_running_trial_at_its_prediction(fantasize: bool) -> None:
    recorder = _RecordingSurrogate()
    study = _study(_sampler(surrogate=recorder, fantasize_running=fantasize))
    first, second = _ask(study), _ask(study)  # both RUNNING
    recorder.calls.clear()
    third = _ask(study)
    x, y = recorder.calls[-1]
    info = study._storage.get_trial_system_attrs(third._trial_id)[_keys.QUBO_INFO]
    if not fantasize:
        assert len(recorder.calls) == 1 and len(x) == N_COMPLETE
        assert "n_fantasies" not in info
        return
    assert len(x) == N_COMPLETE + 2 and info["n_fantasies"] == 2
    assert not np.array_equal(x[-2], x[-1])
    assert not any(np.array_equal(row, other) for row in x[-2:] for other in x[:-2])
    # Believed at what the first draw (on the complete trials alone) predicted for them.
    x0, y0 = recorder.calls[0]
    assert len(x0) == N_COMPLETE
    guess = np.linalg.lstsq(x0, y0 - y0.mean(), rcond=None)[0] @ x[-2:].T
    np.testing.assert_allclose(y[-2:], y0.mean() + y0.std() * guess)
    assert {first.number, second.number} == {N_COMPLETE, N_COMPLETE + 1}


def test_the_feasibility_model_counts_the_running_trial() -> None:
    sampler = _sampler(constraints_func=_constraints, fantasize_running=True)
    feasibility = _RecordingFeasibility()
    sampler._feasibility = feasibility
    study = _study(sampler)
    assert len(feasibility.calls[-1][0]) == N_COMPLETE - 1  # the asking trial is not complete
    _ask(study)
    feasibility.calls.clear()
    _ask(study)
    before, after = feasibility.calls  # the fit for the prediction, then the believed one
    assert len(before[0]) == N_COMPLETE and len(after[0]) == N_COMPLETE + 1
    np.testing.assert_array_equal(after[0][:-1], before[0])
    # The running code is believed at the model's prediction, on the target's scale.
    guess = BayesianQuadratic(exploration=0.0).fit(*before).predict(after[0][-1:])[0]
    target = np.append(before[1], guess)
    np.testing.assert_allclose(after[1], (target - target.mean()) / target.std())


def test_a_running_trial_changes_the_next_proposal() -> None:
    proposals = []
    for fantasize in (True, False):
        sampler = QUBOSampler(
            seed=0, n_startup_trials=4, constraints_func=_constraints, fantasize_running=fantasize
        )
        study = _study(sampler)
        asked = [_ask(study) for _ in range(6)]
        proposals.append([t.params for t in asked])
    assert proposals[0][0] == proposals[1][0]  # nothing was running at the first ask
    assert proposals[0] != proposals[1]


def test_fantasize_running_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="fantasize_running"):
        QUBOSampler(fantasize_running=1)  # type: ignore[arg-type]


def test_a_constant_feasibility_target_with_running_trials_keeps_a_finite_threshold() -> None:
    sampler = QUBOSampler(fantasize_running=True)
    codes = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]], dtype=float)
    running = np.array([[0, 0, 1]], dtype=float)
    model, threshold = sampler._draw_feasibility(codes, running, (np.arange(3), np.zeros(3), 0.0))
    assert model is not None and np.isfinite(threshold)
