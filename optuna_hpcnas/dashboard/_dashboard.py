"""What optuna-dashboard shows of a search: objective names, per-trial architecture, FLOPs,
latency and stage (user attributes), and two custom plots stored in the study (a Pareto front
and the search trajectory), plus launching the dashboard on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Sequence
import logging
import math
from typing import Any
from typing import TYPE_CHECKING
import warnings

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas._records import record_architecture
from optuna_hpcnas._records import summary_of
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.search_space import Architecture

if TYPE_CHECKING:
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial
    import plotly.graph_objects as go

_logger = logging.getLogger(__name__)

PARETO_PLOT_ID = "hpcnas-pareto-front"
TRAJECTORY_PLOT_ID = "hpcnas-search-trajectory"


def prepare_study(study: optuna.Study, metric_names: Sequence[str]) -> None:
    """Name the objectives (``study.set_metric_names``) unless they already have names.

    Examples:
        >>> import optuna
        >>> study = optuna.create_study(directions=["maximize", "minimize"])
        >>> prepare_study(study, ["accuracy", "flops"])
        >>> study.metric_names
        ['accuracy', 'flops']
    """
    names = list(metric_names)
    if len(names) != len(study.directions):
        raise ValueError(
            f"`metric_names` has {len(names)} names ({names}), but the study has "
            f"{len(study.directions)} objectives."
        )
    current = study.metric_names
    if current is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)
    elif list(current) != names:
        _logger.warning("Study already names its objectives %s; keeping them.", current)


def record_trial(
    trial: optuna.Trial,
    arch: Architecture,
    *,
    flops: float | None = None,
    params: int | None = None,
    latency_s: float | None = None,
    stage: str | None = None,
) -> None:
    """Store a trial's architecture and costs as user attributes (shown by the dashboard)."""
    if not isinstance(arch, Architecture):
        raise TypeError(f"`arch` must be an Architecture, but got {type(arch).__name__}.")
    record_architecture(trial, arch)
    for key, value in (
        (_keys.OBJECTIVE_FLOPS, flops),
        (_keys.OBJECTIVE_PARAMS, params),
        (_keys.OBJECTIVE_LATENCY, latency_s),
        (_keys.OBJECTIVE_STAGE, stage),
    ):
        if value is not None:
            trial.set_user_attr(key, value)


def _summary(trial: FrozenTrial) -> str:
    text = summary_of(trial.user_attrs)
    if text is not None:
        return text
    return ", ".join(f"{k}={v}" for k, v in trial.params.items())


def _objective_names(study: optuna.Study) -> list[str]:
    names = study.metric_names
    if names is None:
        n = len(study.directions)
        return ["objective"] if n == 1 else [f"objective {i}" for i in range(n)]
    return list(names)


def _feasible(trial: FrozenTrial) -> bool:
    """No violated constraint (``trial.set_constraint`` or a sampler's ``constraints_func``)."""
    return all(v <= 0.0 for v in trial.constraints.values())


def plot_pareto_front(study: optuna.Study) -> go.Figure | None:
    """The Pareto front of a search; ``None`` before the first complete trial (or, with one
    objective, before a complete trial records FLOPs).

    Several objectives: Optuna's own ``optuna.visualization.plot_pareto_front`` (the first two
    objectives beyond three), with the study's metric names. One objective: the objective
    against FLOPs (user attribute ``flops``), which Optuna does not draw. Either way a trial
    that violates a constraint (``FrozenTrial.constraints``) is drawn apart, never on the front.
    """
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    names = _objective_names(study)
    if len(study.directions) >= 2:
        if not complete:
            return None
        n_targets = len(names) if len(names) <= 3 else 2
        fig = optuna.visualization.plot_pareto_front(
            study,
            target_names=names[:n_targets],
            targets=None if n_targets == len(names) else lambda t: t.values[:n_targets],
        )
        fig.update_layout(title=f"Pareto front: {' vs '.join(names[:n_targets])}")
        return fig
    return _plot_objective_vs_flops(study, complete, names[0])


def _plot_objective_vs_flops(
    study: optuna.Study, complete: Sequence[FrozenTrial], name: str
) -> go.Figure | None:
    import numpy as np
    import plotly.graph_objects as go

    trials = [
        t for t in complete if isinstance(t.user_attrs.get(_keys.OBJECTIVE_FLOPS), (int, float))
    ]
    if not trials:
        return None
    feasible = [t for t in trials if _feasible(t)]
    infeasible = [t for t in trials if not _feasible(t)]
    sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0

    def point(t: FrozenTrial) -> tuple[float, float]:
        return float(t.values[0]), float(t.user_attrs[_keys.OBJECTIVE_FLOPS])

    losses = np.array([point(t) for t in feasible], dtype=float).reshape(-1, 2)
    losses[:, 0] *= sign
    on_front = _records.non_domination_ranks(losses) == 0
    front = sorted((t for t, f in zip(feasible, on_front) if f), key=point)
    dominated = [t for t, f in zip(feasible, on_front) if not f]
    fig = go.Figure()
    for label, group, marker, mode in (
        ("infeasible", infeasible, {"size": 7, "symbol": "x", "color": "lightgray"}, "markers"),
        ("dominated", dominated, {"size": 7}, "markers"),
        ("Pareto front", front, {"size": 11}, "markers+lines"),
    ):
        if not group and label == "infeasible":
            continue
        fig.add_trace(
            go.Scatter(
                x=[point(t)[0] for t in group],
                y=[point(t)[1] for t in group],
                mode=mode,
                name=label,
                marker=marker,
                text=[f"trial {t.number}: {_summary(t)}" for t in group],
                hovertemplate="%{text}<br>%{x}, %{y}<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"Pareto front: {name} vs FLOPs", xaxis_title=name, yaxis_title="FLOPs"
    )
    return fig


def plot_search_trajectory(study: optuna.Study, *, objective: int = 0) -> go.Figure | None:
    """Every finished trial's value of one objective by trial number, coloured by the stage
    it reached, with the best value so far; ``None`` before the first completed trial.
    """
    import plotly.graph_objects as go

    names = _objective_names(study)
    if not 0 <= objective < len(names):
        raise ValueError(f"`objective` is {objective}, but the study has {len(names)}.")
    trials = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.COMPLETE
        or (t.state == TrialState.PRUNED and t.intermediate_values)
    ]
    if not any(t.state == TrialState.COMPLETE for t in trials):
        return None
    maximize = study.directions[objective] == StudyDirection.MAXIMIZE
    fig = go.Figure()
    groups: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        label = str(t.user_attrs.get(_keys.OBJECTIVE_STAGE, t.state.name.lower()))
        if t.state == TrialState.PRUNED:
            label = f"pruned ({label})" if _keys.OBJECTIVE_STAGE in t.user_attrs else "pruned"
        groups.setdefault(label, []).append(t)

    def value(t: FrozenTrial) -> float:
        if t.state == TrialState.COMPLETE:
            return float(t.values[objective])
        return float(t.intermediate_values[max(t.intermediate_values)])

    for label, group in sorted(groups.items()):
        fig.add_trace(
            go.Scatter(
                x=[t.number for t in group],
                y=[value(t) for t in group],
                mode="markers",
                name=label,
                text=[_summary(t) for t in group],
                hovertemplate="trial %{x}: %{y}<br>%{text}<extra></extra>",
            )
        )
    best: list[float] = []
    xs: list[int] = []
    current = -math.inf if maximize else math.inf
    for t in sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.number):
        v = float(t.values[objective])
        current = max(current, v) if maximize else min(current, v)
        xs.append(t.number)
        best.append(current)
    fig.add_trace(go.Scatter(x=xs, y=best, mode="lines", name="best so far", line={"shape": "hv"}))
    fig.update_layout(
        title=f"Search trajectory: {names[objective]}",
        xaxis_title="trial",
        yaxis_title=names[objective],
    )
    return fig


def save_dashboard_plots(study: optuna.Study) -> list[str]:
    """Store the Pareto-front and trajectory plots in the study for optuna-dashboard.

    They are saved under fixed ids, so calling this again replaces them. Returns the ids saved.
    """
    from optuna_dashboard import save_plotly_graph_object

    saved = []
    for graph_id, fig in (
        (TRAJECTORY_PLOT_ID, plot_search_trajectory(study)),
        (PARETO_PLOT_ID, plot_pareto_front(study)),
    ):
        if fig is not None:
            save_plotly_graph_object(study, fig, graph_object_id=graph_id)
            saved.append(graph_id)
    return saved


class DashboardCallback:
    """A ``study.optimize`` callback that refreshes the dashboard plots every ``every`` trials.

    Args:
        every: Refresh after this many finished trials (of this process).
    """

    def __init__(self, *, every: int = 10) -> None:
        check_int("every", every, 1)
        self._every = every
        self._seen = 0

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._seen += 1
        if self._seen % self._every == 0:
            save_dashboard_plots(study)


def launch_dashboard(
    storage: str | BaseStorage,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    artifact_store: Any | None = None,
) -> None:
    """Serve optuna-dashboard on ``storage`` (blocks); bound to loopback unless told otherwise.

    Reach it from a laptop through an SSH tunnel (``ssh -L 8080:127.0.0.1:8080 login-node``)
    rather than opening the port.
    """
    from optuna_dashboard import run_server

    if host not in ("127.0.0.1", "localhost", "::1"):
        _logger.warning("optuna-dashboard on %s is reachable from other machines.", host)
    run_server(storage, host=host, port=port, artifact_store=artifact_store)
