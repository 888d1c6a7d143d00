from __future__ import annotations

import optuna
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import DashboardCallback
from optuna_hpcnas.dashboard import PARETO_PLOT_ID
from optuna_hpcnas.dashboard import plot_pareto_front
from optuna_hpcnas.dashboard import plot_search_trajectory
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.dashboard import TRAJECTORY_PLOT_ID

SPACE = HierarchicalSearchSpace.preset("digits-small")


def _objective(multi: bool):  # type: ignore[no-untyped-def]
    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        arch = SPACE.suggest(trial)
        flops = float(sum((c.width or 4) * (c.kernel or 1) ** 2 for c in arch.cells))
        acc = 1.0 / (1.0 + abs(flops - 300.0) / 100.0) + 0.01 * (trial.number % 3)
        record_trial(trial, arch, flops=flops, stage="medium" if trial.number % 2 else "quick")
        return (acc, flops) if multi else acc

    return objective


def _study(multi: bool, n: int = 15) -> optuna.Study:
    study = optuna.create_study(
        directions=["maximize", "minimize"] if multi else ["maximize"],
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    prepare_study(study, ["accuracy", "flops"] if multi else ["accuracy"])
    study.optimize(_objective(multi), n_trials=n)
    return study


def test_prepare_study_names_objectives_once(caplog: pytest.LogCaptureFixture) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    with pytest.raises(ValueError, match="2 objectives"):
        prepare_study(study, ["accuracy"])
    prepare_study(study, ["accuracy", "latency_s"])
    prepare_study(study, ["a", "b"])  # keeps the first names, with a warning
    assert study.metric_names == ["accuracy", "latency_s"]
    assert "keeping them" in caplog.text


def test_record_trial_user_attrs() -> None:
    study = _study(multi=False, n=2)
    attrs = study.trials[0].user_attrs
    arch = SPACE.from_params(study.trials[0].params)
    assert attrs["arch"] == arch.to_json()
    assert attrs["arch_description"] == arch.describe()
    assert attrs["stage"] == "quick" and isinstance(attrs["flops"], float)
    with pytest.raises(TypeError, match="Architecture"):
        record_trial(study.ask(), {"topology": "chain"})  # type: ignore[arg-type]


def _xy(trace: object) -> set[tuple[float, float]]:
    return set(zip(trace.x, trace.y))  # type: ignore[attr-defined]


def test_multi_objective_front_is_optunas_plot() -> None:
    study = _study(multi=True)
    fig = plot_pareto_front(study)
    assert fig is not None
    reference = optuna.visualization.plot_pareto_front(study, target_names=["accuracy", "flops"])
    assert [t.to_plotly_json() for t in fig.data] == [t.to_plotly_json() for t in reference.data]
    assert _xy(fig.data[-1]) == {tuple(t.values) for t in study.best_trials}
    assert fig.layout.title.text == "Pareto front: accuracy vs flops"
    assert fig.layout.xaxis.title.text == "accuracy"
    # Optuna's hover text carries the trial's user attributes: the architecture.
    assert "arch_description" in fig.data[-1].text[0]


def test_more_than_three_objectives_draw_the_first_two() -> None:
    study = optuna.create_study(directions=["minimize"] * 4)
    study.optimize(lambda t: tuple(t.suggest_float(f"x{i}", 0, 1) for i in range(4)), n_trials=6)
    fig = plot_pareto_front(study)
    assert fig is not None and fig.layout.title.text == "Pareto front: objective 0 vs objective 1"
    plotted = set().union(*(_xy(trace) for trace in fig.data))
    assert plotted == {tuple(t.values[:2]) for t in study.trials}
    assert plot_pareto_front(optuna.create_study(directions=["minimize"] * 2)) is None


def test_single_objective_front_of_accuracy_and_flops() -> None:
    study = _study(multi=False)
    fig = plot_pareto_front(study)
    assert fig is not None and fig.layout.yaxis.title.text == "FLOPs"
    traces = {trace.name: trace for trace in fig.data}
    assert set(traces) == {"dominated", "Pareto front"}  # no constraint: no infeasible trace
    points = {(t.values[0], t.user_attrs["flops"]) for t in study.trials}
    front = {
        p for p in points if not any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in points)
    }
    assert _xy(traces["Pareto front"]) == front
    assert _xy(traces["dominated"]) == points - front
    assert list(traces["Pareto front"].x) == sorted(traces["Pareto front"].x)
    empty = optuna.create_study()
    empty.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert plot_pareto_front(empty) is None  # no FLOPs recorded


def test_trajectory_best_so_far_is_monotone() -> None:
    study = _study(multi=False)
    fig = plot_search_trajectory(study)
    assert fig is not None
    best = next(t for t in fig.data if t.name == "best so far")
    assert list(best.y) == sorted(best.y)
    assert best.y[-1] == pytest.approx(study.best_value)
    assert {t.name for t in fig.data} >= {"quick", "medium"}
    assert plot_search_trajectory(optuna.create_study()) is None


def test_save_plots_and_callback() -> None:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    def stored_ids(study: optuna.Study) -> set[str]:
        attrs = study._storage.get_study_system_attrs(study._study_id)
        return set(get_plotly_graph_objects(attrs))

    study = _study(multi=True, n=4)
    assert save_dashboard_plots(study) == [TRAJECTORY_PLOT_ID, PARETO_PLOT_ID]
    assert stored_ids(study) == {TRAJECTORY_PLOT_ID, PARETO_PLOT_ID}
    # Saving again replaces, does not add.
    save_dashboard_plots(study)
    assert len(stored_ids(study)) == 2
    fresh = optuna.create_study(directions=["maximize", "minimize"])
    fresh.optimize(_objective(True), n_trials=5, callbacks=[DashboardCallback(every=5)])
    assert stored_ids(fresh) == {TRAJECTORY_PLOT_ID, PARETO_PLOT_ID}
    with pytest.raises(ValueError):
        DashboardCallback(every=0)
    assert all(t.state == TrialState.COMPLETE for t in fresh.trials)


def test_infeasible_trials_are_never_on_the_front() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        x = trial.suggest_float("x", 0, 1)
        trial.set_constraint("limit", x - 0.5)  # feasible when x <= 0.5
        return x, x * x

    study.enqueue_trial({"x": 0.9})  # the best accuracy, but infeasible
    study.enqueue_trial({"x": 0.2})
    study.enqueue_trial({"x": 0.4})
    study.optimize(objective, n_trials=3)
    fig = plot_pareto_front(study)
    assert fig is not None
    infeasible, dominated, front = fig.data  # Optuna's order when a trial has constraints
    assert "Infeasible" in infeasible.hovertemplate and list(infeasible.x) == [0.9]
    assert sorted(front.x) == [0.2, 0.4] and len(dominated.x) == 0


def test_single_objective_feasibility_reads_frozen_trial_constraints() -> None:
    """Both ways Optuna stores constraints: ``trial.set_constraint`` and the list a sampler's
    ``constraints_func`` writes."""

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0, 1)
        trial.set_user_attr("flops", 10.0 * x)
        if trial.number < 3:
            trial.set_constraint("limit", 0.5 - x)  # feasible when x >= 0.5
        return x

    def constraints(trial: optuna.trial.FrozenTrial) -> tuple[float]:
        return (trial.params["x"] - 0.9,)  # feasible when x <= 0.9

    with pytest.warns(FutureWarning, match="constraints_func"):  # deprecated, still stored
        sampler = optuna.samplers.TPESampler(constraints_func=constraints)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for x in (0.3, 0.6, 0.7, 0.95, 0.8):
        study.enqueue_trial({"x": x})
    study.optimize(objective, n_trials=5)
    assert study.trials[3].constraints == {"0": pytest.approx(0.05)}
    fig = plot_pareto_front(study)
    assert fig is not None
    traces = {trace.name: trace for trace in fig.data}
    assert sorted(traces["infeasible"].x) == [0.3, 0.95]
    # Feasible: 0.6, 0.7, 0.8 trade accuracy for FLOPs; every one is on the front.
    assert list(traces["Pareto front"].x) == [0.6, 0.7, 0.8]
