from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import optuna
import pytest

from optuna_hpcnas import Architecture
from optuna_hpcnas.cli import main
from tests.cli_tests.conftest import make_study

REPO = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_text_and_json(
    single_study: tuple[str, optuna.Study], capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite_url, study = single_study
    from optuna_hpcnas._records import add_budget

    add_budget(study, 8)  # a run's remaining budget: 8 WAITING trials on top of 12 finished
    # rank 0 a record with its loop's shares (printed), rank 1 an older one without (the
    # whole process's share is printed)
    runs = [{"ranks": [
        {"rank": 0, "shares": {"compute": 0.6}, "loop_shares": {"compute": 0.971}},
        {"rank": 1, "shares": {"compute": 0.9}},
    ]}]  # fmt: skip
    study._storage.set_study_system_attr(
        study._study_id, "hpcnas:distributed:utilisation", json.dumps(runs)
    )
    code, out, _ = _run(capsys, "status", "--storage", sqlite_url)
    assert code == 0
    assert "study        digits" in out
    assert "maximize accuracy" in out
    assert "progress     12/20 (60%)" in out
    assert "COMPLETE 11  PRUNED 1" in out
    assert "rank 0: 97.1%  rank 1: 90.0%  (of each rank's search loop" in out
    assert f"trial {study.best_trial.number}" in out
    code, out, _ = _run(capsys, "status", "--storage", sqlite_url, "--json")
    info = json.loads(out)
    assert info["by_state"]["COMPLETE"] == 11 and info["progress"] == pytest.approx(0.6)
    assert info["best"]["values"] == [study.best_value]
    assert (
        Architecture.from_json(study.best_trial.user_attrs["arch"]).describe()
        == (info["best"]["architecture"])
    )


def test_best_single_objective_ranks_top_k(
    single_study: tuple[str, optuna.Study], capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite_url, study = single_study
    code, out, _ = _run(capsys, "best", "--storage", sqlite_url, "--top", "3", "--json")
    rows = json.loads(out)
    expected = sorted(
        (t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: -t.value
    )[:3]
    assert [r["trial"] for r in rows] == [t.number for t in expected]
    assert rows[0]["architecture"] == expected[0].user_attrs["arch_description"]
    code, out, _ = _run(capsys, "best", "--storage", sqlite_url, "--top", "3")
    assert out.splitlines()[0].startswith("top 3 of study 'digits'")
    assert "accuracy" in out.splitlines()[1] and "flops" in out.splitlines()[1]


def test_best_multi_objective_is_the_pareto_front(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    study = make_study(sqlite_url, "hw", multi=True)
    code, out, _ = _run(capsys, "best", "--storage", sqlite_url, "--json")
    rows = json.loads(out)
    assert sorted(r["trial"] for r in rows) == sorted(t.number for t in study.best_trials)
    # No row dominates another.
    for a in rows:
        for b in rows:
            assert not (a["accuracy"] > b["accuracy"] and a["flops"] < b["flops"])


def test_study_from_environment_and_config(
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_study(sqlite_url, "one", multi=False, n_trials=2)
    make_study(sqlite_url, "two", multi=False, n_trials=3)
    monkeypatch.setenv("OPTUNA_STORAGE", sqlite_url)
    code, _, err = _run(capsys, "status")
    assert code == 2 and "holds 2 studies ['one', 'two']" in err and "--study-name" in err
    code, out, _ = _run(capsys, "status", "--study-name", "two", "--json")
    assert json.loads(out)["trials"] == 3
    monkeypatch.delenv("OPTUNA_STORAGE")
    config = tmp_path / "nas.toml"
    config.write_text(f'[study]\nname = "one"\nstorage = "{sqlite_url}"\nn_trials = 2\n')
    code, out, _ = _run(capsys, "status", "--config", str(config), "--json")
    assert json.loads(out)["study"] == "one"
    monkeypatch.chdir(tmp_path)  # ./nas.toml, as `hpcnas init` writes it, when no flag is given
    code, out, _ = _run(capsys, "status", "--json")
    assert code == 0 and json.loads(out)["study"] == "one"
    code, out, _ = _run(capsys, "best", "--json")
    assert code == 0 and len(json.loads(out)) >= 1
    code, out, _ = _run(capsys, "status", "--storage", sqlite_url, "--study-name", "two")
    assert code == 0 and "study        two" in out  # a flag still wins over ./nas.toml


def test_errors_are_short_and_mask_passwords(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    code, _, err = _run(capsys, "status")
    assert code == 2 and "OPTUNA_STORAGE" in err
    code, _, err = _run(
        capsys, "status", "--storage", "postgresql+psycopg://nas:hunter2@127.0.0.1:1/x"
    )
    assert code == 2
    assert "hunter2" not in err and "nas:***@127.0.0.1:1/x" in err
    assert "Traceback" not in err
    make_study(sqlite_url, "digits", multi=False, n_trials=2)
    code, _, err = _run(capsys, "best", "--storage", sqlite_url, "--study-name", "nope")
    assert code == 2 and "no study 'nope'" in err and "['digits']" in err
    code, _, err = _run(capsys, "status", "--config", "/nonexistent/nas.toml")
    assert code == 2 and "does not exist" in err


def test_export_module_runs_without_our_code(
    single_study: tuple[str, optuna.Study], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet

    sqlite_url, study = single_study
    space = HierarchicalSearchSpace.from_study(study)
    assert space is not None
    # Supernet weights that differ from the initial ones, as after training.
    net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10, seed=7)
    torch.save(net.state_dict(), tmp_path / "supernet.pt")
    out_dir = tmp_path / "export"
    # not a study of `hpcnas run`: the data set comes from the config's [data]
    config = tmp_path / "nas.toml"
    config.write_text(f'[study]\nname = "digits"\nstorage = "{sqlite_url}"\nn_trials = 1\n')
    code, out, _ = _run(
        capsys, "export", "--config", str(config), "--out", str(out_dir),
        "--untrained", "--weights", str(tmp_path / "supernet.pt"),
    )  # fmt: skip
    assert code == 0 and "model.pt2" in out
    meta = json.loads((out_dir / "architecture.json").read_text())
    assert meta["trial"] == study.best_trial.number
    arch = Architecture.from_dict(meta["architecture"])
    assert arch.describe() == study.best_trial.user_attrs["arch_description"]
    assert arch == space.from_params(study.best_trial.params)
    x = torch.randn(5, 1, 8, 8)
    expected = net.eval().subnet(arch).eval()(x)
    program = torch.export.load(str(out_dir / "model.pt2")).module()
    torch.testing.assert_close(program(x), expected, rtol=1e-4, atol=1e-5)
    if "model.onnx" in out:
        onnx = pytest.importorskip("onnx")
        model = onnx.load(str(out_dir / "model.onnx"))
        onnx.checker.check_model(model)
        assert [i.name for i in model.graph.input] == ["input"]


@pytest.mark.parametrize(
    "recipe, message",
    [
        ("lr = 1e30", "training diverged: non-finite loss at step 2 of 60: lower `lr`"),
        ('precision = "fp16"', "[export] precision is 'fp16', which needs a GPU"),
    ],
)
def test_export_reports_a_recipe_that_cannot_train_in_one_line(
    single_study: tuple[str, optuna.Study],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    recipe: str,
    message: str,
) -> None:
    pytest.importorskip("torch")
    sqlite_url, _ = single_study
    config = tmp_path / "nas.toml"
    config.write_text(
        f'[study]\nname = "digits"\nstorage = "{sqlite_url}"\nn_trials = 1\n'
        f"[export]\nsteps = 60\nlatency_repeats = 0\n{recipe}\n"
    )
    code, _, err = _run(
        capsys, "export", "--config", str(config), "--out", str(tmp_path / "x"), "--no-onnx"
    )
    assert code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert line.startswith(f"hpcnas export: error: {message}")
    assert not (tmp_path / "x").exists()


def test_template_writes_the_committed_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "template", "all", "--out", str(tmp_path))
    assert code == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(written) == 5
    for rel in written:
        # integrations/ in the repository is exactly what the generators produce.
        assert (tmp_path / rel).read_text() == (REPO / "integrations" / rel).read_text(), rel
    code, out, _ = _run(capsys, "template", "slurm", "--nodes", "8", "--gpus-per-node", "0")
    assert "#SBATCH --nodes=8" in out and "gpus-per-node" not in out


def test_module_entry_point_and_help() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0
    for command in ("run", "resume", "status", "best", "export", "dashboard", "template"):
        assert command in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2 and "usage: hpcnas" in proc.stdout


def test_cli_import_stays_light() -> None:
    code = (
        "import sys, optuna_hpcnas.cli, optuna_hpcnas.metrics, optuna_hpcnas.dashboard, "
        "optuna_hpcnas.integrations;"
        "heavy = {'torch', 'mpi4py', 'prometheus_client', 'plotly', 'optuna_dashboard'};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.strip() == "[]", proc.stderr


def test_export_trains_a_pruned_trial_and_refuses_one_that_never_ran(
    single_study: tuple[str, optuna.Study],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A published model pruned early in the search can still be exported, trained in full."""
    pytest.importorskip("torch")
    url, study = single_study
    assert study.trials[3].state == optuna.trial.TrialState.PRUNED
    out = tmp_path / "pruned"
    config = tmp_path / "nas.toml"
    config.write_text(f'[study]\nname = "digits"\nstorage = "{url}"\nn_trials = 1\n')
    code, stdout, err = _run(
        capsys, "export", "--config", str(config), "--trial", "3", "--steps", "3",
        "--out", str(out), "--no-onnx",
    )  # fmt: skip
    assert code == 0, err
    assert "exported trial 3" in stdout and (out / "model.pt2").is_file()
    code, _, err = _run(capsys, "export", "--storage", url, "--trial", "999")
    assert code == 2 and "trial 999 of 'digits' has not run (not in the study)" in err


def test_architecture_read_from_every_producer() -> None:
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas._records import architecture_of
    from optuna_hpcnas._records import summary_of

    arch = next(iter(HierarchicalSearchSpace.preset("digits-small").enumerate()))
    # SupernetObjective / record_trial, an older dict, and the runner's description string.
    for attrs in (
        {"arch": arch.to_json(), "arch_description": arch.describe()},
        {"architecture": arch.to_dict()},
    ):
        assert architecture_of(attrs) == arch
        assert summary_of(attrs) == arch.describe()
    runner = {"architecture": arch.describe()}
    assert architecture_of(runner) is None and summary_of(runner) == arch.describe()
    assert summary_of({}) is None


def test_status_progress_counts_the_enqueued_budget(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The runner enqueues its whole budget as WAITING trials: progress is finished / all.
    study = optuna.create_study(study_name="queued", storage=sqlite_url)
    for x in (0.1, 0.2, 0.3, 0.4, 0.5):
        study.enqueue_trial({"x": x})
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    code, out, _ = _run(capsys, "status", "--storage", sqlite_url)
    assert code == 0
    assert "progress     2/5 (40%)" in out and "WAITING 3" in out
    assert "queued       3 WAITING trials, the budget's rest: `hpcnas resume` runs them" in out


def test_one_version_for_the_command_the_package_and_its_metadata(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.metadata

    import optuna_hpcnas

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    printed = capsys.readouterr().out.strip()
    assert printed == f"optuna-hpcnas {optuna_hpcnas.__version__}"
    assert importlib.metadata.version("optuna-hpcnas") == optuna_hpcnas.__version__
