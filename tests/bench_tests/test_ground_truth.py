"""The ground-truth tables of ``bench/``: written with a content hash that catches an edited
row, a noise ceiling that tells a resolvable table from noise, the plateau rule, and a real
(tiny) build that resumes where it stopped."""

from __future__ import annotations

from pathlib import Path
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.bench_tests._bench import BENCH
from tests.bench_tests._bench import bench_module

gt = bench_module("_ground_truth")


def _rows(loss: np.ndarray) -> list[dict[str, Any]]:
    """A table of ``loss[seed, arch]`` with the other columns filled in."""
    return [
        {
            "arch_index": a,
            "arch_json": f'{{"a": {a}}}',
            "seed": s,
            "valid_logloss": float(loss[s, a]),
            "valid_accuracy": 1.0 - float(loss[s, a]),
            "test_accuracy": 0.5,
            "flops": 10 * a,
            "params": a,
            "cpu_seconds": 1.0,
        }
        for s in range(loss.shape[0])
        for a in range(loss.shape[1])
    ]


def test_a_table_reads_back_and_an_edited_row_is_caught(tmp_path: Path) -> None:
    rows = _rows(np.random.default_rng(0).random((3, 20)))
    path = tmp_path / "t.parquet"
    gt.write_table(rows, path, {"command": "python bench/ground_truth.py build"})
    back, meta = gt.read_table(path)
    assert len(back) == 60 and meta["rows"] == 60
    assert meta["command"] == "python bench/ground_truth.py build"
    table = pq.read_table(path)
    edited = table.set_column(
        table.schema.get_field_index("valid_logloss"),
        "valid_logloss",
        [[0.0] + table.column("valid_logloss").to_pylist()[1:]],
    ).replace_schema_metadata(table.schema.metadata)
    pq.write_table(edited, path)
    with pytest.raises(ValueError, match="content hash"):
        gt.read_table(path)


def test_the_noise_ceiling_separates_a_resolvable_table_from_noise() -> None:
    rng = np.random.default_rng(0)
    quality = np.linspace(0.0, 1.0, 60)
    resolvable = gt.ground_truth(_rows(quality + 0.01 * rng.standard_normal((4, 60))))
    noise = gt.ground_truth(_rows(rng.standard_normal((4, 60))))
    overall, within = gt.noise_ceiling(resolvable)
    assert overall > 0.9 and within > 0.5
    assert abs(gt.noise_ceiling(noise)[0]) < 0.3
    # a perfect fidelity has tau 1 against the mean; a reversed one -1
    assert gt.taus(quality, resolvable)[0] > 0.95
    assert gt.taus(-quality, resolvable)[0] < -0.95
    assert resolvable.rank_of('{"a": 0}') == 1
    with pytest.raises(ValueError, match="two seeds"):
        gt.noise_ceiling(gt.ground_truth(_rows(rng.random((1, 10)))))


def test_the_top_chosen_on_a_held_out_seed_removes_the_selection_bias() -> None:
    """Pure noise: choosing the top by the mean of all seeds makes the halves disagree
    within it (tau well below 0); choosing it on a held-out seed gives about 0. A table whose
    top can be ordered scores high either way."""
    rng = np.random.default_rng(3)
    noise = gt.ground_truth(_rows(rng.standard_normal((5, 400))))
    assert gt.noise_ceiling(noise)[1] < -0.15
    assert abs(gt.held_out_top_ceiling(noise)) < 0.1
    quality = np.linspace(0.0, 1.0, 200)
    resolvable = gt.ground_truth(_rows(quality + 0.01 * rng.standard_normal((5, 200))))
    assert gt.held_out_top_ceiling(resolvable) > 0.5
    with pytest.raises(ValueError, match="three seeds"):
        gt.held_out_top_ceiling(gt.ground_truth(_rows(rng.random((2, 10)))))


def test_an_architecture_missing_a_seed_is_left_out() -> None:
    rows = _rows(np.random.default_rng(1).random((2, 5)))
    rows = [r for r in rows if not (r["arch_index"] == 3 and r["seed"] == 1)]
    truth = gt.ground_truth(rows)
    assert len(truth.archs) == 4 and '{"a": 3}' not in truth.archs
    assert truth.loss.shape == (2, 4)


def test_a_table_being_built_is_read_as_its_largest_complete_part() -> None:
    """300 x 3 seeds with a fourth seed on 20 architectures is read as 300 x 3, not 20 x 4;
    two seeds are kept over one even when one seed alone has more rows."""
    rows = _rows(np.random.default_rng(2).random((4, 30)))
    building = [r for r in rows if r["seed"] < 3 or r["arch_index"] < 2]
    truth = gt.ground_truth(building)
    assert truth.seeds == [0, 1, 2] and len(truth.archs) == 30
    sparse = [r for r in rows if r["seed"] == 0 or (r["seed"] == 1 and r["arch_index"] < 5)]
    assert gt.ground_truth(sparse).loss.shape == (2, 5)


def test_the_plateau_is_the_first_budget_whose_doubling_gains_little() -> None:
    builder = bench_module("ground_truth")
    assert builder.plateau([(2, 1.0), (4, 0.5), (8, 0.45), (16, 0.449)], 0.02) == 8
    assert builder.plateau([(2, 1.0), (4, 0.5), (8, 0.6)], 0.02) == 4  # overfits past 4
    assert builder.plateau([(2, 1.0), (4, 0.5), (8, 0.25)], 0.02) == 8  # still gaining
    assert builder.plateau_line([(2, 1.0), (4, 0.5), (8, 0.25)], 0.02).startswith(
        "no plateau up to 8 passes: the last doubling still gains 50%"
    )
    assert "plateau (doubling gains < 2%): 4" in builder.plateau_line(
        [(2, 1.0), (4, 0.5), (8, 0.6)], 0.02
    )
    rows = [{"passes": p, "valid_logloss": v} for p in (1, 2) for v in range(10)]
    assert builder.top_curve(rows) == [(1, 0.5), (2, 0.5)]  # the best 2 of 10: 0 and 1


def test_a_tiny_build_in_two_shards_resumes_merges_and_reports(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable, str(BENCH / "ground_truth.py"), *args,
            "--task", "digits-elastic", "--data-dir", str(tmp_path),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done

    build = ("build", "--archs", "3", "--seeds", "2", "--passes", "1", "--flush", "2")
    first = run(*build, "--shard", "0", "--num-shards", "2")
    assert "0 rows present, 3 to train" in first.stdout
    run(*build, "--shard", "1", "--num-shards", "2")
    # the report reads the shards while the table is being built
    report = run("report")
    assert '"architectures": 3' in report.stdout and '"seeds": 2' in report.stdout
    run("merge")
    assert not list(tmp_path.glob("*.shard*.parquet"))
    rows, meta = gt.read_table(tmp_path / "ground_truth_digits-elastic.parquet")
    assert len(rows) == 6 and meta["passes"] == 1 and meta["cpu_seconds"] > 0
    assert "--shard" not in meta["command"] and "--archs 3 --seeds 2" in meta["command"]
    assert {r["steps"] for r in rows} == {34}  # one pass of batch 32 over 1,078 images
    assert "6 rows present, 0 to train" in run(*build).stdout


def test_a_build_stopped_by_sigterm_writes_the_rows_it_trained(tmp_path: Path) -> None:
    build = [
        sys.executable, str(BENCH / "ground_truth.py"), "build", "--task", "digits-elastic",
        "--data-dir", str(tmp_path), "--seeds", "1", "--passes", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        [*build, "--archs", "20", "--flush", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # two rows trained, none flushed yet
        if line.startswith("2/20 trained"):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "stopped:" in out, err[-2000:]
    rows, _ = gt.read_table(tmp_path / "ground_truth_digits-elastic.parquet")
    assert 2 <= len(rows) < 20
    resumed = subprocess.run(
        [*build, "--archs", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(rows)} rows present" in resumed.stdout
