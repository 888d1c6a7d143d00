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
from tests.deploy_tests.conftest import digits_architecture
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
    import yaml

    values = yaml.safe_load((out / "chart/values.yaml").read_text())
    assert values["modelName"] == "digits" and values["image"]["repository"] == "digits"


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

    x = data.test.tensors[0].numpy()
    y = data.test.tensors[1].numpy()
    sess = ort.InferenceSession(str(out / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    acc = float((sess.run(None, {"input": x})[0].argmax(1) == y).mean())
    assert acc == pytest.approx(int8.accuracy)


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
    assert not (tmp_path / "report.json").exists()
    assert not (tmp_path / "model.int8.onnx").exists()


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
    assert not (tmp_path / "report.json").exists()


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
