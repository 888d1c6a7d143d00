"""What a study's records say, as ``hpcnas status``, ``hpcnas best`` and the end of
``hpcnas run`` print them: trials by state, throughput, the best trials, each trial's
architecture in one line, and the trial an export trains when none is named."""

from __future__ import annotations

import json
import math
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.search_space import Architecture


def trial_architecture(study: optuna.Study, trial: FrozenTrial) -> Architecture | None:
    """The architecture of ``trial``: the one it recorded, else its parameters read by the
    search space the study recorded (``None`` when neither is there)."""
    from optuna_hpcnas._records import architecture_of
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

    arch = architecture_of(trial.user_attrs)
    if arch is not None:
        return arch
    space = HierarchicalSearchSpace.from_study(study)
    if space is None:
        return None
    try:
        return space.from_params(trial.params)
    except ValueError:
        return None


def describe_trial(study: optuna.Study, trial: FrozenTrial) -> str:
    """``trial``'s architecture in one line (its parameters as JSON without one)."""
    from optuna_hpcnas._records import summary_of

    summary = summary_of(trial.user_attrs)
    if summary is not None:
        return summary
    arch = trial_architecture(study, trial)
    return arch.describe() if arch is not None else json.dumps(trial.params, sort_keys=True)


def metric_names(study: optuna.Study) -> list[str]:
    """The study's metric names, else Optuna's defaults (``value``, ``values_<i>``)."""
    names = study.metric_names
    if names:
        return list(names)
    n = len(study.directions)
    return ["value"] if n == 1 else [f"values_{i}" for i in range(n)]


def study_status(study: optuna.Study) -> dict[str, Any]:
    """The facts ``hpcnas status`` prints, as a dict (``--json``)."""
    from optuna.trial import TrialState

    from optuna_hpcnas._records import compute_shares

    trials = study.get_trials(deepcopy=False)
    by_state = {s.name: 0 for s in TrialState}
    for t in trials:
        by_state[t.state.name] += 1
    finished = [t for t in trials if t.state.is_finished()]
    # the runner queues its whole budget as WAITING trials
    target = len(trials) if by_state["WAITING"] else None
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in finished if t.datetime_complete is not None]
    durations = [d for d in map(evaluation_seconds, finished) if d is not None]
    out: dict[str, Any] = {
        "study": study.study_name,
        "directions": [d.name.lower() for d in study.directions],
        "metric_names": metric_names(study),
        "trials": len(trials),
        "by_state": by_state,
        "target_trials": target,
        "progress": (len(finished) / target) if isinstance(target, int) and target else None,
    }
    if starts:
        first = min(starts)
        last = max(ends) if ends else max(starts)
        elapsed = (last - first).total_seconds()
        out["first_start"] = first.isoformat(timespec="seconds")
        out["last_finish"] = last.isoformat(timespec="seconds") if ends else None
        out["elapsed_seconds"] = elapsed
        # Busy time over wall time: how many evaluations ran at once, on average.
        out["mean_concurrency"] = (sum(durations) / elapsed) if elapsed > 0 else None
        out["trials_per_minute"] = (len(finished) / elapsed * 60) if elapsed > 0 else None
        out["mean_evaluation_seconds"] = (sum(durations) / len(durations)) if durations else None
    shares = compute_shares(study)  # the last run's per-rank share of its loop computing
    if shares:
        out["utilisation"] = {str(rank): share for rank, share in shares.items()}
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    if completed:
        if len(study.directions) == 1:
            best = study.best_trial
            out["best"] = {
                "trial": best.number,
                "values": best.values,
                "architecture": describe_trial(study, best),
            }
        else:
            out["pareto_front_trials"] = len(study.best_trials)
    return out


def evaluation_seconds(trial: FrozenTrial) -> float | None:
    """How long ``trial`` was evaluated: the runner's record where it wrote one (a trial asked
    ahead is RUNNING from its ask, while the trial before it still trains), else Optuna's
    ``datetime_complete - datetime_start``; ``None`` when unknown."""
    recorded = trial.system_attrs.get(_keys.DISTRIBUTED_EVALUATION_SECONDS)
    if isinstance(recorded, (int, float)) and not isinstance(recorded, bool):
        return float(recorded)
    if trial.datetime_start is None or trial.datetime_complete is None:
        return None
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def trained_only(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that compete for the export. In a one-shot study, values by inherited
    weights and values after the stages are not on one scale: the trained trials (finalists
    and published models) when any was trained, else the inherited ones (a run that ended
    before it trained any: the search's own ranking)."""
    inherited = [t for t in trials if t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) == "inherited"]
    if not inherited:
        return trials
    trained = [t for t in trials if t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) != "inherited"]
    return trained or inherited


def completed_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The complete trials that compete for the export (``trained_only``)."""
    from optuna.trial import TrialState

    return trained_only(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def best_trials(study: optuna.Study, *, top: int) -> list[FrozenTrial]:
    """Top ``top`` completed trials (single objective) or the Pareto front (several); in a
    one-shot study, the trained trials when there are any."""
    from optuna.study import StudyDirection

    if len(study.directions) > 1:
        from optuna_hpcnas._pareto import fronts

        front = list(study.best_trials)  # feasible ones, where constraints were set
        pool = completed_trials(study)
        if any(t not in pool for t in front):  # a one-shot study: the trained trials' front
            front = fronts(pool, study.directions)[0]
        return sorted(
            front,
            key=lambda t: t.values[0],
            reverse=study.directions[0] == StudyDirection.MAXIMIZE,
        )
    completed = completed_trials(study)
    reverse = study.direction == StudyDirection.MAXIMIZE
    return sorted(completed, key=lambda t: t.values[0], reverse=reverse)[:top]


def export_choice(study: optuna.Study) -> tuple[FrozenTrial, str | None] | None:
    """The trial ``hpcnas export`` and ``hpcnas deploy`` train when none is named, and why
    (``None``: the plain best), or ``None`` when nothing completed.

    The best completed trial, unless a published model of ``[study] enqueue`` (a trial with
    the ``reference_model`` attribute) scored within the best's selection margin: the best
    of ``K`` completed trials is the largest of ``K`` noisy estimates, which sits about
    ``sqrt(2 ln K)`` standard errors above its true value (the Gaussian extreme value), so
    on a few dozen validation samples the search's pick and the published model cannot be
    told apart, and the published model is the one with a record on other data (Breiman's
    one-standard-error rule, widened by the selection). Of several published models within
    the margin (the best among them or not), the first enqueued: the order of ``[study]
    enqueue`` is the user's order of preference between models the validation cannot tell
    apart. The standard error is the binomial one of the best trial's accuracy on its
    ``validation_samples``, at least one sample. On fewer than ``TOO_FEW_TO_RANK`` samples
    (a one-shot search's holdout on a few dozen series: one sample is 5 points or more) no
    value ranks, and the first published model that completed is exported whatever the
    values say. Several objectives, or a study without those records: the best trial (the
    Pareto front's best in the first objective).
    """
    from optuna.study import StudyDirection

    from optuna_hpcnas.evaluation._folds import TOO_FEW_TO_RANK

    ranked = best_trials(study, top=1)
    if not ranked:
        return None
    best = ranked[0]
    if len(study.directions) > 1 or study.direction != StudyDirection.MAXIMIZE:
        return best, None
    samples = best.user_attrs.get(_keys.OBJECTIVE_VALIDATION_SAMPLES)
    accuracy = best.user_attrs.get(_keys.OBJECTIVE_ACCURACY)
    if not isinstance(samples, int) or samples < 1 or not isinstance(accuracy, (int, float)):
        return best, None
    complete = completed_trials(study)
    published = [t for t in complete if _keys.OBJECTIVE_REFERENCE in t.user_attrs]
    if samples < TOO_FEW_TO_RANK and published:
        chosen = min(published, key=lambda t: t.number)  # enqueued in the user's order
        if chosen is best:
            return best, None
        name = chosen.user_attrs[_keys.OBJECTIVE_REFERENCE]
        return chosen, (
            f"the trials' values rest on {samples} validation samples, too few to rank "
            f"(fewer than {TOO_FEW_TO_RANK}; the best trial {best.number}: "
            f"{best.values[0]:.4f}): exporting the first published model {name!r} "
            f"(trial {chosen.number}, {chosen.values[0]:.4f})"
        )
    spread = max(accuracy * (1.0 - accuracy), 1.0 / samples)
    margin = math.sqrt(spread / samples) * max(1.0, math.sqrt(2.0 * math.log(len(complete))))
    close = [t for t in published if t.values[0] >= best.values[0] - margin]
    if not close:
        return best, None
    chosen = min(close, key=lambda t: t.number)  # enqueued in the user's order
    if chosen is best:
        return best, None
    name = chosen.user_attrs[_keys.OBJECTIVE_REFERENCE]
    first = " (the first enqueued of those)" if best in close else ""
    why = (
        f"the published model {name!r} (trial {chosen.number}, {chosen.values[0]:.4f}) is "
        f"within {margin:.3f} of the best trial {best.number} ({best.values[0]:.4f}), the "
        f"best of {len(complete)} on {samples} validation samples: too close to tell them "
        f"apart, exporting the published model{first}"
    )
    return chosen, why
