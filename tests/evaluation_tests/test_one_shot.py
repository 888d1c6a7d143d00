"""One-shot mode: candidates scored by inherited weights alone, the best of them queued again
as finalists that go through the stages, and the export choosing among the trained ones."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import optuna
from optuna.distributions import FloatDistribution
from optuna.study import StudyDirection
import pytest
import torch
from torch.utils.data import TensorDataset

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas._pareto import fronts
from optuna_hpcnas._summary import best_trials
from optuna_hpcnas._summary import export_choice
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation import enqueue_finalists
from optuna_hpcnas.evaluation import ObjectiveConfig
from optuna_hpcnas.evaluation import SupernetObjective
from optuna_hpcnas.evaluation import TrialPlan
from optuna_hpcnas.pruners import Stage
from optuna_hpcnas.pruners import StagedPruner
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.supernet import SupernetTrainingConfig

SPACE = HierarchicalSearchSpace(
    num_cells=2, operators=("conv", "identity"), widths=(4, 8), kernel_sizes=(1, 3)
)
PLAN = StagePlan(stages=(Stage("quick", 2, 1e-3, promote=0.5), Stage("full", 4, 1e-2)))


def _task(n: int = 60) -> TaskData:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 1, 6, 6, generator=g) + y[:, None, None, None].float()
    ds = TensorDataset(x, y)
    return TaskData(ds, ds, ds, input_shape=(1, 6, 6), num_classes=3)


def _objective(**config: object) -> SupernetObjective:
    return SupernetObjective(
        SPACE,
        _task(),
        training=SupernetTrainingConfig(
            paths_per_batch=3, batch_size=32, epochs=2, sandwich=True, distillation=0.5
        ),
        plan=PLAN,
        config=ObjectiveConfig(latency_repeats=1, batch_size=32, mode="one-shot", **config),
        threads=None,
    )


def test_one_shot_scores_by_inherited_weights_then_finalists_train() -> None:
    objective = _objective()
    objective.train_supernet()
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(PLAN))
    study.optimize(objective, n_trials=6)
    inherited = study.trials
    for t in inherited:
        assert t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "inherited"
        assert t.user_attrs[_keys.OBJECTIVE_STEPS] == 0
        assert t.intermediate_values == {}  # never fine-tuned, never reported
        # the accuracy, its ties broken by the log-loss (less than one sample of 60)
        accuracy = t.user_attrs[_keys.OBJECTIVE_INHERITED_ACCURACY]
        assert t.value == pytest.approx(accuracy, abs=1 / 60)
    ranked = sorted(inherited, key=lambda t: (-t.values[0], t.number))
    queued = enqueue_finalists(study, 2)
    assert len(queued) == 2
    assert queued[0] == ranked[0].number  # the best first
    study.optimize(objective, n_trials=2)
    finalists = study.trials[6:]
    assert [t.user_attrs[_keys.OBJECTIVE_FINALIST_OF] for t in finalists] == queued
    for t in finalists:
        assert t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "trained"
        assert t.user_attrs[_keys.OBJECTIVE_STEPS] > 0
        assert t.intermediate_values  # went through the stages
        assert t.params == study.trials[t.user_attrs[_keys.OBJECTIVE_FINALIST_OF]].params
    # the export chooses among the trained trials, whatever the inherited values
    chosen = export_choice(study)
    assert chosen is not None and chosen[0].number in {t.number for t in finalists}
    assert {t.number for t in best_trials(study, top=10)} == {t.number for t in finalists}
    # an architecture trained already is not queued again
    trained = [t.params for t in finalists]
    again = enqueue_finalists(study, 6)
    assert again and all(study.trials[n].params not in trained for n in again)
    # the forwards are timed where latency counts: the trained finalists, not the inherited
    assert all(_keys.OBJECTIVE_LATENCY not in t.user_attrs for t in inherited)
    assert all(t.user_attrs[_keys.OBJECTIVE_LATENCY] > 0 for t in finalists)


def test_inherited_scores_recalibrate_on_the_supernets_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An inherited score recomputes BatchNorm on ``bn_recalibration_batches`` training
    batches (here 1 of 32 samples); a trained candidate's validation on the precise 60."""
    from optuna_hpcnas.evaluation import _core
    from optuna_hpcnas.supernet import _training

    seen: list[int] = []

    def counting(model: torch.nn.Module, batches: Any, **kwargs: Any) -> int:
        listed = list(batches)
        seen.append(sum(len(x) for x, _ in listed))
        return real(model, listed, **kwargs)

    real = _training.recalibrate_batch_norm
    monkeypatch.setattr(_training, "recalibrate_batch_norm", counting)
    monkeypatch.setattr(_core, "recalibrate_batch_norm", counting)
    objective = SupernetObjective(
        SPACE,
        _task(),
        training=SupernetTrainingConfig(
            paths_per_batch=3, batch_size=32, epochs=1, sandwich=True, bn_recalibration_batches=1
        ),
        plan=PLAN,
        config=ObjectiveConfig(latency_repeats=1, batch_size=32, mode="one-shot"),
        threads=None,
    )
    objective.train_supernet()
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=2)
    assert seen == [32, 32]
    seen.clear()
    enqueue_finalists(study, 1)
    study.optimize(objective, n_trials=1)
    assert seen and set(seen) == {60}


@pytest.mark.parametrize(
    "latency_counts",
    [{"objectives": ("accuracy", "latency")}, {"latency_weight": 0.01}, {"max_latency_s": 9.0}],
)
def test_inherited_trials_time_their_forwards_where_latency_counts(
    latency_counts: dict[str, object],
) -> None:
    objective = _objective(**latency_counts)
    objective.train_supernet()
    two = "objectives" in latency_counts
    study = optuna.create_study(directions=["maximize", "minimize"] if two else ["maximize"])
    study.optimize(objective, n_trials=2)
    for t in study.trials:
        assert t.user_attrs[_keys.OBJECTIVE_FIDELITY] == "inherited"
        assert t.user_attrs[_keys.OBJECTIVE_LATENCY] > 0


def test_one_shot_needs_a_trained_supernet() -> None:
    with pytest.raises(ValueError, match="one-shot.*cross-validation"):
        ObjectiveConfig(mode="one-shot", validation="cross-validation")
    with pytest.raises(ValueError, match="`mode`"):
        ObjectiveConfig(mode="oneshot")
    # 'auto' on small data would cross-validate: one-shot holds out instead
    objective = _objective(validation="auto")
    assert objective.core.folds.kind == "holdout"


def test_the_plan_of_a_finalist_or_a_published_model_trains() -> None:
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(PLAN))
    plan = TrialPlan.for_study(study, ObjectiveConfig(mode="one-shot"), PLAN)
    assert plan.inherited
    assert not plan.for_trial({_keys.OBJECTIVE_FINALIST_OF: 3}).inherited
    assert plan.for_trial({_keys.OBJECTIVE_FINALIST_OF: 3}).protected
    assert not plan.for_trial({_keys.OBJECTIVE_REFERENCE: "fcn"}).inherited
    assert plan.for_trial({_keys.OBJECTIVE_REFERENCE: "fcn"}).published
    assert not plan.for_trial({_keys.OBJECTIVE_FINALIST_OF: 3}).published
    assert plan.for_trial({}).inherited
    for p in (plan, plan.for_trial({_keys.OBJECTIVE_REFERENCE: "fcn"})):
        assert TrialPlan.from_dict(p.to_dict()) == p
    assert not TrialPlan.for_study(study, ObjectiveConfig(), PLAN).inherited


class _LeaderLink:
    is_leader = True

    @staticmethod
    def share(value: Any) -> Any:
        return value


def test_the_search_timeout_stops_a_finalist_but_not_a_published_model() -> None:
    """A published model trains to the end of its plan past the search's timeout (its own
    ``max_trial_seconds`` still stops it); a finalist or a budget trial stops."""
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(PLAN))
    plan = TrialPlan.for_study(study, ObjectiveConfig(mode="one-shot"), PLAN)
    core = _objective().core
    link: Any = _LeaderLink()

    def ended() -> bool:
        return True

    finalist = plan.for_trial({_keys.OBJECTIVE_FINALIST_OF: 3})
    published = plan.for_trial({_keys.OBJECTIVE_REFERENCE: "fcn"})
    assert core._over_time(link, None, ended, 1, finalist) == "timeout"
    assert core._over_time(link, None, ended, 1, plan) == "timeout"
    assert core._over_time(link, None, ended, 1, published) is None
    assert core._over_time(link, 0.0, ended, 1, published) == "max_trial_seconds"


def _inherited_study(values: list[tuple[float, float]]) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"])
    dist = {"i": FloatDistribution(0, 1000)}
    for v in values:
        trial = study.ask(dist)
        trial.set_user_attr(_keys.OBJECTIVE_FIDELITY, "inherited")
        study.tell(trial, list(v))
        assert trial.params["i"] is not None
    return study


def test_finalists_of_two_objectives_come_front_by_front() -> None:
    # front 1: trials 0 and 2; front 2: 1 and 3
    study = _inherited_study([(0.9, 10.0), (0.8, 20.0), (0.7, 5.0), (0.6, 6.0)])
    assert enqueue_finalists(study, 3) == [0, 2, 1]
    assert enqueue_finalists(study, 0) == []


def _dominates(a: list[float], b: list[float], signs: list[float]) -> bool:
    return all(s * x <= s * y for x, y, s in zip(a, b, signs)) and any(
        s * x < s * y for x, y, s in zip(a, b, signs)
    )


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=25))
def test_fronts_are_non_dominated_and_each_is_dominated_by_the_one_before(
    values: list[tuple[int, int]],
) -> None:
    trials = [optuna.trial.create_trial(values=[float(a), float(b)]) for a, b in values]
    for i, t in enumerate(trials):
        t.number = i
    directions = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    signs = [-1.0, 1.0]
    layers = fronts(trials, directions)
    assert sorted(t.number for front in layers for t in front) == list(range(len(trials)))
    for k, front in enumerate(layers):
        for t in front:
            assert not any(_dominates(o.values, t.values, signs) for o in front)
            if k:
                assert any(_dominates(o.values, t.values, signs) for o in layers[k - 1])


def test_an_architectures_flops_are_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded FLOPs and the cost-aware scheduler's estimate (``predicted_flops``) share
    one count per architecture, however many trials evaluate it."""
    from optuna_hpcnas.evaluation import _core

    counted: list[int] = []
    count_flops = _core.count_flops

    def counting(model: torch.nn.Module, shape: tuple[int, ...]) -> int:
        counted.append(1)
        return count_flops(model, shape)

    monkeypatch.setattr(_core, "count_flops", counting)
    objective = _objective()
    objective.train_supernet()
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=1)
    params = study.trials[0].params
    for _ in range(2):
        study.enqueue_trial(params)
    study.optimize(objective, n_trials=2)
    flops = {t.user_attrs[_keys.OBJECTIVE_FLOPS] for t in study.trials}
    arch = SPACE.from_params(params)
    assert len(flops) == 1 and objective.core.predicted_flops(arch) == flops.pop() > 0
    assert len(counted) == 1
