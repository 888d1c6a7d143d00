"""``hpcnas deploy`` and ``hpcnas serve`` as a user types them, on a study of ``hpcnas run``."""

from __future__ import annotations

import json
import os
from pathlib import Path
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from optuna_hpcnas.cli import main
from tests.run_configs import tiny_config
from tests.run_configs import write_config


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("deploy")
    url = f"sqlite:///{tmp / 'd.db'}"
    config = write_config(
        tmp / "nas.toml",
        tiny_config(
            study={"name": "d", "storage": url, "n_trials": 2},
            pruner={"name": "none"},
            export={"epochs": 8, "latency_repeats": 1},
        ),
    )
    assert main(["run", "--config", str(config), "--no-progress"]) == 0
    return config, url


def test_deploy_writes_verified_models_and_serve_answers(
    searched: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, url = searched
    out = tmp_path / "dep"
    args = ["deploy", "--config", str(config), "--out", str(out), "--margin", "0.5"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "accuracy (holdout)" in printed and f"next: hpcnas serve {out}" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["metadata"]["study"] == "d" and report["target"] == "onnx-cpu"
    from optuna_hpcnas.config import DataConfig

    total = sum(DataConfig(**tiny_config()["data"]).load().sizes)
    # 10 % of all samples, taken from the test split the search never saw
    assert abs(report["holdout_size"] - 0.1 * total) <= 5
    assert report["preprocessing"]["std"] > 0  # the digits standardisation, recorded
    for name in ("model.onnx", "model.int8.onnx", "Dockerfile", "chart/Chart.yaml"):
        assert (out / name).is_file(), name

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hpcnas")), "serve", str(out), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/v1/models/model"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base, timeout=2) as r:
                    assert json.loads(r.read())["ready"] is True
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.2)
        body = json.dumps({"instances": [[[[0.0] * 8] * 8]]}).encode()  # one (1, 8, 8)
        request = urllib.request.Request(f"{base}:predict", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            predictions = json.loads(r.read())["predictions"]
        assert len(predictions) == 1 and 0 <= predictions[0]["class"] < 10
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_deploy_refuses_a_model_below_the_search_estimate(
    searched: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = searched
    # no training: the model predicts at chance, far below the search's estimate
    code = main(["deploy", "--storage", url, "--out", str(tmp_path / "x"), "--epochs", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "deployment refused" in err and "estimate" in err
    assert not (tmp_path / "x" / "report.json").exists()
    code = main(["deploy", "--storage", url, "--out", str(tmp_path / "y"), "--limit", "flops=1"])
    assert code == 2 and "no trial" in capsys.readouterr().err
