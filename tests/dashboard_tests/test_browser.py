"""A real browser (headless Chromium) opens optuna-dashboard on a search's study.

Chromium comes from Debian's ``chromium`` package (``.ci/run`` installs it). Without it the
test skips, except under ``HPCNAS_REQUIRE_SERVICES=1`` (CI), where it fails.
"""

from __future__ import annotations

from collections.abc import Iterator
import os
from pathlib import Path
import runpy
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import pytest

from tests.conftest import services_required

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=10000",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    reason = "chromium is not installed (apt-get install -y chromium)"
    if services_required():
        pytest.fail(f"{reason}; HPCNAS_REQUIRE_SERVICES is set, so this is a failure")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demo_study(url: str) -> optuna.Study:
    """A reduced run of examples/hardware_aware.py: weight sharing, measured latency."""
    argv = sys.argv
    sys.argv = [
        "hardware_aware.py", "--trials", "4", "--epochs", "1", "--max-batches", "2",
        "--storage", url, "--study-name", "demo",
        # the example's 0.5 ms limit sits inside the noise of these models' measured latency
        # (0.34-0.68 ms for one of them between runs): a page with a Pareto front needs at
        # least one feasible trial whatever the machine's load
        "--latency-limit-ms", "50",
    ]  # fmt: skip
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        runpy.run_path(str(REPO / "examples" / "hardware_aware.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return optuna.load_study(study_name="demo", storage=url)


@pytest.fixture
def dashboard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[str, object]]:
    _chromium()  # skip before the search when there is no browser
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    study = _demo_study(url)
    capsys.readouterr()
    checkpoints = pytest.importorskip("optuna_hpcnas.checkpoints")
    # A checkpoint blob in the study's own database, linked to the study as an artifact
    # (trial artifacts are uploaded while the trial runs; this one is finished).
    blob = tmp_path / "supernet-checkpoint.arrow"
    blob.write_bytes(b"ARROW1" + bytes(2048))
    store = checkpoints.RDBArtifactStore(url)
    optuna.artifacts.upload_artifact(
        artifact_store=store, file_path=str(blob), study_or_trial=study,
    )  # fmt: skip
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "optuna_hpcnas", "dashboard", "--storage", url,
         "--port", str(port), "--refresh-plots"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read() if proc.stdout else ""
                    pytest.fail(f"optuna-dashboard did not start: {out}")
                time.sleep(0.3)
        yield base, study
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _browse(chromium: str, url: str, profile: Path, *extra: str, shows: str = "") -> str:
    """The page's DOM after chromium's virtual-time budget; loaded up to three times until it
    ``shows`` that text (on a loaded machine the dashboard's API answers may come after the
    budget, and the DOM is dumped before the plots are drawn)."""
    for _ in range(3):
        proc = subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        if shows in proc.stdout:
            break
    return proc.stdout


@pytest.mark.slow
def test_dashboard_shows_trials_and_custom_plots(
    dashboard: tuple[str, object], tmp_path: Path
) -> None:
    chromium = _chromium()
    base, study = dashboard
    profile = tmp_path / "profile"
    shot = Path(os.environ.get("HPCNAS_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
    page = _browse(
        chromium, f"{base}/dashboard/studies/1", profile,
        "--dump-dom", "--window-size=1400,2200", f"--screenshot={shot}",
        shows="Search trajectory: accuracy",
    )  # fmt: skip
    # The two plots saved with save_plotly_graph_object are rendered by plotly in the page.
    assert "Pareto front: accuracy vs latency_s" in page
    assert "Search trajectory: accuracy" in page
    assert "demo" in page
    study_page = page
    best = study.best_trials[0]  # type: ignore[attr-defined]
    page = _browse(
        chromium, f"{base}/dashboard/studies/1/trials?numbers={best.number}", profile,
        "--dump-dom", shows=f"Trial {study.trials[-1].number}",  # type: ignore[attr-defined]
    )  # fmt: skip
    for t in study.trials:  # type: ignore[attr-defined]
        assert f"Trial {t.number}" in page
    # The selected trial's user attributes: architecture, FLOPs, latency, stage.
    summary = best.user_attrs["arch_description"].replace(">", "&gt;")
    assert summary in page
    for key in ("flops", "params", "latency_s", "stage"):
        assert key in page
    # `hpcnas dashboard` found the RDB artifact store: the checkpoint is listed.
    assert "supernet-checkpoint.arrow" in study_page
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
