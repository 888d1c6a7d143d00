from __future__ import annotations

import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas.pruners import Stage
from optuna_hpcnas.pruners import StagedPruner
from optuna_hpcnas.pruners import StagePlan


def test_default_plan_is_the_articles_plan_in_steps() -> None:
    plan = StagePlan()
    assert [(s.name, s.steps, s.lr) for s in plan.stages] == [
        ("quick", 100, 1e-3),
        ("medium", 400, 1e-2),
        ("full", 2000, 1e-1),
    ]
    assert plan.patience == 0 and plan.boundaries == (100, 500, 2500)
    assert plan.eval_every == 50  # half the shortest stage
    assert [plan.stage_index(s) for s in (1, 100, 101, 500, 501, 2500)] == [0, 0, 1, 1, 2, 2]
    scaled = StagePlan(scale=0.1, patience=300)
    assert [s.steps for s in scaled.stages] == [10, 40, 200]
    assert (scaled.patience, scaled.eval_every) == (30, 5)


def test_report_steps_end_every_stage_and_the_cut() -> None:
    plan = StagePlan(stages=(Stage("a", 10, 0.1), Stage("b", 25, 0.1)), eval_every=10)
    assert plan.report_steps(plan.total_steps) == (10, 20, 30, 35)
    assert plan.report_steps(10) == (10,)  # a trial run to the first stage only
    assert plan.report_steps(12) == (10, 12)
    assert StagePlan(stages=(Stage("a", 7, 0.1),), eval_every=3).report_steps(7) == (3, 6, 7)


def test_plan_from_a_toml_table_and_validation() -> None:
    table = {
        "stages": [{"name": "a", "steps": 2, "lr": 0.1}, {"name": "b", "steps": 3, "lr": 0.01}],
        "patience": 2,
    }
    plan = StagePlan(**table)
    assert plan.stages[1] == Stage("b", 3, 0.01) and plan.patience == 2
    with pytest.raises(ValueError, match="write `steps` instead of `epochs`"):
        StagePlan(stages=[{"name": "a", "epochs": 2, "lr": 0.1}])
    with pytest.raises(ValueError, match="duplicate"):
        StagePlan(stages=(Stage("a", 1, 0.1), Stage("a", 1, 0.1)))
    with pytest.raises(ValueError, match="steps"):
        Stage("a", 0, 0.1)
    with pytest.raises(ValueError, match="promote"):
        Stage("a", 1, 0.1, promote=1.5)
    with pytest.raises(ValueError, match="patience"):
        StagePlan(patience=-1)
    with pytest.raises(ValueError, match="eval_every"):
        StagePlan(eval_every=0)
    with pytest.raises(TypeError, match="plan"):
        StagedPruner(plan=3)  # type: ignore[arg-type]


def _plan() -> StagePlan:
    return StagePlan(
        stages=(Stage("quick", 1, 1e-3, promote=0.5), Stage("full", 4, 1e-2)), patience=0
    )


def _run(study: optuna.Study, values: list[float]) -> optuna.trial.Trial:
    trial = study.ask()
    for step, value in enumerate(values, start=1):
        trial.report(value, step)
        if trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return trial
    study.tell(trial, values[-1])
    return trial


def test_promotion_is_decided_from_the_storage_by_all_workers(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = optuna.create_study(storage=url, direction="maximize", pruner=StagedPruner(_plan()))
    second = optuna.load_study(
        study_name=first.study_name, storage=url, pruner=StagedPruner(_plan())
    )
    _run(first, [0.8, 0.85])  # the first trial is the best so far: promoted
    pruned = _run(second, [0.3, 0.9])  # worker two sees worker one's stage value
    promoted = _run(second, [0.9, 0.95])
    low = _run(first, [0.5, 0.6])  # 4 competitors, share 0.5: top 2 go on
    trials = first.get_trials()
    states = [t.state for t in trials]
    assert states == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
    ]
    assert trials[pruned.number].last_step == 1 and trials[promoted.number].last_step == 2
    assert (
        "not promoted after stage 'quick'" in trials[low.number].system_attrs[_keys.PRUNER_REASON]
    )
    assert StagedPruner.stage_reached(trials[promoted.number]) == "full"
    assert StagedPruner.stage_reached(trials[pruned.number]) == "quick"
    assert trials[0].system_attrs[_keys.PRUNER_STAGE_VALUE + "quick"] == 0.8


def test_ties_never_promote_more_than_the_share() -> None:
    # Accuracy on a small validation set ties often. Ties rank by trial number, the earlier
    # first, so 12 equal quick-stage values promote only the first trial: every later one has
    # earlier equals ahead of it filling the share (before, all 12 went on).
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(_plan()))
    for _ in range(12):
        _run(study, [0.9, 0.95])
    assert [t.number for t in study.trials if t.last_step == 2] == [0]
    # A strictly better value still goes on, and a worse one does not.
    assert study.trials[-1].state == optuna.trial.TrialState.PRUNED
    _run(study, [0.99, 0.99])
    _run(study, [0.5, 0.99])
    assert [t.last_step for t in study.trials[-2:]] == [2, 1]


def test_a_stage_is_judged_by_its_value_at_the_end_not_its_best() -> None:
    """On a small validation set one round can spike: the stage's value is the one at the
    stage's end (as SuccessiveHalving reads a rung), so a spike does not promote."""
    plan = StagePlan(stages=(Stage("quick", 3, 1e-3, promote=0.5), Stage("full", 2, 1e-2)))
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(plan))
    _run(study, [0.5, 0.6, 0.7, 0.8, 0.8])
    spiky = _run(study, [0.5, 1.0, 0.6])  # best 1.0, but 0.6 at the stage's end
    assert study.trials[spiky.number].state == optuna.trial.TrialState.PRUNED
    stored = study.trials[spiky.number].system_attrs[_keys.PRUNER_STAGE_VALUE + "quick"]
    assert stored == 0.6


def test_minimize_direction_promotes_low_values() -> None:
    study = optuna.create_study(direction="minimize", pruner=StagedPruner(_plan()))
    _run(study, [1.0, 0.9])
    assert _run(study, [0.5, 0.4]).number == 1
    assert study.trials[1].state == optuna.trial.TrialState.COMPLETE
    _run(study, [2.0, 0.1])
    assert study.trials[2].state == optuna.trial.TrialState.PRUNED


def test_patience_stops_a_stalled_trial() -> None:
    plan = StagePlan(stages=(Stage("only", 20, 0.1),), patience=3)
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(plan))
    _run(study, [0.5, 0.6, 0.6, 0.55, 0.6, 0.6, 0.7])
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.last_step == 5  # steps 3, 4, 5 did not beat 0.6
    assert "no improvement for 3 steps" in trial.system_attrs[_keys.PRUNER_REASON]
    _run(study, [0.5, 0.6, 0.6, 0.55, 0.65, 0.6, 0.7])
    assert study.trials[1].state == optuna.trial.TrialState.COMPLETE
    override = StagedPruner(plan, patience=0)
    assert override.plan.patience == 0


def test_non_finite_reports_are_pruned_and_multi_objective_refused() -> None:
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(_plan()))
    _run(study, [float("nan")])
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    multi = optuna.create_study(directions=["maximize", "minimize"], pruner=StagedPruner())
    trial = multi.ask()
    with pytest.raises(RuntimeError, match="single-objective"):
        StagedPruner().prune(multi, multi._storage.get_trial(trial._trial_id))


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_may_prune_is_true_whenever_prune_stops_the_trial(direction: str) -> None:
    """``may_prune`` judges from the trial's own values; whenever ``prune`` would stop the
    trial it says so (the runner awaits the verdict only then), and it is not always true."""
    import numpy as np

    plan = StagePlan(
        stages=(
            Stage("quick", 2, 1e-3, promote=0.5),
            Stage("medium", 3, 1e-2),
            Stage("full", 4, 1e-1),
        ),
        patience=2,
    )
    pruner = StagedPruner(plan)
    study = optuna.create_study(direction=direction, pruner=pruner)
    rng = np.random.default_rng(0)
    maximize = direction == "maximize"
    stops = waits = 0
    for _ in range(40):
        trial = study.ask()
        values: dict[int, float] = {}
        for step in range(1, plan.total_steps + 1):
            value = float(rng.choice([np.nan, *rng.normal(size=7)]))
            trial.report(value, step)
            values[step] = value
            verdict = trial.should_prune()
            may = pruner.may_prune(values, maximize=maximize)
            assert may or not verdict, (values, step)
            early = pruner.stops_early(values, maximize=maximize)  # no storage read
            assert early == (verdict and StagedPruner.early_stopped(trial)), (values, step)
            stops += verdict
            waits += may
            if verdict:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, values[plan.total_steps])
    assert stops > 0  # every kind of stop was met (boundary, patience, no finite value)...
    assert waits < sum(len(t.intermediate_values) for t in study.get_trials())  # ...not always


@pytest.mark.parametrize("best", [True, False])
def test_a_verdict_takes_few_transactions(tmp_path, best: bool) -> None:
    """A runner waits for the verdict at a stage's end (``report_round``): on an RDB storage
    its writes go together, and a stop is told apart from early stopping without a read.
    Every transaction takes SQLite's write lock, which the other workers hold often."""
    from optuna_hpcnas.evaluation import Decision
    from optuna_hpcnas.evaluation import report_round
    from optuna_hpcnas.evaluation import TrialPlan

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=url, direction="maximize", pruner=StagedPruner(_plan()))
    for value in (0.6, 0.7):
        _run(study, [value, value])
    rdb = study._storage._backend
    opened = rdb.scoped_session
    sessions: list[int] = []

    def counted() -> object:
        sessions.append(1)
        return opened()

    trial = study.ask()
    plan = TrialPlan(_plan(), 5, report=True, maximize=True)
    rdb.scoped_session = counted
    try:
        decision = report_round(trial, plan, 1, 0.9 if best else 0.1, None)
    finally:
        rdb.scoped_session = opened
    assert decision == (Decision.CONTINUE if best else Decision.PRUNE)
    # the report, the trial's attributes, the stage reached and value together, the other
    # trials, and the reason of a stop (it was 7 transactions for a stop: one per attribute,
    # and a read of the attributes again to tell a stop from early stopping)
    assert len(sessions) == (4 if best else 5)
    attrs = study._storage.get_trial_system_attrs(trial._trial_id)
    assert attrs[_keys.PRUNER_STAGE_REACHED] == "quick"
    assert attrs[_keys.PRUNER_STAGE_VALUE + "quick"] == (0.9 if best else 0.1)
    assert (_keys.PRUNER_REASON in attrs) != best


def test_verdict_needed_by_pruner() -> None:
    from optuna_hpcnas.evaluation import verdict_needed

    values = {1: 0.5}
    assert not verdict_needed(optuna.pruners.NopPruner(), values, maximize=True)
    assert verdict_needed(optuna.pruners.MedianPruner(), values, maximize=True)
    staged = StagedPruner(StagePlan(stages=(Stage("a", 1, 0.1), Stage("b", 3, 0.1)), patience=0))
    assert verdict_needed(staged, values, maximize=True)  # the end of stage "a": promotion
    assert not verdict_needed(staged, {1: 0.5, 2: 0.6}, maximize=True)
    assert verdict_needed(staged, {1: float("nan")}, maximize=True)


def _study_with_finishers(
    pruner: StagedPruner, finishers: list[tuple[float, float]], others: list[float]
) -> optuna.Study:
    """Trials that finished the last stage (quick value, final value) and trials cut at the
    quick stage, as the pruner's own records leave them."""
    from optuna.distributions import FloatDistribution

    study = optuna.create_study(direction="maximize", pruner=pruner)
    key = _keys.PRUNER_STAGE_VALUE + "quick"
    x = {"x": FloatDistribution(0, 1)}
    for quick, final in finishers:
        attrs = {key: quick, _keys.PRUNER_STAGE_REACHED: "full"}
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": 0.5}, distributions=x, value=final, system_attrs=attrs
            )
        )
    for quick in others:
        attrs = {key: quick, _keys.PRUNER_STAGE_REACHED: "quick"}
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": 0.5},
                distributions=x,
                state=optuna.trial.TrialState.PRUNED,
                system_attrs=attrs,
            )
        )
    return study


@pytest.mark.parametrize(
    ("finals", "threshold", "pruned", "tau"),
    [
        ((0.6, 0.7, 0.8, 0.9), 0.3, False, -1.0),  # the quick stage orders the best backwards
        ((0.9, 0.8, 0.7, 0.6), 0.3, True, 1.0),  # it orders them well: its share decides
        ((0.6, 0.7, 0.8, 0.9), None, True, None),  # off: its share decides
    ],
)
def test_a_stage_weak_within_the_top_cuts_only_its_bottom_half(
    finals: tuple[float, ...], threshold: float | None, pruned: bool, tau: float | None
) -> None:
    plan = StagePlan(stages=(Stage("quick", 2, 0.1, promote=0.25), Stage("full", 2, 0.1)))
    pruner = StagedPruner(plan, min_top_fidelity=threshold, fidelity_trials=4)
    quick = (0.9, 0.8, 0.7, 0.6)
    others = [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5]
    study = _study_with_finishers(pruner, list(zip(quick, finals)), others)
    # 13 compete at the quick stage: 3 are promoted by the share, 6 in the better half
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.report(0.65, 2)
    assert trial.should_prune() is pruned
    attrs = study._storage.get_trial_system_attrs(trial._trial_id)
    assert attrs.get(_keys.PRUNER_TOP_FIDELITY + "quick") == tau
    # the bottom half is cut whatever the fidelity
    bottom = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    bottom.report(0.12, 2)
    assert bottom.should_prune()


def test_top_fidelity_waits_for_enough_finishers_and_checks_its_arguments() -> None:
    plan = StagePlan(stages=(Stage("quick", 2, 0.1, promote=0.25), Stage("full", 2, 0.1)))
    pruner = StagedPruner(plan, min_top_fidelity=0.3, fidelity_trials=5)
    study = _study_with_finishers(
        pruner, [(0.9, 0.6), (0.8, 0.7), (0.7, 0.8), (0.6, 0.9)], [0.1, 0.2, 0.3, 0.4, 0.5]
    )
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.report(0.65, 2)
    assert trial.should_prune()  # 4 finishers of the 5 it waits for: the share decides
    with pytest.raises(ValueError, match="min_top_fidelity"):
        StagedPruner(plan, min_top_fidelity=1.5)
    with pytest.raises(ValueError, match="fidelity_trials"):
        StagedPruner(plan, min_top_fidelity=0.3, fidelity_trials=2)
