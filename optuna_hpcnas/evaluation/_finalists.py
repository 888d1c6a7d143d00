"""One-shot mode's last step: the best candidates scored by inherited weights alone go again
through the stages, as new trials of the same study (finalists)."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas._pareto import ranked
from optuna_hpcnas._validation import check_int


def _inherited(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The complete trials scored by inherited weights alone (one-shot mode)."""
    return [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) == "inherited"
    ]


def enqueue_finalists(study: optuna.Study, n: int) -> list[int]:
    """Queue the ``n`` best inherited trials of a one-shot study again, as finalists that go
    through the stages; returns the numbers of the inherited trials queued.

    An architecture already trained (a published model, an earlier finalist) or already
    queued is not queued twice. Several objectives: the best fronts first.

    Examples:
        >>> import optuna
        >>> from optuna.distributions import FloatDistribution
        >>> study = optuna.create_study(direction="maximize")
        >>> for x in (0.2, 0.9, 0.5):  # three candidates scored by inherited weights
        ...     study.add_trial(optuna.trial.create_trial(
        ...         params={"x": x}, distributions={"x": FloatDistribution(0, 1)}, value=x,
        ...         user_attrs={"fidelity": "inherited"}))
        >>> enqueue_finalists(study, 2)  # trials 1 (0.9) and 2 (0.5) go through the stages
        [1, 2]
    """
    check_int("n", n, 0)
    chosen = choose_finalists(study, n)
    for trial in chosen:
        study.enqueue_trial(trial.params, user_attrs={_keys.OBJECTIVE_FINALIST_OF: trial.number})
    return [t.number for t in chosen]


def choose_finalists(study: optuna.Study, n: int) -> list[FrozenTrial]:
    """The ``n`` best inherited trials whose architecture is not trained, in training or
    queued with its parameters already (best first; several objectives: front by front)."""
    trials = study.get_trials(deepcopy=False)  # one read for both
    seen = set()
    for t in trials:
        if t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) == "inherited":
            continue
        params = t.params or t.system_attrs.get("fixed_params", {})
        if params:
            seen.add(tuple(sorted(params.items())))
    chosen: list[FrozenTrial] = []
    for trial in ranked(_inherited(trials), study.directions):
        if len(chosen) == n:
            break
        key = tuple(sorted(trial.params.items()))
        if key not in seen:
            seen.add(key)
            chosen.append(trial)
    return chosen
