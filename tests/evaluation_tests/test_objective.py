from __future__ import annotations

import gc
import math
from typing import Any
import weakref

import optuna
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import TensorDataset

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.data import make_sequence_task
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation import _core
from optuna_hpcnas.evaluation import LatencyPredictor
from optuna_hpcnas.evaluation import ObjectiveConfig
from optuna_hpcnas.evaluation import SupernetObjective
from optuna_hpcnas.pruners import Stage
from optuna_hpcnas.pruners import StagedPruner
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.supernet import SupernetTrainingConfig

SPACE = HierarchicalSearchSpace(
    num_cells=2, operators=("conv3x3", "maxpool3x3", "identity"), widths=(4, 8)
)
# 60 samples in batches of 32: a pass is 2 steps; validated after every step
PLAN = StagePlan(
    stages=(Stage("quick", 2, 1e-3, promote=0.5), Stage("full", 4, 1e-2)), eval_every=1
)


def _task(n: int = 60, *, nan: bool = False) -> TaskData:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 1, 6, 6, generator=g) + y[:, None, None, None].float()
    if nan:
        x[:] = float("nan")
    ds = TensorDataset(x, y)
    return TaskData(ds, ds, ds, input_shape=(1, 6, 6), num_classes=3)


def _objective_for(data: TaskData, **config: Any) -> SupernetObjective:
    return SupernetObjective(
        SPACE,
        data,
        training=SupernetTrainingConfig(paths_per_batch=2, batch_size=32, epochs=1),
        plan=PLAN,
        config=ObjectiveConfig(latency_repeats=1, batch_size=32, **config),
    )


def test_staged_search_records_architecture_costs_and_stage() -> None:
    objective = _objective_for(_task())
    objective.train_supernet()
    study = optuna.create_study(direction="maximize", pruner=StagedPruner(PLAN))
    study.optimize(objective, n_trials=4)
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.COMPLETE in states
    for t in study.trials:
        ua = t.user_attrs
        assert SPACE.contains(optuna_hpcnas_arch(ua[_keys.OBJECTIVE_ARCH]))
        assert ua["flops"] >= 0 and ua["params"] > 0 and ua["latency_s"] > 0
        assert ua["predicted_latency_s"] > 0 and 0 <= ua["inherited_accuracy"] <= 1
        assert ua["stage"] in ("quick", "full")
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert ua["stage"] == "full" and ua["steps"] == 6
            assert sorted(t.intermediate_values) == [1, 2, 3, 4, 5, 6]
            assert t.value == t.intermediate_values[6]  # the last value, not the best
        else:
            assert ua["stage"] == "quick" and t.last_step == 2


def optuna_hpcnas_arch(text: str) -> Any:
    from optuna_hpcnas import Architecture

    return Architecture.from_json(text)


@pytest.mark.parametrize("skip,steps", [(False, 2), (True, 0)])
def test_scalarised_value_and_hard_limits(skip: bool, steps: int) -> None:
    objective = _objective_for(
        _task(), flops_weight=0.01, max_flops=1.0, last_stage="quick", skip_infeasible=skip
    )
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=2)
    for t in study.trials:
        ua = t.user_attrs
        expected = ua["accuracy"] + 0.01 * math.log(1.0 / max(ua["flops"], 1.0))
        # less than half a validation sample is taken off for the log-loss (ties)
        assert expected - 0.5 / 60 < t.value <= expected
        assert ua["steps"] == steps  # an infeasible candidate is not fine-tuned when skipped
        constraint = t.system_attrs["constraints:hpcnas.max_flops"]
        assert constraint == pytest.approx(ua["flops"] / 1.0 - 1.0)


def test_multi_objective_returns_every_objective() -> None:
    objective = _objective_for(
        _task(), objectives=("accuracy", "flops", "params", "latency"), latency="predicted"
    )
    assert objective.directions == ["maximize", "minimize", "minimize", "minimize"]
    study = optuna.create_study(directions=objective.directions)
    study.optimize(objective, n_trials=2)
    for t in study.trials:
        ua = t.user_attrs
        assert t.values == [ua["accuracy"], ua["flops"], ua["params"], ua["predicted_latency_s"]]
        assert ua["steps"] == 6  # both stages of PLAN when no pruner stops it


@pytest.mark.parametrize("on_nan,state", [("fail", "FAIL"), ("prune", "PRUNED")])
def test_non_finite_loss_ends_the_trial_with_a_reason(on_nan: str, state: str) -> None:
    objective = _objective_for(_task(nan=True), on_nan=on_nan)
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=2)  # the study goes on
    assert [t.state.name for t in study.trials] == [state, state]
    assert "non-finite loss" in study.trials[0].user_attrs[_keys.OBJECTIVE_FAIL_REASON]


def test_out_of_memory_fails_only_that_trial_and_frees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    objective = _objective_for(_task(), last_stage="quick")
    seen: list[weakref.ref] = []
    real = _core.train_step

    def flaky(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not seen:
            seen.append(weakref.ref(model))
            raise torch.OutOfMemoryError("injected: out of memory")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(_core, "train_step", flaky)
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=2)
    first, second = study.trials
    assert first.state == optuna.trial.TrialState.FAIL
    assert "out of memory" in first.user_attrs[_keys.OBJECTIVE_FAIL_REASON]
    gc.collect()
    assert seen[0]() is None  # the failed subnet was released
    assert second.state == optuna.trial.TrialState.COMPLETE


def test_a_real_cpu_allocation_failure_fails_only_that_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator: can't allocate
    memory"), not torch.OutOfMemoryError: a real failed allocation, not an injected one."""
    objective = _objective_for(_task(), last_stage="quick")
    real = _core.train_step
    calls: list[int] = []

    def allocate_too_much(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            torch.empty(2**50, dtype=torch.uint8)  # a petabyte
        return real(*args, **kwargs)

    monkeypatch.setattr(_core, "train_step", allocate_too_much)
    study = optuna.create_study(direction="maximize")
    study.optimize(objective, n_trials=2)
    first, second = study.trials
    assert first.state == optuna.trial.TrialState.FAIL
    reason = first.user_attrs[_keys.OBJECTIVE_FAIL_REASON]
    assert reason.startswith("out of memory") and "allocate" in reason
    assert second.state == optuna.trial.TrialState.COMPLETE


def test_a_non_finite_objective_value_fails_the_trial() -> None:
    objective = _objective_for(
        _task(), last_stage="quick", objectives=("accuracy", "latency"), latency="predicted"
    )
    objective.core.predictor.predict = lambda arch: float("nan")  # type: ignore[method-assign]
    study = optuna.create_study(directions=objective.directions)
    study.optimize(objective, n_trials=1)
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.FAIL
    assert (
        "non-finite objective value (latency=nan)" in trial.user_attrs[_keys.OBJECTIVE_FAIL_REASON]
    )


def test_data_that_does_not_fit_fails_before_training() -> None:
    with pytest.raises(ValueError, match="'sequence' task"):
        SupernetObjective(SPACE, make_sequence_task(num_samples=60, num_classes=3))
    good = _task()
    wrong = TaskData(good.train, good.valid, good.test, input_shape=(1, 8, 8), num_classes=3)
    with pytest.raises(ValueError, match=r"shape \(1, 6, 6\)"):
        SupernetObjective(SPACE, wrong)
    with pytest.raises(ValueError, match="objectives"):
        ObjectiveConfig(objectives=("accuracy", "energy"))
    with pytest.raises(ValueError, match="scalarise"):
        ObjectiveConfig(objectives=("accuracy", "flops"), flops_weight=0.1)


def test_latency_predictor_is_a_per_layer_table() -> None:
    objective = _objective_for(_task())
    predictor = LatencyPredictor(objective.supernet, repeats=2)
    archs = list(SPACE.enumerate())[:6]
    added = predictor.calibrate(archs)
    assert added == len(predictor.table) > 0
    assert predictor.calibrate(archs) == 0  # nothing new to measure
    arch = archs[3]
    assert predictor.predict(arch) == pytest.approx(
        sum(v for k, v in predictor.table.items() if k in predictor._keys(arch))
    )
    copy = LatencyPredictor(objective.supernet)
    copy.load_table(predictor.table)
    assert copy.predict(arch) == predictor.predict(arch)


def test_lazy_top_level_objective() -> None:
    import optuna_hpcnas

    assert optuna_hpcnas.SupernetObjective is SupernetObjective


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_stage_schedule_sets_each_batchs_learning_rate(schedule: str) -> None:
    objective = _objective_for(
        _task(), optimizer="adam", stage_schedule=schedule, last_stage="full"
    )
    objective.train_supernet()
    lrs: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"])
    )
    try:
        study = optuna.create_study(direction="maximize")
        study.optimize(objective, n_trials=1)
    finally:
        handle.remove()
    # quick is 2 steps, full 4
    assert len(lrs) == 6
    quick, full = lrs[:2], lrs[2:]
    if schedule == "constant":
        assert quick == [1e-3, 1e-3] and full == [1e-2] * 4
    else:
        assert quick[0] == pytest.approx(1e-3) and quick[1] == pytest.approx(5e-4)
        assert full[0] == pytest.approx(1e-2)
        assert all(a > b > 0 for a, b in zip(full, full[1:]))


def test_accuracy_ties_rank_by_log_loss_and_never_above_a_better_accuracy() -> None:
    core = _objective_for(_task()).core
    n = core.folds.validation_size
    sure, unsure = (core._scalar({"accuracy": 0.8, "loss": loss}) for loss in (0.1, 2.0))
    assert 0.8 - 0.5 / n < unsure < sure <= 0.8
    assert core._scalar({"accuracy": 0.8 + 1 / n, "loss": 50.0}) > sure


def test_a_time_cap_prunes_the_trial_where_it_is() -> None:
    """A trial past ``max_trial_seconds`` did not reach the end of its plan: it is pruned
    (its value would not compare with those that did), at the step it reached. A published
    model stops there too, but completes with its value at that step: it stays the floor
    the export may fall back on."""
    objective = _objective_for(_task(), last_stage="full", max_trial_seconds=1e-9)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs={_keys.OBJECTIVE_REFERENCE: "fcn"})  # never pruned
    study.optimize(objective, n_trials=2)
    reference, capped = study.trials
    assert reference.state == optuna.trial.TrialState.COMPLETE
    assert reference.user_attrs["time_capped"] == 1 and reference.user_attrs["steps"] == 1
    assert 0.0 <= reference.user_attrs["accuracy"] <= 1.0
    assert reference.value == pytest.approx(
        objective.core._scalar({"accuracy": reference.user_attrs["accuracy"], "loss": 0.0}),
        abs=0.5 / objective.core.folds.validation_size,
    )
    assert capped.state == optuna.trial.TrialState.PRUNED
    assert capped.user_attrs["time_capped"] == 1 and not capped.intermediate_values


def test_a_published_model_under_its_cap_runs_every_step() -> None:
    objective = _objective_for(_task(), last_stage="full", max_trial_seconds=600.0)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs={_keys.OBJECTIVE_REFERENCE: "fcn"})
    study.optimize(objective, n_trials=1)
    (reference,) = study.trials
    assert reference.user_attrs["steps"] == 6 and "time_capped" not in reference.user_attrs


def test_stage_schedule_is_validated() -> None:
    with pytest.raises(ValueError, match="'linear'"):
        ObjectiveConfig(stage_schedule="linear")


def test_a_published_model_goes_through_every_stage_whatever_the_pruner_says() -> None:
    objective = _objective_for(_task())
    # every report is below the threshold: the pruner says "prune" at the first one
    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=2.0)
    )
    study.enqueue_trial({}, user_attrs={_keys.OBJECTIVE_REFERENCE: "fcn"})
    study.optimize(objective, n_trials=2)
    reference, other = study.trials
    assert reference.state == optuna.trial.TrialState.COMPLETE
    assert reference.user_attrs["steps"] == 6 and reference.last_step == 6
    assert other.state == optuna.trial.TrialState.PRUNED and other.last_step == 1
    assert reference.user_attrs[_keys.OBJECTIVE_VALIDATION_SAMPLES] == 60


def test_small_data_is_cross_validated_and_said_so(caplog: pytest.LogCaptureFixture) -> None:
    """8 samples of 3 classes: the holdout cannot rank, so 5 folds of train + validation
    (here twice the same 8 samples) pool 16 predictions, and the run warns it is too few."""
    import logging

    with caplog.at_level(logging.INFO, logger="optuna_hpcnas.evaluation._core"):
        core = _objective_for(_task(8)).core
    assert core.folds.kind == "cross-validation" and len(core.folds.splits) == 5
    assert core.folds.validation_size == 16
    assert "a holdout of 8 samples is too few to rank" in caplog.text
    assert "Only 16 samples score each candidate" in caplog.text
    assert core.warm_up() == []  # no warm-up: the shared weights would see every fold
    roomy = _objective_for(_task(60)).core
    assert roomy.folds.kind == "holdout" and roomy.folds.validation_size == 60


def test_the_objective_sets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # "auto": the environment's figure wins
        SupernetObjective(SPACE, _task())
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        SupernetObjective(SPACE, _task(), threads=None)  # a caller that set it itself
        assert torch.get_num_threads() == 2
        SupernetObjective(SPACE, _task(), threads=1)
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="threads"):
            SupernetObjective(SPACE, _task(), threads=0)
    finally:
        torch.set_num_threads(before)
