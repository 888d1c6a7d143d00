"""The new user's path, typed as a user types it: init -> run -> status -> best -> export,
and one clear line (exit 2, no traceback, no stray files) for each bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

from optuna_hpcnas.cli import main
from optuna_hpcnas.cli import STARTER
from tests.run_configs import tiny_config
from tests.run_configs import write_config

HPCNAS = str(Path(sys.executable).with_name("hpcnas"))


def _hpcnas(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPTUNA_STORAGE"}
    return subprocess.run(
        [HPCNAS, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
    )


def test_run_status_best_export_as_typed(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(study={"name": "typed", "storage": "sqlite:///nas.db", "n_trials": 3}),
    )
    run = _hpcnas("run", "--config", "nas.toml", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "torch uses 1 intra-op thread(s) per process ([training] threads)" in run.stderr
    assert "Supernet warm-up" in run.stderr and "study 'typed':" in run.stdout
    status = _hpcnas("status", "--config", str(config), "--json", cwd=tmp_path)
    info = json.loads(status.stdout)
    assert info["trials"] == 3 and info["by_state"]["WAITING"] == 0
    assert set(info["utilisation"]) == {"0"}
    best = _hpcnas("best", "--config", str(config), cwd=tmp_path)
    assert best.returncode == 0 and "top" in best.stdout
    export = _hpcnas("export", "--config", str(config), "--out", "best", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-2000:]
    assert "test accuracy" in export.stdout
    # export trains with the config's [training] threads too, not the node's share
    assert "torch uses 1 intra-op thread(s) per process ([training] threads)" in export.stderr
    assert "torchvision" not in export.stderr  # the ONNX exporter's registry is quiet
    meta = json.loads((tmp_path / "best" / "architecture.json").read_text())
    assert meta["export"]["mode"] == "retrain" and meta["export"]["steps"] == 6
    assert 0.0 <= meta["export"]["test_accuracy"] <= 1.0
    assert (tmp_path / "best" / "model.pt2").is_file()
    # nothing but the database and the export in the working directory: no lock files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "nas.db", "nas.toml"]


def test_exports_are_trained_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    config = write_config(
        tmp_path / "nas.toml",
        tiny_config(study={"name": "e", "storage": url, "n_trials": 2}, pruner={"name": "none"}),
    )
    assert main(["run", "--config", str(config), "--no-progress"]) == 0
    capsys.readouterr()
    assert (
        main(["export", "--config", str(config), "--out", str(tmp_path / "u"), "--untrained"]) == 0
    )
    untrained = json.loads((tmp_path / "u" / "architecture.json").read_text())["export"]
    assert untrained["mode"] == "untrained" and untrained["steps"] == 0
    out = tmp_path / "r"
    args = ["export", "--storage", url, "--out", str(out), "--steps", "100", "--no-onnx"]
    assert main(args) == 0
    assert "(retrain, 107 steps of 56, Adam lr 0.00374, on train + validation)" in (
        capsys.readouterr().out
    )  # the auto batch and the rate and steps that follow it, as trained
    trained = json.loads((out / "architecture.json").read_text())["export"]
    # the study recorded its data set, so --storage alone is enough
    # 100 steps of a batch of 64 are 107 of the auto batch of 56 (560 samples): x sqrt(64 / 56)
    assert trained["mode"] == "retrain" and trained["steps"] == 107 and trained["data"] == "digits"
    assert trained["test_accuracy"] > untrained["test_accuracy"]
    capsys.readouterr()
    code = main(["export", "--storage", url, "--out", str(tmp_path / "f"), "--finetune"])
    err = capsys.readouterr().err
    assert code == 2 and "--finetune needs supernet weights" in err
    (tmp_path / "w.pt").write_text("not a torch file")
    code = main(["export", "--storage", url, "--finetune", "--weights", str(tmp_path / "w.pt")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a supernet state_dict" in err and "Traceback" not in err


def test_init_writes_a_starter_for_each_preset(tmp_path: Path) -> None:
    from optuna_hpcnas.cli import starter
    from optuna_hpcnas.config import load_config

    target = tmp_path / "signals.toml"
    assert main(["init", "--preset", "signal-1d", "--out", str(target)]) == 0
    assert target.read_text() == starter("signal-1d")
    config = load_config(str(target))
    assert config.data.name == "mnist1d" and config.space.preset == "signal-1d"
    assert config.space.build().domain == "sequence"
    from optuna_hpcnas.search_space import reference_models

    published = reference_models("signal-1d")  # the search starts from the FCN and the CNN
    assert config.enqueued_params() == [published["fcn"], published["cnn"]]


def test_the_elastic_starter_is_a_one_shot_search_from_the_fcn_and_a_resnet(
    tmp_path: Path,
) -> None:
    from optuna_hpcnas.cli import starter
    from optuna_hpcnas.config import load_config
    from optuna_hpcnas.search_space import reference_models

    target = tmp_path / "elastic.toml"
    assert main(["init", "--preset", "signal-elastic", "--out", str(target)]) == 0
    assert target.read_text() == starter("signal-elastic")
    config = load_config(str(target))
    assert config.space.preset == "signal-elastic" and config.objective.mode == "one-shot"
    assert config.training.supernet.sandwich and config.training.supernet.distillation > 0
    published = reference_models("signal-elastic")
    assert config.enqueued_params() == [published["fcn"], published["resnet"]]


def test_the_image_elastic_starter_scores_by_inherited_weights_then_trains_finalists(
    tmp_path: Path,
) -> None:
    """``hpcnas init --preset digits-elastic`` writes a one-shot search that runs as written
    (its budget, warm-up, stages and export shortened): inherited candidates, then the
    finalists trained through the stages, and an export."""
    from optuna_hpcnas import _keys
    from optuna_hpcnas.cli import starter
    from optuna_hpcnas.config import load_config
    from optuna_hpcnas.config import tomllib

    target = tmp_path / "nas.toml"
    assert main(["init", "--preset", "digits-elastic", "--out", str(target)]) == 0
    assert target.read_text() == starter("digits-elastic")
    config = load_config(str(target))
    assert config.space.preset == "digits-elastic" and config.objective.mode == "one-shot"
    assert config.training.supernet.sandwich and config.training.supernet.distillation > 0
    table = tomllib.loads(target.read_text())
    table["study"]["n_trials"] = 6
    table["training"]["epochs"] = 1
    table["objective"]["finalists"] = 2
    for stage in table["stages"]["stages"]:
        stage["steps"] = 10
    table["stages"]["eval_every"] = 10
    table["export"]["steps"] = 100
    write_config(target, table)
    run = _hpcnas("run", "--config", "nas.toml", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    import optuna

    study = optuna.load_study(study_name="digits-elastic", storage="sqlite:///" + str(
        tmp_path / "nas.db"))  # fmt: skip
    fidelity = [t.user_attrs.get(_keys.OBJECTIVE_FIDELITY) for t in study.trials]
    assert fidelity == ["inherited"] * 4 + ["trained"] * 2, fidelity
    export = _hpcnas("export", "--config", "nas.toml", "--out", "best", "--no-onnx", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-2000:]
    assert "test accuracy" in export.stdout + export.stderr


def test_init_writes_a_starter_that_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "nas.toml"
    assert main(["init", "--out", str(target)]) == 0
    assert target.read_text() == STARTER
    from optuna_hpcnas.config import load_config

    config = load_config(target)  # every key of the starter is valid
    assert config.sampler.name == "evolutionary" and config.pruner.name == "staged"
    assert main(["init", "--out", str(target)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["init", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--config", "{tmp}"], "is a directory, not a TOML file"),
        (["run", "--config", "{tmp}/missing.toml"], "does not exist"),
        (["run", "--config", "{cfg}", "--storage", "sqlite:///{tmp}/no/dir/x.db"], "directory"),
        (["run", "--config", "{cfg}", "--storage", "sqlite:///{tmp}/text.txt"], "not a SQLite"),
        (["run", "--config", "{cfg}", "--storage", "sqlite:///{tmp}"], "is a directory"),
        (
            ["run", "--config", "{cfg}", "--storage", "postgresql+psycopg://u@127.0.0.1:1/x"],
            "annot open storage",
        ),
        (["status", "--storage", "sqlite:///{tmp}/absent.db"], "no such SQLite file"),
        (["dashboard", "--storage", "sqlite:///{tmp}/text.txt"], "not a SQLite"),
        (["run", "--config", "{empty}"], "[study] table is missing"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "text.txt").write_text("hello")
    (tmp_path / "empty.toml").write_text("")
    cfg = write_config(tmp_path / "nas.toml", tiny_config())
    before = sorted(p.name for p in tmp_path.iterdir())
    filled = [a.format(tmp=tmp_path, cfg=cfg, empty=tmp_path / "empty.toml") for a in args]
    assert main(filled) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no partial files
    assert (tmp_path / "text.txt").read_text() == "hello"


def test_every_subcommand_and_flag_has_help() -> None:
    from optuna_hpcnas.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, sub_parser in sub.choices.items():  # type: ignore[union-attr]
        assert sub_parser.description, name
        for action in sub_parser._actions:
            assert action.help, f"hpcnas {name} {action.option_strings or action.dest}"
