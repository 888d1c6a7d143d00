"""``hpcnas deploy``: a finished study's chosen architecture, trained, verified and packaged.

The search's side of the pipeline: pick the trial (the best, ``--trial N``, or the best one
of the Pareto front within metric limits), train it as ``hpcnas export`` does, hold out a
share of the data the search never saw (from the test split), and hand both to
``deploy_model``.
"""

from __future__ import annotations

from collections.abc import Mapping
import logging
from pathlib import Path
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.data import TaskData
    from optuna_hpcnas.deploy._pipeline import DeployReport
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.search_space import Architecture

# limit name -> the trial user attribute it bounds
LIMITABLE = {"flops": "flops", "params": "params", "latency": "latency_s"}


def parse_limits(pairs: list[str] | None) -> dict[str, float]:
    """``["flops=2e6", "latency=0.001"]`` -> ``{"flops": 2e6, "latency": 0.001}``."""
    out: dict[str, float] = {}
    for pair in pairs or []:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or name not in LIMITABLE:
            raise ValueError(
                f"--limit {pair!r} must look like NAME=VALUE with NAME one of {list(LIMITABLE)}"
            )
        try:
            out[name] = float(raw)
        except ValueError:
            raise ValueError(f"--limit {pair!r}: {raw!r} is not a number") from None
    return out


def choose_trial(
    study: optuna.Study, *, number: int | None, limits: Mapping[str, float]
) -> FrozenTrial:
    """``number``'s trial, else the best complete trial (the Pareto front for several
    objectives, best in the first) whose recorded costs are within ``limits``; without limits
    a single-objective study's choice is ``export_choice``'s (a published model within one
    standard error of the best is preferred)."""
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    if number is not None:
        for t in study.get_trials(deepcopy=False):
            if t.number == number and t.state == TrialState.COMPLETE:
                return t
        raise ValueError(f"trial {number} is not a completed trial of {study.study_name!r}")
    multi = len(study.directions) > 1
    if not multi and not limits:
        from optuna_hpcnas._summary import export_choice

        choice = export_choice(study)
        if choice is None:
            raise ValueError(f"study {study.study_name!r} has no completed trial yet")
        trial, why = choice
        if why is not None:
            logging.getLogger(__name__).info("%s (choose another with --trial).", why)
        return trial
    pool = (
        list(study.best_trials)
        if multi
        else study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    )
    within = [
        t
        for t in pool
        if all(
            isinstance(t.user_attrs.get(LIMITABLE[k]), (int, float))
            and t.user_attrs[LIMITABLE[k]] <= v
            for k, v in limits.items()
        )
    ]
    if not within:
        what = "the Pareto front" if multi else "the completed trials"
        raise ValueError(f"no trial of {what} of {study.study_name!r} is within {dict(limits)}")
    maximize = study.directions[0] == StudyDirection.MAXIMIZE
    return sorted(within, key=lambda t: t.values[0], reverse=maximize)[0]


def holdout_of(data: TaskData, fraction: float, seed: int) -> Any:
    """``fraction`` of all samples, stratified, taken from the test split (never searched on);
    the whole test split when it is smaller."""
    from optuna_hpcnas.deploy._holdout import split_holdout

    total = sum(data.sizes)
    share = fraction * total / len(data.test)  # type: ignore[arg-type]
    if share >= 1:
        return data.test
    return split_holdout(data.test, fraction=share, seed=seed)[1]


def deploy_trial(
    study: optuna.Study,
    trial: FrozenTrial,
    arch: Architecture,
    data: TaskData,
    *,
    out: str | Path,
    recipe: ScratchTrainingConfig,
    mode: str = "retrain",
    weights: str | Path | None = None,
    holdout_fraction: float = 0.1,
    margin: float = 0.02,
    target: str | None = None,
    name: str = "model",
    latency_repeats: int = 200,
    standardise: bool = True,
) -> DeployReport:
    """Train ``arch`` (``hpcnas export``'s recipe), verify it on the held-out split against the
    search's estimate, and write the deployment into ``out`` (``deploy_model``; with
    ``standardise`` the models take raw data)."""
    from optuna_hpcnas.deploy._export import trained_module
    from optuna_hpcnas.deploy._pipeline import deploy_model
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

    if not 0 < holdout_fraction < 1:
        raise ValueError(f"`holdout_fraction` is {holdout_fraction!r}, but must be in (0, 1).")
    space = HierarchicalSearchSpace.from_study(study)
    chosen = target or (space.target if space is not None else None) or "onnx-cpu"
    module, metrics = trained_module(study, arch, data, mode=mode, recipe=recipe, weights=weights)
    estimate = trial.user_attrs.get("accuracy")
    return deploy_model(
        module.cpu().eval(),
        out=out,
        input_shape=tuple(data.input_shape),
        calibration=data.train,
        holdout=holdout_of(data, holdout_fraction, recipe.seed),
        estimate=float(estimate) if isinstance(estimate, (int, float)) else None,
        margin=margin,
        preprocessing=dict(data.preprocessing),
        target=chosen,
        name=name,
        metadata={
            "study": study.study_name,
            "trial": trial.number,
            "values": trial.values,
            "architecture": arch.to_dict(),
            "summary": arch.describe(),
            "training": {"mode": mode, **vars(recipe)},
            "trained_test_accuracy": metrics.get("test_accuracy"),
        },
        seed=recipe.seed,
        latency_repeats=latency_repeats,
        standardise=standardise,
    )
