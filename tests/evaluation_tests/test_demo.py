from __future__ import annotations

import optuna
import pytest

from optuna_hpcnas import demo
from optuna_hpcnas.pruners import Stage
from optuna_hpcnas.pruners import StagePlan


@pytest.mark.slow
def test_demo_runs_end_to_end_into_sqlite(tmp_path) -> None:
    lines: list[str] = []
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = demo.run_demo(
        storage=url,
        sampler=demo.make_sampler("random", 0),
        n_trials=3,
        timeout=60,
        supernet_epochs=1,
        retrain_steps=3,
        plan=StagePlan(stages=(Stage("quick", 3, 1e-3), Stage("full", 3, 1e-2))),
        warmup_max_batches=3,
        out=lines.append,
    )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert len(study.trials) == 3 and result.complete_trials >= 1
    assert any(line.startswith("open the study: optuna-dashboard sqlite:///") for line in lines)
    assert any("test accuracy" in line for line in lines)
    assert 0.0 < result.retrained_test_accuracy <= 1.0


def test_demo_sampler_choices() -> None:
    assert isinstance(demo.make_sampler("tpe", 1), optuna.samplers.TPESampler)
    assert isinstance(demo.make_sampler("nsga2", 1), optuna.samplers.NSGAIISampler)
    with pytest.raises(ValueError, match="`name` is 'grid'"):
        demo.make_sampler("grid", 0)
    assert [s.name for s in demo.demo_plan().stages] == ["quick", "medium", "full"]


@pytest.mark.slow
def test_demo_writes_its_result_as_json(tmp_path) -> None:
    """``--json`` stores what the README's demo figure is written from."""
    import json

    path = tmp_path / "demo.json"
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    argv = ["--storage", url, "--sampler", "random", "--trials", "2", "--timeout", "20"]
    argv += ["--supernet-epochs", "1", "--retrain-steps", "3", "--json", str(path)]
    demo.main(argv)
    record = json.loads(path.read_text())
    study = optuna.load_study(study_name=record["study_name"], storage=url)
    assert record["trials"] == len(study.trials) == 2
    assert record["complete_trials"] + record["pruned_trials"] == 2
    assert record["test_images"] == 359 and record["timeout_s"] == 20
    assert record["command"].endswith("--json " + str(path))
    assert 0.0 < record["retrained_test_accuracy"] <= 1.0
