from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optuna_hpcnas.deploy import check_target
from optuna_hpcnas.deploy import deploy_model
from optuna_hpcnas.deploy import DeploymentRefused
from optuna_hpcnas.deploy import onnx_latency
from optuna_hpcnas.deploy import probe_timeout_seconds
from tests.deploy_tests.conftest import digits_architecture
from tests.deploy_tests.conftest import raw_digits
from tests.deploy_tests.conftest import train_digits


def test_deploy_writes_every_file(deployed: Any) -> None:
    out, report, _, _ = deployed
    for rel in (
        "model.onnx",
        "model.int8.onnx",
        "report.json",
        "Dockerfile",
        "chart/Chart.yaml",
        "chart/values.yaml",
        "chart/templates/deployment.yaml",
        "chart/templates/service.yaml",
    ):
        assert (out / rel).is_file(), rel
    assert set(report.files) >= {"model.onnx", "model.int8.onnx", "report.json", "Dockerfile"}
    # The container pins the onnxruntime that verified the model and serves this model name.
    text = (out / "Dockerfile").read_text()
    assert f'"onnxruntime=={report.versions["onnxruntime"]}"' in text
    assert '"/models/digits", "--host", "0.0.0.0"' in text and '"--name", "digits"' in text
    # a wheel of this optuna-hpcnas in the context, installed by the image: no index needed
    (wheel,) = (p.name for p in out.glob("optuna_hpcnas-*.whl"))
    assert wheel in report.files and f"COPY {wheel} /tmp/{wheel}" in text
    import zipfile

    assert "optuna_hpcnas/deploy/_serve.py" in zipfile.ZipFile(out / wheel).namelist()
    import yaml

    values = yaml.safe_load((out / "chart/values.yaml").read_text())
    assert values["modelName"] == "digits" and values["image"]["repository"] == "digits"
    # The probes' timeout comes from what was measured here: a body parse and a model call.
    serving = report.serving
    assert serving["parse_max_body_ms"] > 0 and serving["model_call_ms"] > 0
    assert (serving["max_body_bytes"], serving["max_instances"]) == (8 * 2**20, 1024)
    wait_s = (serving["parse_max_body_ms"] + serving["model_call_ms"]) / 1e3
    assert serving["probe_timeout_s"] == probe_timeout_seconds(wait_s)
    assert values["probes"]["timeoutSeconds"] == serving["probe_timeout_s"]


def test_report_json_matches_the_report(deployed: Any) -> None:
    out, report, _, _ = deployed
    stored = json.loads((out / "report.json").read_text())
    assert stored == report.to_dict()
    assert stored["input_shape"] == [1, 8, 8]
    assert stored["preprocessing"]["layout"] == "NCHW"
    assert stored["metadata"] == {"trial": 7}
    assert stored["export"]["opset"] >= 17
    assert stored["quantization"]["format"] == "QDQ"
    assert stored["quantization"]["operators"] == ["Conv", "Gemm", "MatMul"]
    assert stored["threads"] == 1 and stored["throughput_batch"] == 64
    assert {"onnxruntime", "onnx", "torch"} <= set(stored["versions"])
    assert stored["holdout_size"] == len(deployed[3].test)
    assert "skipped" in stored["tensorrt"] or "available" in stored["tensorrt"]


def test_int8_is_small_and_accurate(deployed: Any) -> None:
    out, report, net, data = deployed
    fp32, int8 = report.fp32, report.int8
    assert fp32.bytes == (out / "model.onnx").stat().st_size
    assert int8.bytes < fp32.bytes / 2
    assert fp32.max_abs_diff < 1e-3
    assert fp32.accuracy > 0.9
    assert int8.accuracy >= fp32.accuracy - 0.02
    for figures in (fp32, int8):
        assert 0 < figures.latency_p50_ms <= figures.latency_p99_ms
        assert figures.throughput > 0
    # The accuracy is really the ONNX model's on the held-out split: recompute it.
    import onnxruntime as ort

    x = raw_digits(data.test.tensors[0].numpy(), data.preprocessing)  # the model takes raw
    y = data.test.tensors[1].numpy()
    sess = ort.InferenceSession(str(out / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    acc = float((sess.run(None, {"input": x})[0].argmax(1) == y).mean())
    assert abs(acc - int8.accuracy) <= 1 / len(y)  # a pixel rounded may flip one tie


def test_models_take_raw_data(deployed: Any) -> None:
    """The standardisation of the task is the graph's first step: clients send raw pixels."""
    import onnxruntime as ort
    import torch

    out, report, net, data = deployed
    assert report.input["standardised_in_model"] is True
    assert report.input["shape"] == [-1, 1, 8, 8] and report.input["datatype"] == "FP32"
    assert "raw digits pixels 0-16" in report.input["expects"]
    assert report.input["mean"] == pytest.approx(data.preprocessing["mean"])
    standardised = data.test.tensors[0][:50]
    raw = raw_digits(standardised.numpy(), data.preprocessing)
    with torch.no_grad():
        expected = net(standardised).numpy()
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"input": raw})[0], expected, atol=1e-3)
    assert "raw digits pixels 0-16" in report.format_table()


def test_standardise_false_keeps_the_model_inputs(trained: Any, tmp_path: Path) -> None:
    """For clients that standardise upstream: the graph is the model alone."""
    import onnxruntime as ort
    import torch

    net, data = trained
    report = deploy_model(
        net, out=tmp_path, input_shape=(1, 8, 8), calibration=data.train, holdout=data.test,
        preprocessing=data.preprocessing, standardise=False, latency_repeats=3,
    )  # fmt: skip
    assert report.input["standardised_in_model"] is False
    assert "standardised data" in report.input["expects"]
    x = data.test.tensors[0][:20]
    with torch.no_grad():
        expected = net(x).numpy()
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"input": x.numpy()})[0], expected, atol=1e-4)


@pytest.mark.parametrize(
    ("preprocessing", "message"),
    [
        ({"mean": 1.0}, "one of mean and std only"),
        ({"mean": 1.0, "std": 0.0}, "must be > 0"),
        ({"mean": [1.0, 2.0, 3.0], "std": 1.0}, "has 3 values"),
        ({"mean": "abc", "std": 1.0}, "not numbers"),
    ],
)
def test_bad_preprocessing(
    trained: Any, tmp_path: Path, preprocessing: dict, message: str
) -> None:
    net, data = trained
    with pytest.raises(ValueError, match=message):
        deploy_model(
            net, out=tmp_path / "out", input_shape=(1, 8, 8), calibration=data.train,
            holdout=data.test, preprocessing=preprocessing,
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_refused_deployment_keeps_the_previous_one(deployed: Any, tmp_path: Path) -> None:
    import shutil

    out, _, net, data = deployed
    previous = tmp_path / "previous"
    shutil.copytree(out, previous)
    before = {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    with pytest.raises(DeploymentRefused):
        deploy_model(
            net, out=previous, input_shape=(1, 8, 8), calibration=data.train,
            holdout=data.test, estimate=1.0, margin=0.0,
        )  # fmt: skip
    after = {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    assert after == before  # every file as it was, no staging directory left
    missing = tmp_path / "new" / "deeper"
    with pytest.raises(DeploymentRefused):
        deploy_model(
            net, out=missing, input_shape=(1, 8, 8), calibration=data.train,
            holdout=data.test, estimate=1.0, margin=0.0,
        )  # fmt: skip
    assert not missing.exists()


def test_outputs_replace_links_instead_of_following_them(trained: Any, tmp_path: Path) -> None:
    """A link already in the output directory is replaced; what it points to stays as it was."""
    net, data = trained
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "chart").mkdir()
    (outside / "chart" / "Chart.yaml").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    names = ("model.onnx", "model.int8.onnx", "Dockerfile", "report.json", "report.json.tmp")
    for name in names:
        (outside / name).write_text(f"precious {name}")
        (out / name).symlink_to(outside / name)
    (out / "chart").symlink_to(outside / "chart", target_is_directory=True)
    report = deploy_model(
        net, out=out, input_shape=(1, 8, 8), calibration=data.train, holdout=data.test,
        preprocessing=data.preprocessing, latency_repeats=3,
    )  # fmt: skip
    for name in names:
        assert (outside / name).read_text() == f"precious {name}", name
    assert (outside / "chart" / "Chart.yaml").read_text() == "mine"
    assert sorted(p.name for p in outside.iterdir()) == sorted([*names, "chart"])
    for name in ("model.onnx", "model.int8.onnx", "Dockerfile", "report.json"):
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    assert not (out / "chart").is_symlink() and (out / "chart" / "Chart.yaml").is_file()
    assert json.loads((out / "report.json").read_text()) == report.to_dict()
    assert (out / "report.json.tmp").is_symlink()  # never written: not ours to touch


def test_format_table(deployed: Any) -> None:
    _, report, _, _ = deployed
    table = report.format_table()
    assert "FP32" in table and "INT8" in table
    for row in ("accuracy (holdout)", "latency p50 ms", "latency p99 ms", "throughput", "bytes"):
        assert row in table
    assert f"{report.int8.bytes}" in table


def test_refuses_below_the_estimate(trained: Any, tmp_path: Path) -> None:
    net, data = trained
    with pytest.raises(DeploymentRefused) as info:
        deploy_model(
            net,
            out=tmp_path,
            input_shape=(1, 8, 8),
            calibration=data.train,
            holdout=data.test,
            estimate=1.0,
            margin=0.001,
        )
    message = str(info.value)
    assert "estimate 1.0000" in message and "margin 0.0010" in message
    assert "Verified FP32 accuracy 0.9" in message
    assert not any(tmp_path.iterdir())  # not even model.onnx, nor the staging directory


def test_refuses_a_target_that_cannot_run_the_model(trained: Any, tmp_path: Path) -> None:
    net, data = trained  # its second cell is a depthwise-separable convolution
    with pytest.raises(DeploymentRefused, match="npu-no-grouped.*group=32"):
        deploy_model(
            net,
            out=tmp_path,
            input_shape=(1, 8, 8),
            calibration=data.train,
            holdout=data.test,
            target="npu-no-grouped",
        )
    assert not any(tmp_path.iterdir())


def test_check_target(deployed: Any, tmp_path: Path) -> None:
    out, _, _, _ = deployed
    assert check_target(out / "model.onnx", "onnx-cpu") == []
    assert check_target(out / "model.int8.onnx", "onnx-cpu") == []
    assert check_target(out / "model.onnx", "tensorrt") == []  # parser check only with TensorRT
    problems = check_target(out / "model.onnx", "npu-no-grouped")
    assert len(problems) == 1 and "group=32" in problems[0]
    broken = tmp_path / "broken.onnx"
    broken.write_bytes((out / "model.onnx").read_bytes()[:200])
    (problem,) = check_target(broken, "onnx-cpu")
    assert "is not a readable ONNX model" in problem
    with pytest.raises(FileNotFoundError):
        check_target(tmp_path / "missing.onnx", "onnx-cpu")
    with pytest.raises(ValueError, match="Unknown deployment target 'gpu'"):
        check_target(out / "model.onnx", "gpu")


def test_npu_architecture_deploys_to_the_npu(tmp_path: Path) -> None:
    net, data = train_digits(digits_architecture("conv3x3", "conv3x3"), epochs=2)
    report = deploy_model(
        net,
        out=tmp_path,
        input_shape=(1, 8, 8),
        calibration=data.train,
        holdout=data.test,
        target="npu-no-grouped",
        latency_repeats=5,
    )
    assert report.target == "npu-no-grouped" and report.target_problems == ()
    assert check_target(tmp_path / "model.int8.onnx", "npu-no-grouped") == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_shape": (1, 0, 8)}, "`input_shape` is"),
        ({"margin": 2.0}, "`margin` is 2.0"),
        ({"estimate": 1.5}, "`estimate` is 1.5"),
        ({"target": "fpga"}, "Unknown deployment target 'fpga'"),
        ({"name": "a b"}, "`name` is 'a b'"),
        ({"latency_repeats": 0}, "`latency_repeats` is 0"),
    ],
)
def test_bad_arguments(trained: Any, tmp_path: Path, kwargs: dict, message: str) -> None:
    net, data = trained
    args: dict = dict(
        out=tmp_path, input_shape=(1, 8, 8), calibration=data.train, holdout=data.test
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        deploy_model(net, **args)
    assert not any(tmp_path.iterdir())


def test_onnx_latency(trained: Any) -> None:
    net, data = trained
    int8 = onnx_latency(net, (1, 8, 8), calibration=data.train, repeats=10)
    fp32 = onnx_latency(net, (1, 8, 8), int8=False, repeats=10)
    assert 0 < int8 < 1 and 0 < fp32 < 1
    with pytest.raises(ValueError, match="`input_shape`"):
        onnx_latency(net, (), repeats=1)
    assert np.isfinite(onnx_latency(net, (1, 8, 8), repeats=3))


def test_attention_scores_stay_float(tmp_path: Path) -> None:
    """Only weight-bearing operators are quantized: QLinearSoftmax was 10x slower."""
    import onnx
    from torch.utils.data import TensorDataset

    from optuna_hpcnas import Architecture
    from optuna_hpcnas import CellConfig
    from optuna_hpcnas import ClusterConfig
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet

    torch = pytest.importorskip("torch")
    space = HierarchicalSearchSpace.preset("cifar-like")
    arch = Architecture(
        "chain",
        (CellConfig("conv3x3", kernel=3, width=32), CellConfig("attention", heads=2))
        + tuple(CellConfig("identity") for _ in range(6)),
        ClusterConfig(1, 1, 32),
    )
    net = SuperNet(space, input_shape=(3, 8, 8), num_classes=10, seed=0).subnet(arch).eval()
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        data = TensorDataset(x, net(x).argmax(1))
    report = deploy_model(
        net, out=tmp_path, input_shape=(3, 8, 8), calibration=data, holdout=data,
        latency_repeats=3,
    )  # fmt: skip
    assert report.quantization["excluded_activation_matmuls"] >= 2  # q.k and scores.v
    graph = onnx.load(str(tmp_path / "model.int8.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert "Softmax" in ops and ops.count("QuantizeLinear") >= 2
    produced_by = {o: n.op_type for n in graph.node for o in n.output}
    softmax = next(n for n in graph.node if n.op_type == "Softmax")
    assert produced_by.get(softmax.input[0]) != "DequantizeLinear"
    assert report.int8.accuracy >= 0.8  # agreement with the FP32 model's own labels
