"""One-shot mode under ``hpcnas run``: the budget's last trials (or, with a timeout, the trials
of its last share) become finalists, the best inherited candidates trained through the stages.

A leader decides when it pops a budget trial, before the sampler runs: the trial gets the
parameters of the best inherited trial not trained yet, and the ``finalist_of`` attribute the
plan reads (``TrialPlan.for_trial``). Two leaders that pick the same architecture at the same
moment see each other when they read back: the higher trial number chooses again. Only a
leader whose read back came before the other's write keeps a duplicate (it is then trained
twice; nothing is lost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna_hpcnas import _keys

if TYPE_CHECKING:
    import optuna


def turn_into_finalist(
    study: optuna.Study, trial: optuna.Trial, *, finalists: int, budget: bool, late: bool
) -> int | None:
    """Make the trial just taken a finalist when its turn has come: it is one of the last
    ``finalists`` trials of the budget (``budget``: the run has ``n_trials``), or ``late``
    (the timeout's share for finalists has begun), and fewer than ``finalists`` have started.
    Returns the number of the inherited trial it repeats, or ``None``."""
    from optuna.trial import TrialState

    from optuna_hpcnas.evaluation import choose_finalists

    storage, trial_id = trial.storage, trial._trial_id
    if _keys.OBJECTIVE_REFERENCE in trial.user_attrs:
        return None  # a published model keeps its place
    # most takes are not a finalist's turn: decide that on the smallest reads first
    waiting = 0
    if not late:
        if not budget:
            return None
        waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        if waiting >= finalists:
            return None
    started = sum(
        _keys.OBJECTIVE_FINALIST_OF in t.user_attrs for t in study.get_trials(deepcopy=False)
    )
    if started >= finalists or (not late and waiting >= finalists - started):
        return None
    if storage.get_trial_system_attrs(trial_id).get("fixed_params"):
        return None  # a trial queued with its parameters (a retry, an enqueued one)
    for _ in range(finalists):
        chosen = choose_finalists(study, 1)
        if not chosen:
            return None
        number = chosen[0].number
        params = dict(chosen[0].params)
        storage.set_trial_system_attr(trial_id, "fixed_params", params)
        # Optuna reads a trial's fixed parameters when the Trial object is built; this one
        # gets them after its pop (no public call sets them on a trial already taken).
        trial._fixed_params = params
        trial.set_user_attr(_keys.OBJECTIVE_FINALIST_OF, number)
        # two leaders at the same moment: the lower trial number keeps the choice, the other
        # chooses again (the first's parameters now count as taken)
        clash = any(
            t.number < trial.number and t.user_attrs.get(_keys.OBJECTIVE_FINALIST_OF) == number
            for t in study.get_trials(deepcopy=False)
        )
        if not clash:
            return number
    return number
