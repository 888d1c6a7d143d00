"""A model in its deployed form: FP32 ONNX export, INT8 static quantization, onnxruntime
sessions, accuracy, latency and throughput. The evaluation core measures a candidate's
deployed latency with it (``onnx_latency``, ``[objective] latency = "onnx-int8"``);
``optuna_hpcnas.deploy`` builds, verifies and serves the models with it.

torch and onnxruntime are imported inside the functions: importing this module stays light,
and the server (which needs no torch) imports only onnxruntime.
"""

from __future__ import annotations

from collections.abc import Iterator
import math
from pathlib import Path
import tempfile
import time
from typing import Any
from typing import TYPE_CHECKING
import warnings

import numpy as np

from optuna_hpcnas._validation import check_int

if TYPE_CHECKING:
    import onnxruntime
    import torch
    from torch.utils.data import Dataset

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
# Opset 18 is what torch's exporter writes natively (no version conversion); onnxruntime >= 1.14
# and TensorRT >= 8.6 read it.
OPSET = 18


def _require(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{module} is needed for deployment: pip install 'optuna-hpcnas[deploy]' ({e})."
        ) from e


def export_onnx(
    model: torch.nn.Module, path: str | Path, input_shape: tuple[int, ...]
) -> dict[str, Any]:
    """Write ``model`` as one self-contained FP32 ONNX file with a dynamic batch axis.

    The one ONNX exporter of the project (``hpcnas export`` and ``hpcnas deploy``). It uses
    torch's ``torch.export``-based exporter (``dynamo=True``, needs onnxscript): the subnets
    slice their weights by the input width at run time, which the TorchScript exporter keeps
    as ``Slice`` nodes on the weights, so onnxruntime's quantizer cannot quantize them (the
    INT8 file came out larger than the FP32 one), and it failed outright on sequence models
    and 1xL images (adaptive pooling, shape arithmetic). ``torch.export`` specialises the
    static sizes, so every weight is an initializer and BatchNorm folds into the
    convolutions; ``nn.GRU`` becomes ONNX's ``GRU`` operator. Per-node metadata (source
    locations) is dropped: it was half of a small model's bytes.

    Returns:
        The export's facts: opset, input and output names.
    """
    import torch

    onnx = _require("onnx")
    _require("onnxscript")
    # Batch 2 in the example: a batch of 1 could be specialised into the graph.
    example = torch.zeros(2, *input_shape)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter chatter about its own internals
        raw = Path(tmp) / "raw.onnx"
        torch.onnx.export(
            model,
            (example,),
            str(raw),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            opset_version=OPSET,
            dynamo=True,
            optimize=True,
            verbose=False,
        )
        proto = onnx.load(str(raw))  # reads the external weights file beside it too
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return {"opset": OPSET, "input_name": INPUT_NAME, "output_name": OUTPUT_NAME}


def session(path: str | Path, *, threads: int = 1) -> onnxruntime.InferenceSession:
    """A CPU onnxruntime session with ``threads`` intra-op threads (and one inter-op)."""
    ort = _require("onnxruntime")
    check_int("threads", threads, 1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # warnings about unused initializers are noise here
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(sess: onnxruntime.InferenceSession, x: np.ndarray) -> np.ndarray:
    """Logits of ``x`` (float32, batch first)."""
    return np.asarray(sess.run(None, {INPUT_NAME: np.ascontiguousarray(x, dtype=np.float32)})[0])


def dataset_arrays(dataset: Dataset, *, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, labels)`` of a ``(x, y)`` dataset as numpy arrays (the first ``limit``)."""
    from optuna_hpcnas.data import iterate_batches

    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    n = 0
    for x, y in iterate_batches(dataset, 256):
        xs.append(x.numpy().astype(np.float32))
        ys.append(y.numpy())
        n += len(y)
        if limit is not None and n >= limit:
            break
    if not xs:
        raise ValueError("The dataset is empty.")
    inputs, labels = np.concatenate(xs), np.concatenate(ys)
    return (inputs, labels) if limit is None else (inputs[:limit], labels[:limit])


def accuracy(
    sess: onnxruntime.InferenceSession,
    inputs: np.ndarray,
    labels: np.ndarray,
    *,
    batch_size: int = 32,
) -> float:
    """Top-1 accuracy of the session on ``inputs``.

    Small batches: an attention cell on 32x32 inputs holds 16 MB of scores per sample, and a
    batch of 256 made the machine swap.
    """
    correct = 0
    for start in range(0, len(inputs), batch_size):
        logits = run(sess, inputs[start : start + batch_size])
        correct += int((logits.argmax(1) == labels[start : start + batch_size]).sum())
    return correct / len(inputs)


class _CalibrationReader:
    """An onnxruntime ``CalibrationDataReader`` over batches of calibration inputs."""

    def __init__(self, inputs: np.ndarray, batch_size: int) -> None:
        self._inputs = inputs
        self._batch_size = batch_size
        self._batches: Iterator[dict[str, np.ndarray]] = self._iterate()

    def _iterate(self) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, len(self._inputs), self._batch_size):
            yield {INPUT_NAME: self._inputs[start : start + self._batch_size]}

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:
        self._batches = self._iterate()


# Operators quantized: those with weights. On onnxruntime's CPU kernels (1.32, AVX-512 VNNI)
# QLinearConv is 3.4x faster than Conv, while activation-by-activation MatMuls (attention
# scores) and the QLinearSoftmax that follows them were 1.5x and 10x slower than in float. On
# bench/deploy.py's cifar-like model (attention over 1,024 positions) quantizing every
# operator made INT8 2.1x slower than FP32; quantizing these, 1.1x faster (and a
# convolution-only model 3.2x faster).
QUANTIZED_OPS = ("Conv", "Gemm", "MatMul")


def _activation_matmuls(path: Path) -> list[str]:
    """Names of MatMul nodes with no constant input (activation times activation)."""
    import onnx

    model = onnx.load(str(path))
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and not any(i in constants for i in n.input)
    ]


def quantize_int8(
    fp32_path: str | Path,
    int8_path: str | Path,
    calibration: np.ndarray,
    *,
    per_channel: bool = True,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Post-training static INT8 quantization with onnxruntime's tools; the settings used.

    ``quant_pre_process`` (shape inference and graph optimisation, so BatchNorm folds into
    the convolutions before their weights are quantized) runs first; then
    ``quantize_static`` in QDQ format: unsigned 8-bit activations and signed 8-bit weights
    (onnxruntime's recommended U8S8 on x86-64), per-channel weight scales, MinMax calibration
    over ``calibration`` (float32, batch first) in batches of ``batch_size`` (small: an
    attention cell on 32x32 inputs holds 4 MB of scores per sample and head), and only the
    operators of ``QUANTIZED_OPS`` that have weights.
    """
    _require("onnx")
    quantization = _require("onnxruntime.quantization")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if len(calibration) == 0:
        raise ValueError("The calibration data is empty.")
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        try:
            quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
            source = prepared
        except Exception:  # pre-processing is an optimisation; quantization works without
            source = Path(fp32_path)
        excluded = _activation_matmuls(source)
        quantization.quantize_static(
            str(source),
            str(int8_path),
            _CalibrationReader(np.asarray(calibration, dtype=np.float32), batch_size),
            quant_format=quantization.QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OPS),
            nodes_to_exclude=excluded,
            activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8,
            per_channel=per_channel,
            calibrate_method=quantization.CalibrationMethod.MinMax,
        )
    return {
        "tool": "onnxruntime.quantization.quantize_static",
        "format": "QDQ",
        "activations": "uint8",
        "weights": "int8",
        "per_channel": per_channel,
        "operators": list(QUANTIZED_OPS),
        "excluded_activation_matmuls": len(excluded),
        "calibration": "MinMax",
        "calibration_samples": len(calibration),
        "pre_processed": source != Path(fp32_path),
    }


def latency(
    sess: onnxruntime.InferenceSession,
    input_shape: tuple[int, ...],
    *,
    repeats: int,
    warmup: int = 10,
    seed: int = 0,
) -> tuple[float, float]:
    """``(p50, p99)`` seconds of batch-1 runs of ``sess`` on one random input."""
    if repeats < 1:
        raise ValueError(f"`repeats` is {repeats}, but must be >= 1.")
    x = np.random.default_rng(seed).standard_normal((1, *input_shape)).astype(np.float32)
    feed = {INPUT_NAME: x}
    for _ in range(warmup):
        sess.run(None, feed)
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        sess.run(None, feed)
        times[i] = time.perf_counter() - start
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def throughput(
    sess: onnxruntime.InferenceSession,
    input_shape: tuple[int, ...],
    *,
    batch_size: int = 64,
    min_seconds: float = 0.5,
    seed: int = 0,
) -> float:
    """Samples per second of ``sess`` at ``batch_size``, timed over at least ``min_seconds``."""
    x = np.random.default_rng(seed).standard_normal((batch_size, *input_shape))
    feed = {INPUT_NAME: x.astype(np.float32)}
    sess.run(None, feed)  # warm-up
    runs, start = 0, time.perf_counter()
    while True:
        sess.run(None, feed)
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and runs >= 3:
            return runs * batch_size / elapsed


def onnx_latency(
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    *,
    int8: bool = True,
    calibration: Dataset | None = None,
    repeats: int = 50,
    threads: int = 1,
) -> float:
    """Median batch-1 onnxruntime latency (seconds) of ``model``, INT8-quantized by default.

    The latency the deployed model will have, for the search objective
    (``[objective] latency = "onnx-int8"``) and for fitting a ``LatencyPredictor``. Without
    ``calibration`` the INT8 scales come from 32 standard-normal inputs: latency does not
    depend on the scales, only accuracy does.

    Examples:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
        >>> onnx_latency(net, (1, 8, 8), repeats=5) > 0
        True
    """
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"`input_shape` is {input_shape!r}, but must be positive sizes.")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        export_onnx(model, path, shape)
        if int8:
            if calibration is not None:
                inputs, _ = dataset_arrays(calibration, limit=256)
            else:
                rng = np.random.default_rng(0)
                inputs = rng.standard_normal((32, *shape)).astype(np.float32)
            quantized = Path(tmp) / "model.int8.onnx"
            quantize_int8(path, quantized, inputs)
            path = quantized
        p50, _ = latency(session(path, threads=threads), shape, repeats=repeats)
    return p50


def max_abs_diff(
    model: torch.nn.Module,
    sess: onnxruntime.InferenceSession,
    input_shape: tuple[int, ...],
    *,
    samples: int = 8,
    seed: int = 0,
) -> tuple[float, float]:
    """``(largest |torch - onnxruntime| logit difference, largest |torch logit|)``."""
    import torch

    x = np.random.default_rng(seed).standard_normal((samples, *input_shape)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).float().numpy()
    diff = float(np.max(np.abs(run(sess, x) - expected)))
    return (diff if math.isfinite(diff) else float("inf")), float(np.max(np.abs(expected)))
