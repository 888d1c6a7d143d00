"""The figures of README.md and docs/ are written from stored bench results by
``bench/readme_figures.py``: the checkout's are up to date, and a hand edit is caught."""

from __future__ import annotations

from pathlib import Path
import shutil
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "readme_figures.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_the_checkouts_figures_are_written_from_the_stored_results() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in ("demo", "deploy-int8", "peers-mnist1d", "run-vs-api", "samplers"):
        assert f"<!-- figure: {name} -->" in readme, name
    checked = _run("--check")
    assert checked.returncode == 0, checked.stderr + checked.stdout


def test_a_hand_edited_figure_is_caught_then_rewritten(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    text = (ROOT / "README.md").read_text()
    head, rest = text.split("<!-- figure: peers-mnist1d -->\n", 1)
    body, tail = rest.split("<!-- /figure -->", 1)
    edited = body.replace("|", "¦", 1)  # any change of the generated text
    (tmp_path / "README.md").write_text(
        head + "<!-- figure: peers-mnist1d -->\n" + edited + "<!-- /figure -->" + tail
    )
    stale = _run("--check", "--root", str(tmp_path))
    assert stale.returncode == 1
    assert "README.md: peers-mnist1d" in stale.stderr
    assert _run("--root", str(tmp_path)).returncode == 0
    assert (tmp_path / "README.md").read_text() == text
    assert _run("--check", "--root", str(tmp_path)).returncode == 0


def test_an_unknown_figure_is_refused(tmp_path: Path) -> None:
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    with (tmp_path / "README.md").open("a") as f:
        f.write("\n<!-- figure: no-such-figure -->\nx\n<!-- /figure -->\n")
    refused = _run("--check", "--root", str(tmp_path))
    assert refused.returncode == 1 and "unknown figure 'no-such-figure'" in refused.stderr


def test_a_stored_result_names_its_command_and_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import time

    from tests.bench_tests._bench import bench_module

    stored = bench_module("_stored")
    monkeypatch.setattr(sys, "argv", ["/any/where/bench/deploy.py", "--out", "x.json"])
    stored.store_result(tmp_path / "x.json", {"accuracy": 0.5})
    record = json.loads((tmp_path / "x.json").read_text())
    assert record == {
        "accuracy": 0.5,
        "command": "python bench/deploy.py --out x.json",
        "date": time.strftime("%Y-%m-%d"),
    }
