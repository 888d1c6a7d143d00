"""``hpcnas deploy`` and ``hpcnas serve`` as a user types them, on a study of ``hpcnas run``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import json
import os
from pathlib import Path
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from optuna_hpcnas.cli import main
from tests.deploy_tests.conftest import raw_digits
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
            export={"steps": 60, "lr": 0.02, "batch_size": 32, "latency_repeats": 1},
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
    assert report["input"]["standardised_in_model"] is True  # ... and applied by the model
    for name in ("model.onnx", "model.int8.onnx", "Dockerfile", "chart/Chart.yaml"):
        assert (out / name).is_file(), name

    x, labels = raw_holdout(report)
    with serving(out) as base:
        with urllib.request.urlopen(f"{base}/v1/models/model", timeout=10) as r:
            assert json.loads(r.read())["ready"] is True
        v1 = post(f"{base}/v1/models/model:predict", {"instances": x.tolist()})
        v1_classes = np.array([p["class"] for p in v1["predictions"]])
        v2 = post(
            f"{base}/v2/models/model/infer",
            {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                         "data": x.ravel().tolist()}]},
        )  # fmt: skip
        v2_classes = np.reshape(v2["outputs"][0]["data"], (len(x), -1)).argmax(1)
    # Raw pixels in, the labels out at the accuracy deploy verified (INT8 is served).
    verified = report["int8"]["accuracy"]
    assert len(x) == report["holdout_size"]
    for classes in (v1_classes, v2_classes):  # at most one sample apart, counted in samples
        correct = int(np.sum(classes == labels))
        assert abs(correct - round(verified * len(x))) <= 1, (correct, verified, len(x))
    np.testing.assert_array_equal(v1_classes, v2_classes)


def raw_holdout(report: dict) -> tuple[np.ndarray, np.ndarray]:
    """The held-out samples deploy verified on, as raw pixels: rows of scikit-learn's own
    digits, untouched by the project's preprocessing."""
    from sklearn.datasets import load_digits

    from optuna_hpcnas.config import DataConfig
    from optuna_hpcnas.deploy._from_study import holdout_of

    data = DataConfig(**tiny_config()["data"]).load()
    held = holdout_of(data, 0.1, report["metadata"]["training"]["seed"]).tensors
    x = raw_digits(held[0].numpy(), data.preprocessing)
    shipped = {row.tobytes() for row in load_digits().images.astype(np.float32)}
    assert all(sample[0].tobytes() in shipped for sample in x)
    return x, held[1].numpy()


@contextmanager
def serving(out: Path) -> Iterator[str]:
    """``hpcnas serve OUT`` as a user starts it; its base URL until the block ends."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hpcnas")), "serve", str(out), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        return dict(json.loads(r.read()))


def test_deploy_refuses_a_model_below_the_search_estimate(
    searched: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = searched
    # no training: the model predicts at chance, far below the search's estimate
    code = main(["deploy", "--storage", url, "--out", str(tmp_path / "x"), "--steps", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "deployment refused" in err and "estimate" in err
    assert not (tmp_path / "x").exists()  # nothing left behind, not even model.onnx
    code = main(["deploy", "--storage", url, "--out", str(tmp_path / "y"), "--limit", "flops=1"])
    assert code == 2 and "no trial" in capsys.readouterr().err


def test_export_replaces_links_instead_of_following_them(
    searched: tuple[Path, str], tmp_path: Path
) -> None:
    config, _ = searched
    outside, out = tmp_path / "outside", tmp_path / "export"
    outside.mkdir()
    out.mkdir()
    names = ("architecture.json", "model.pt2", "model.onnx")
    for name in names:
        (outside / name).write_text(f"precious {name}")
        (out / name).symlink_to(outside / name)
    args = ["export", "--config", str(config), "--out", str(out), "--untrained"]
    assert main([*args, "--input", "raw"]) == 0
    for name in names:
        assert (outside / name).read_text() == f"precious {name}", name
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    meta = json.loads((out / "architecture.json").read_text())
    assert meta["input"]["standardised_in_model"] is True
    assert "raw digits pixels 0-16" in meta["input"]["expects"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no staging left behind
    # --no-onnx removes an older export's ONNX file instead of leaving it beside new files
    assert main([*args, "--no-onnx"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["architecture.json", "model.pt2"]
    meta = json.loads((out / "architecture.json").read_text())
    assert meta["input"]["standardised_in_model"] is False
