"""``run_search`` in one process: the composition root over the one evaluation core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import torch

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.config import config_from_dict
from optuna_hpcnas.evaluation import _core
from optuna_hpcnas.run import run_search
from optuna_hpcnas.run import thread_share
from optuna_hpcnas.run import utilisation_from_study
from tests.run_configs import tiny_config

COMPLETE, PRUNED, FAIL = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)


def _run(tmp_path: Path, **sections: dict[str, Any]) -> optuna.Study:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    study = {"storage": url, **sections.pop("study", {})}
    config = config_from_dict(tiny_config(study=study, **sections))
    run_search(config)
    return optuna.load_study(study_name=config.study.name, storage=url)


def test_single_process_search_offers_only_layouts_it_can_run(tmp_path: Path) -> None:
    study = _run(
        tmp_path,
        study={"n_trials": 6},
        space={"overrides": {"data_parallel": [1, 2]}},
        pruner={"name": "none"},
    )
    trials = study.get_trials()
    assert len(trials) == 6 and all(t.state == COMPLETE for t in trials)
    for t in trials:
        # one process runs dp 1 x pp 1 only: the layout is constant, never suggested
        assert "cluster.data_parallel" not in t.params
        assert _keys.DISTRIBUTED_INFEASIBLE not in t.system_attrs
        assert t.system_attrs[_keys.DISTRIBUTED_LAYOUT] == "dp1xpp1 on 1 ranks (plain)"
        assert t.system_attrs[_keys.DISTRIBUTED_EVALUATION_SECONDS] > 0
        # the core's records: costs, inherited score, every round reported (by its step)
        ua = t.user_attrs
        assert ua["flops"] > 0 and ua["params"] > 0 and 0 <= ua["inherited_accuracy"] <= 1
        assert sorted(t.intermediate_values) == [3, 6] and ua["steps"] == 6
    runs = utilisation_from_study(study)
    assert len(runs) == 1 and runs[0]["ranks"][0]["rank"] == 0
    # rerunning adds the new budget on top (the study is loaded, not recreated)
    study = _run(
        tmp_path,
        study={"n_trials": 2},
        space={"overrides": {"data_parallel": [1, 2]}},
        pruner={"name": "none"},
    )
    assert len(study.get_trials()) == 8
    assert len(utilisation_from_study(study)) == 2


def test_staged_plan_drives_steps_and_pruning(tmp_path: Path) -> None:
    study = _run(tmp_path, study={"n_trials": 6}, sampler={"name": "random", "seed": 1})
    trials = study.get_trials()
    states = {t.state for t in trials}
    assert states <= {COMPLETE, PRUNED} and PRUNED in states
    for t in trials:
        steps = t.user_attrs[_keys.OBJECTIVE_STEPS]
        if t.state == COMPLETE:
            assert steps == 6 and t.user_attrs[_keys.OBJECTIVE_STAGE] == "medium"
            assert t.values[0] == t.intermediate_values[6]  # the value at the last step
        else:
            assert steps == 3 and t.user_attrs[_keys.OBJECTIVE_STAGE] == "quick"


@pytest.mark.parametrize("name", ["evolutionary", "qubo"])
def test_the_configured_sampler_breeds_the_trials(tmp_path: Path, name: str) -> None:
    kwargs = {"population_size": 4} if name == "evolutionary" else {"n_startup_trials": 3}
    study = _run(
        tmp_path,
        study={"n_trials": 8},
        sampler={"name": name, "seed": 0, "kwargs": kwargs},
        pruner={"name": "none"},
        stages={"stages": [{"name": "quick", "steps": 1, "lr": 1e-3}]},
    )
    trials = study.get_trials()
    assert len(trials) == 8
    if name == "evolutionary":
        origins = [t.system_attrs.get(_keys.EVOLUTION_ORIGIN) for t in trials]
        assert all(o is not None for o in origins)
        operations = {o["operation"] for o in origins}
        assert operations - {"random"}, f"only random trials: {operations}"
    else:
        infos = [t.system_attrs.get(_keys.QUBO_INFO) for t in trials[3:]]
        assert all(i is not None for i in infos)
        assert any(not i.get("fallback") for i in infos)


def test_out_of_memory_fails_that_trial_only_and_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _core.train_step
    calls = {"n": 0}

    def flaky(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the first trial's second step
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(_core, "train_step", flaky)
    study = _run(tmp_path, study={"n_trials": 3}, pruner={"name": "none"})
    trials = study.get_trials()
    assert [t.state for t in trials] == [FAIL, COMPLETE, COMPLETE]  # no WAITING retry
    assert "out of memory" in trials[0].user_attrs[_keys.OBJECTIVE_FAIL_REASON]


def test_non_finite_loss_fails_the_trial_and_the_search_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optuna_hpcnas.supernet import StepResult

    real = _core.train_step
    calls = {"n": 0}

    def nan_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            return StepResult(float("nan"), False, 1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_core, "train_step", nan_once)
    study = _run(tmp_path, study={"n_trials": 2}, pruner={"name": "none"})
    first, second = study.get_trials()
    assert first.state == FAIL and "non-finite loss" in first.user_attrs["fail_reason"]
    assert second.state == COMPLETE


def test_hard_limits_are_constraints_in_the_run(tmp_path: Path) -> None:
    study = _run(
        tmp_path,
        study={"n_trials": 4},
        pruner={"name": "none"},
        objective={"max_params": 1500.0},
    )
    for t in study.get_trials():
        excess = t.system_attrs["constraints:hpcnas.max_params"]
        assert excess == pytest.approx(t.user_attrs["params"] / 1500.0 - 1.0)
        if excess > 0:  # skipped: inherited score, no step
            assert t.user_attrs["steps"] == 0 and not t.intermediate_values


def test_cost_aware_scheduler_runs_the_costliest_waiting_candidate_first(tmp_path: Path) -> None:
    study = _run(
        tmp_path,
        study={"n_trials": 4, "directions": ["minimize"]},
        sampler={"name": "random", "seed": 2},
        objective={"objectives": ["flops"]},
        pruner={"name": "none"},
        distributed={"scheduler": "cost_aware", "lookahead": 4},
    )
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state == COMPLETE for t in trials)
    # all four were asked before any ran; they ran (and finished) in decreasing FLOPs
    by_finish = sorted(trials, key=lambda t: t.datetime_complete)
    flops = [t.values[0] for t in by_finish]
    assert flops == sorted(flops, reverse=True)


def test_thread_share_prefers_config_then_omp_then_cores() -> None:
    assert thread_share(requested=3, ranks_on_node=4, environ={"OMP_NUM_THREADS": "2"})[0] == 3
    assert thread_share(requested=None, ranks_on_node=4, environ={"OMP_NUM_THREADS": "2"})[0] == 2
    from optuna_hpcnas._threads import available_cores

    share, source = thread_share(requested=None, ranks_on_node=2, environ={})
    assert share == max(1, available_cores() // 2) and "rank(s) on this node" in source
    assert thread_share(requested=None, ranks_on_node=10**6, environ={})[0] == 1


def test_budget_trials_carry_no_fixed_params(tmp_path: Path) -> None:
    from optuna_hpcnas import _records

    study = optuna.create_study()
    _records.add_budget(study, 3)
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 3 and all("fixed_params" not in t.system_attrs for t in waiting)
    space = HierarchicalSearchSpace.preset("digits-small")
    trial = _records.pop_waiting_trial(study)
    assert trial is not None and trial.number == 0
    assert space.contains(space.suggest(trial))


def test_deployed_latency_as_the_objective_and_a_target_space(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the deploy extra is not installed")
    study = _run(
        tmp_path,
        study={"n_trials": 3},
        space={"target": "npu-no-grouped"},
        pruner={"name": "none"},
        objective={"latency": "onnx-int8", "latency_repeats": 3, "max_latency_s": 10.0},
    )
    for t in study.get_trials():
        ua = t.user_attrs
        assert ua["onnx_int8_latency_s"] > 0
        # the hard limit bounds the deployed (INT8 onnxruntime) latency
        excess = t.system_attrs["constraints:hpcnas.max_latency_s"]
        assert excess == pytest.approx(ua["onnx_int8_latency_s"] / 10.0 - 1.0)
        assert ua["predicted_latency_s"] > 0  # the per-layer predictor, fitted on them
        # the NPU target has no grouped or depthwise convolutions
        ops = [v for k, v in t.params.items() if k.endswith(".op")]
        assert ops and not any(op.startswith(("sepconv", "dilconv")) for op in ops)


def test_asking_ahead_overlaps_the_ask_and_a_timeout_gives_the_asked_trial_back(
    tmp_path: Path,
) -> None:
    sections: dict[str, Any] = {
        "pruner": {"name": "none"},
        "distributed": {"ask_ahead": "on"},
    }
    study = _run(tmp_path, study={"name": "ahead", "n_trials": 4}, **sections)
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    assert [t.state for t in trials] == [COMPLETE] * 4
    for previous, following in zip(trials, trials[1:]):  # asked while the previous one ran
        assert following.datetime_start < previous.datetime_complete
    (rank,) = utilisation_from_study(study)[-1]["ranks"]
    assert rank["storage_thread"]["sampler"] > 0 and rank["storage_thread"]["storage"] > 0

    # The timeout ends the run while the next trial is asked: it goes back to the queue with
    # its architecture, and the resumed run evaluates that architecture.
    timed = {"name": "timed", "n_trials": 6}
    sections["stages"] = {
        "stages": [
            {"name": "quick", "steps": 60, "lr": 1e-3},
            {"name": "full", "steps": 60, "lr": 1e-2},
        ],
        "eval_every": 60,
    }
    sections["data"] = {"max_samples": 1797}
    study = _run(tmp_path, study={**timed, "timeout": 1.0}, **sections)
    by_state = {s: study.get_trials(states=(s,)) for s in optuna.trial.TrialState}
    # a trial still training at the timeout stopped there (pruned)
    assert all(_keys.OBJECTIVE_SEARCH_ENDED in t.user_attrs for t in by_state[PRUNED])
    done = sorted(t.number for t in by_state[COMPLETE] + by_state[PRUNED])
    assert done == list(range(len(done))) and 0 < len(done) < 6 and by_state[COMPLETE]
    assert not by_state[optuna.trial.TrialState.RUNNING]
    asked = [t for t in by_state[optuna.trial.TrialState.WAITING] if t.params]
    assert [t.number for t in asked] == [len(done)]
    study = _run(tmp_path, study=timed, **sections)  # resumes the queue, adds nothing
    trials = study.get_trials()
    assert len(trials) == 6 and all(t.state.is_finished() for t in trials)
    assert all(t.state == COMPLETE for t in trials[len(done) :])
    assert trials[len(done)].params == asked[0].params


def test_the_timeout_stops_a_trial_at_its_next_validation_once_a_trial_completed(
    tmp_path: Path,
) -> None:
    """Past the timeout a trial still training stops at its next validation, pruned; a
    published model trains to the end of its plan (the export compares the search's pick
    with it fully trained). A search whose timeout comes before any trial completed lets its
    first trial finish, so that it leaves a model to export."""
    sections: dict[str, Any] = {
        "pruner": {"name": "none"},
        "stages": {
            "stages": [
                {"name": "quick", "steps": 40, "lr": 1e-3},
                {"name": "full", "steps": 40, "lr": 1e-2},
            ],
            "eval_every": 10,
        },
    }
    timed = {"n_trials": 2, "timeout": 0.05}
    study = _run(tmp_path, study=timed, **sections)  # a trial takes about a second
    first, waiting = study.trials
    assert first.state == COMPLETE and first.user_attrs["steps"] == 80
    assert _keys.OBJECTIVE_SEARCH_ENDED not in first.user_attrs
    assert waiting.state == optuna.trial.TrialState.WAITING

    study.enqueue_trial(
        {"node.topology": "chain", "node.cell0.op": "identity", "node.cell1.op": "identity"}
        | {"node.cell2.op": "maxpool3x3"},
        user_attrs={_keys.OBJECTIVE_REFERENCE: "chain"},
    )
    study = _run(tmp_path, study={**timed, "n_trials": None}, **sections)  # resumes: no budget
    trials = sorted(study.trials, key=lambda t: t.number)
    stopped = [t for t in trials if _keys.OBJECTIVE_SEARCH_ENDED in t.user_attrs]
    assert [t.state for t in stopped] == [PRUNED]  # the budget trial, run first
    (pruned,) = stopped
    assert pruned.user_attrs[_keys.OBJECTIVE_SEARCH_ENDED] % 10 == 0
    assert pruned.user_attrs[_keys.OBJECTIVE_SEARCH_ENDED] < 80

    study = _run(tmp_path, study={**timed, "n_trials": None}, **sections)
    published = next(t for t in study.trials if _keys.OBJECTIVE_REFERENCE in t.user_attrs)
    assert published.state == COMPLETE
    assert published.user_attrs["steps"] == 80
    assert _keys.OBJECTIVE_SEARCH_ENDED not in published.user_attrs


def test_enqueued_models_are_the_first_trials_of_a_new_study_only(tmp_path: Path) -> None:
    first = {"node.topology": "chain", "node.cell0.op": "identity", "node.cell1.op": "identity"}
    first["node.cell2.op"] = "maxpool3x3"
    study = _run(tmp_path, study={"n_trials": 3, "enqueue": [first]})
    trials = sorted(study.trials, key=lambda t: t.number)
    assert len(trials) == 3 and trials[0].params == first
    assert all(t.state.is_finished() for t in trials)
    assert ["fixed_params" in t.system_attrs for t in trials] == [True, False, False]
    # A second run on the same study adds its budget without the enqueued model again.
    again = _run(tmp_path, study={"n_trials": 2, "enqueue": [first]})
    assert len(again.trials) == 5
    assert sum("fixed_params" in t.system_attrs for t in again.trials) == 1


def test_enqueue_names_a_published_model_of_the_preset() -> None:
    from optuna_hpcnas.config import ConfigError
    from optuna_hpcnas.search_space import reference_models
    from optuna_hpcnas.search_space import SIGNAL_1D_BASELINES
    from optuna_hpcnas.search_space import SIGNAL_1D_PAPER_MODELS

    signal = tiny_config(
        study={"enqueue": ["cnn", "gru", "fcn"]},
        space={"preset": "signal-1d"},
        data={"name": "mnist1d"},
    )
    assert config_from_dict(signal).enqueued_params() == [
        SIGNAL_1D_PAPER_MODELS["cnn"],
        SIGNAL_1D_PAPER_MODELS["gru"],
        SIGNAL_1D_BASELINES["fcn"],
    ]
    assert sorted(reference_models("signal-1d")) == ["cnn", "fcn", "gru", "mlp"]
    assert reference_models("digits-small") == {}
    with pytest.raises(ConfigError, match="'cnn' is not a published model of the digits-small"):
        config_from_dict(tiny_config(study={"enqueue": ["cnn"]}))
    with pytest.raises(ConfigError, match="node.topology"):
        config_from_dict(tiny_config(study={"enqueue": [{"node.topology": "ring"}]}))
    with pytest.raises(ConfigError, match="`enqueue` must be a list"):
        config_from_dict(tiny_config(study={"enqueue": "cnn"}))


def test_published_models_are_named_in_the_study_and_run_protected(tmp_path: Path) -> None:
    """``[study] enqueue = ["fcn", "cnn"]``: the trials carry ``reference_model`` (the
    dashboard shows it, the export compares with it) and their plan is protected."""
    from optuna_hpcnas.evaluation import TrialPlan
    from optuna_hpcnas.pruners import StagePlan

    rng = np.random.default_rng(0)
    y = np.arange(80) % 2
    x = (rng.normal(size=(80, 40)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "signals.npz", x_train=x, y_train=y)
    study = _run(
        tmp_path,
        study={"n_trials": 3, "enqueue": ["fcn", "cnn"]},
        space={"preset": "signal-1d"},
        data={"name": "npz", "path": str(tmp_path / "signals.npz")},
        pruner={"name": "none"},
    )
    trials = sorted(study.trials, key=lambda t: t.number)
    names = [t.user_attrs.get(_keys.OBJECTIVE_REFERENCE) for t in trials]
    assert names == ["fcn", "cnn", None]
    assert all(t.state == COMPLETE for t in trials)
    plan = TrialPlan(StagePlan(), 100, report=True, maximize=True)
    assert plan.for_trial(trials[0].user_attrs).protected
    assert plan.for_trial(trials[2].user_attrs) is plan
