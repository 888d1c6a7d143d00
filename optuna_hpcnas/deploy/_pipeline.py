"""``deploy_model``: from a trained module to files a cluster can run.

The flow: the task's standardisation put in front of the model (clients send raw data) ->
FP32 ONNX export checked against torch -> target check -> verification on a held-out split
(refused below the search's estimate) -> INT8 static quantization -> accuracy and speed of
both with onnxruntime -> serving figures -> Dockerfile and Helm chart -> ``report.json``.
Everything is staged and moved into the output directory at the end, the report last (a
directory with a report is a complete deployment; a refused one leaves the directory as it
was). ``hpcnas deploy`` trains the chosen architecture and calls this; ``hpcnas serve``
serves the result.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
import json
import logging
import math
from pathlib import Path
import re
import time
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

from optuna_hpcnas.deploy._container import dockerfile
from optuna_hpcnas.deploy._container import helm_chart
from optuna_hpcnas.deploy._container import probe_timeout_seconds
from optuna_hpcnas.deploy._outdir import staged
from optuna_hpcnas.deploy._outdir import Staging
from optuna_hpcnas.deploy._preprocess import model_for_export
from optuna_hpcnas.deploy._preprocess import raw_inputs
from optuna_hpcnas.deploy._preprocess import standardisation
from optuna_hpcnas.deploy._targets import check_target
from optuna_hpcnas.deploy._targets import tensorrt_available
from optuna_hpcnas.deploy._wheel import package_for_container
from optuna_hpcnas.evaluation import _onnx
from optuna_hpcnas.search_space import target_profile

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

_logger = logging.getLogger(__name__)

REPORT_FILE = "report.json"
FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
THROUGHPUT_BATCH = 64
# At most this many calibration samples: MinMax ranges settle after a few hundred inputs, and
# calibration time grows linearly with them.
CALIBRATION_SAMPLES = 512
# FP32 ONNX must match torch to float32 rounding; a larger gap means a wrong export.
_EXPORT_RTOL = 1e-3


class DeploymentRefused(ValueError):
    """The model does not meet the bar for deployment (accuracy, export or target)."""


@dataclass(frozen=True)
class ModelFigures:
    """What was measured of one ONNX model, with onnxruntime on this machine."""

    file: str
    bytes: int
    accuracy: float
    latency_p50_ms: float
    latency_p99_ms: float
    throughput: float
    max_abs_diff: float


@dataclass(frozen=True)
class DeployReport:
    """Everything ``deploy_model`` verified and measured (``report.json`` holds ``to_dict()``).

    ``throughput`` is samples per second at ``throughput_batch``; latencies are batch 1;
    ``threads`` is the intra-op thread count of every onnxruntime session measured;
    ``max_abs_diff`` is the largest logit difference from the torch module on random inputs;
    ``timings`` are the seconds of each step. ``input`` says what the models take (raw data
    when ``standardised_in_model``); ``serving`` holds the server's limits, the measured
    seconds that bound a readiness probe under load, and the chart's probe timeout.
    """

    name: str
    target: str
    input_shape: tuple[int, ...]
    input: dict[str, Any]
    preprocessing: dict[str, Any]
    metadata: dict[str, Any]
    estimate: float | None
    margin: float
    holdout_size: int
    fp32: ModelFigures
    int8: ModelFigures
    quantization: dict[str, Any]
    export: dict[str, Any]
    target_problems: tuple[str, ...]
    tensorrt: str
    threads: int
    throughput_batch: int
    latency_repeats: int
    serving: dict[str, Any]
    versions: dict[str, str]
    seconds: float
    timings: dict[str, float]
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready copy (tuples as lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def format_table(self) -> str:
        """FP32 against INT8, one row per figure (what ``hpcnas deploy`` prints)."""
        rows = [
            ("accuracy (holdout)", "{:.4f}", "accuracy"),
            ("latency p50 ms (batch 1)", "{:.3f}", "latency_p50_ms"),
            ("latency p99 ms (batch 1)", "{:.3f}", "latency_p99_ms"),
            (f"throughput /s (batch {self.throughput_batch})", "{:.0f}", "throughput"),
            ("bytes", "{:d}", "bytes"),
            ("max |diff| to torch", "{:.2e}", "max_abs_diff"),
        ]
        lines = [
            f"{self.name}: target {self.target}, input {list(self.input_shape)} "
            f"({self.input.get('expects', 'as the model takes it')}), "
            f"{self.holdout_size} holdout samples, onnxruntime {self.threads} thread(s)",
            f"{'':28s} {'FP32':>12s} {'INT8':>12s} {'INT8/FP32':>10s}",
        ]
        for label, fmt, key in rows:
            a, b = getattr(self.fp32, key), getattr(self.int8, key)
            ratio = f"{b / a:.2f}" if a else "-"
            lines.append(f"{label:28s} {fmt.format(a):>12s} {fmt.format(b):>12s} {ratio:>10s}")
        if self.estimate is not None:
            lines.append(f"search estimate {self.estimate:.4f}, margin {self.margin:.4f}")
        lines.append(f"TensorRT: {self.tensorrt}; written in {self.seconds:.1f} s")
        return "\n".join(lines)


def _check_arguments(
    input_shape: tuple[int, ...],
    estimate: float | None,
    margin: float,
    target: str,
    name: str,
    latency_repeats: int,
    threads: int,
) -> tuple[int, ...]:
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else ()
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"`input_shape` is {input_shape!r}, but must be positive integers.")
    if not (isinstance(margin, (int, float)) and 0 <= margin <= 1):
        raise ValueError(f"`margin` is {margin!r}, but must be in [0, 1].")
    if estimate is not None and not (
        isinstance(estimate, (int, float)) and math.isfinite(estimate) and 0 <= estimate <= 1
    ):
        raise ValueError(f"`estimate` is {estimate!r}, but must be an accuracy in [0, 1].")
    target_profile(target)  # unknown targets raise
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
        raise ValueError(f"`name` is {name!r}, but must be letters, digits, '.', '_' or '-'.")
    for field, value in (("latency_repeats", latency_repeats), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{field}` is {value!r}, but must be an integer >= 1.")
    return shape


def _calibration_inputs(calibration: Dataset, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A seeded subset of ``CALIBRATION_SAMPLES`` among the first four times as many."""
    inputs, _ = _onnx.dataset_arrays(calibration, limit=4 * CALIBRATION_SAMPLES)
    if inputs.shape[1:] != shape:
        raise ValueError(
            f"The calibration inputs have shape {list(inputs.shape[1:])}, "
            f"but `input_shape` is {list(shape)}."
        )
    rng = np.random.default_rng(seed)
    take = rng.permutation(len(inputs))[:CALIBRATION_SAMPLES]
    return inputs[np.sort(take)]


def _verify(accuracy: float, estimate: float | None, margin: float, holdout_size: int) -> None:
    if estimate is not None and accuracy < estimate - margin:
        raise DeploymentRefused(
            f"Verified FP32 accuracy {accuracy:.4f} on {holdout_size} held-out samples is more "
            f"than the margin {margin:.4f} below the search's estimate {estimate:.4f} "
            f"(needs >= {estimate - margin:.4f}); not deployed."
        )


def _figures(
    path: Path,
    model: torch.nn.Module,
    shape: tuple[int, ...],
    holdout: tuple[np.ndarray, np.ndarray],
    *,
    threads: int,
    repeats: int,
) -> ModelFigures:
    sess = _onnx.session(path, threads=threads)
    diff, _ = _onnx.max_abs_diff(model, sess, shape)
    p50, p99 = _onnx.latency(sess, shape, repeats=repeats)
    return ModelFigures(
        file=path.name,
        bytes=path.stat().st_size,
        accuracy=_onnx.accuracy(sess, *holdout),
        latency_p50_ms=p50 * 1e3,
        latency_p99_ms=p99 * 1e3,
        throughput=_onnx.throughput(sess, shape, batch_size=THROUGHPUT_BATCH),
        max_abs_diff=diff,
    )


def _export_checked(
    model: torch.nn.Module, out: Path, shape: tuple[int, ...], target: str
) -> dict[str, Any]:
    """Export FP32 into ``out``, refuse a graph that differs from torch or does not fit the
    target."""
    path = out / FP32_FILE
    try:
        facts = _onnx.export_onnx(model, path, shape)
    except ImportError:
        raise
    except Exception as e:  # torch raises many exporter error types
        raise DeploymentRefused(f"torch could not export the model to ONNX: {e}") from e
    diff, scale = _onnx.max_abs_diff(model, _onnx.session(path), shape)
    if not diff <= _EXPORT_RTOL * max(1.0, scale):
        raise DeploymentRefused(
            f"The FP32 ONNX model differs from the torch module by {diff:.3g} "
            f"(logits up to {scale:.3g}); the export is wrong, not deployed."
        )
    problems = check_target(path, target)
    if problems:
        raise DeploymentRefused(
            f"The model does not run on target {target!r}: " + "; ".join(problems)
        )
    return facts


def _write_container(
    out: Path, *, name: str, image: str | None, ort_version: str, probe_timeout: int
) -> list[str]:
    """``Dockerfile`` (installing a wheel of the running optuna-hpcnas copied beside it, when
    there is one) and ``chart/`` into ``out``; the files written."""
    chart_name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50] or "model"
    package = package_for_container(out)  # the running optuna-hpcnas, as a wheel if it can
    (out / "Dockerfile").write_text(
        dockerfile(
            model_dir_name=chart_name, name=name, onnxruntime_version=ort_version, package=package
        )
    )
    files = helm_chart(
        name=chart_name,
        image=image or f"{chart_name}:latest",
        model_name=name,
        probe_timeout_s=probe_timeout,
    )
    for rel, text in files.items():
        path = out / "chart" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    wheel = [package] if package.endswith(".whl") else []
    return ["Dockerfile", *wheel, *(f"chart/{rel}" for rel in files)]


def _serving_figures(
    sess_path: Path, shape: tuple[int, ...], figures: ModelFigures, *, threads: int
) -> dict[str, Any]:
    """The server's default limits and what bounds a readiness probe's wait under load.

    Probes are answered on the event loop, never behind inference; what can still hold them
    up is the interpreter lock while a worker parses a request body of the maximal size, and
    one model call of ``max_batch`` instances. Both are measured here.
    """
    from optuna_hpcnas.deploy._protocol import DEFAULT_LIMITS
    from optuna_hpcnas.deploy._protocol import parse_seconds

    limits = DEFAULT_LIMITS
    parse_s = parse_seconds(shape, limits.max_body_bytes)
    call_s = limits.max_batch / figures.throughput if figures.throughput > 0 else 0.0
    return {
        "max_body_bytes": limits.max_body_bytes,
        "max_instances": limits.max_instances,
        "max_batch": limits.max_batch,
        "parse_max_body_ms": round(parse_s * 1e3, 3),
        "model_call_ms": round(call_s * 1e3, 3),
        "probe_timeout_s": probe_timeout_seconds(parse_s + call_s),
        "measured_with": f"{sess_path.name}, {threads} onnxruntime thread(s)",
    }


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch

    return {
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "torch": torch.__version__,
    }


def _quantize_and_measure(
    model: torch.nn.Module,
    out: Path,
    shape: tuple[int, ...],
    held: Any,
    inputs: np.ndarray,
    *,
    threads: int,
    repeats: int,
    margin: float,
    lap: Any,
) -> tuple[dict[str, Any], dict[str, ModelFigures], dict[str, Any]]:
    """INT8 quantization of the FP32 file, then the figures of both models and the serving
    figures of the INT8 one."""
    quantization = _onnx.quantize_int8(out / FP32_FILE, out / INT8_FILE, inputs)
    lap("quantize")
    figures = {}
    for key, file in (("fp32", FP32_FILE), ("int8", INT8_FILE)):
        figures[key] = _figures(out / file, model, shape, held, threads=threads, repeats=repeats)
        lap(f"measure_{key}")
    _warn_int8_accuracy(figures["fp32"].accuracy, figures["int8"].accuracy, margin)
    serving = _serving_figures(out / INT8_FILE, shape, figures["int8"], threads=threads)
    lap("serving_figures")
    return quantization, figures, serving


class _Stopwatch:
    """Seconds per named step of ``deploy_model`` (the report's ``timings``)."""

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.timings: dict[str, float] = {}

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.timings[step] = round(now - self._last, 3)
        self._last = now

    def total(self) -> float:
        return time.perf_counter() - self.start


def deploy_model(
    model: torch.nn.Module,
    *,
    out: str | Path,
    input_shape: tuple[int, ...],
    calibration: Dataset,
    holdout: Dataset,
    estimate: float | None = None,
    margin: float = 0.02,
    preprocessing: Mapping[str, Any] | None = None,
    target: str = "onnx-cpu",
    name: str = "model",
    metadata: Mapping[str, Any] | None = None,
    seed: int = 0,
    latency_repeats: int = 200,
    threads: int = 1,
    image: str | None = None,
    standardise: bool = True,
) -> DeployReport:
    """Verify, quantize, measure and package a trained model into ``out``.

    Writes ``model.onnx`` (FP32), ``model.int8.onnx`` (onnxruntime static QDQ INT8,
    calibrated on ``calibration``), ``Dockerfile``, ``chart/`` and ``report.json``. Both
    models start with the standardisation recorded in ``preprocessing``, so they take raw
    data. Everything is staged and moved into ``out`` at the end: a refused or failed
    deployment leaves ``out`` as it was, and links already in it are replaced, not followed.

    Args:
        model: The trained module (put in eval mode here).
        out: Output directory (created).
        input_shape: One sample's shape, without the batch axis.
        calibration: ``(x, y)`` samples for INT8 calibration (from the training split).
        holdout: ``(x, y)`` samples the search never saw, for verification.
        estimate: The search's accuracy estimate of this model, or ``None`` to skip the bar.
        margin: How far below ``estimate`` the verified FP32 accuracy may fall.
        preprocessing: ``TaskData.preprocessing`` (``mean``, ``std``): how the raw data
            became the samples of ``calibration`` and ``holdout``.
        target: Deployment target (``optuna_hpcnas.search_space.target_names()``).
        name: Model name in the KServe routes.
        metadata: Anything else to record (study, trial, architecture).
        seed: Seed of the calibration subset and of the benchmark inputs.
        latency_repeats: Timed batch-1 runs per model.
        threads: onnxruntime intra-op threads of the measured sessions.
        image: Image reference for the Helm chart (default ``<name>:latest``).
        standardise: Start both models with that standardisation, so that they take raw
            data (``False``: the model alone, for clients that standardise upstream).

    Raises:
        DeploymentRefused: The FP32 accuracy is more than ``margin`` below ``estimate``, the
            export differs from torch, or the model does not run on ``target``.

    Examples:
        >>> report = deploy_model(net, out="deploy", input_shape=(1, 8, 8),  # doctest: +SKIP
        ...                       calibration=data.train, holdout=holdout, estimate=0.97)
        >>> print(report.format_table())  # doctest: +SKIP
    """
    watch = _Stopwatch()
    shape = _check_arguments(input_shape, estimate, margin, target, name, latency_repeats, threads)
    stats = standardisation(preprocessing, shape) if standardise else None
    model.eval()
    exported, input_info = model_for_export(model, preprocessing, shape, standardise=standardise)
    with staged(out) as stage:
        report = _deploy_staged(
            stage, exported, shape, watch, input_info=input_info, stats=stats,
            calibration=calibration, holdout=holdout, estimate=estimate, margin=margin,
            preprocessing=preprocessing, target=target, name=name, metadata=metadata,
            seed=seed, latency_repeats=latency_repeats, threads=threads, image=image,
        )  # fmt: skip
        _commit(stage, report)
    return report


def _deploy_staged(
    stage: Staging,
    exported: torch.nn.Module,
    shape: tuple[int, ...],
    watch: _Stopwatch,
    *,
    input_info: dict[str, Any],
    stats: tuple[np.ndarray, np.ndarray] | None,
    calibration: Dataset,
    holdout: Dataset,
    estimate: float | None,
    margin: float,
    preprocessing: Mapping[str, Any] | None,
    target: str,
    name: str,
    metadata: Mapping[str, Any] | None,
    seed: int,
    latency_repeats: int,
    threads: int,
    image: str | None,
) -> DeployReport:
    """``deploy_model``'s steps, every file written into the staging directory."""
    export = _export_checked(exported, stage.path, shape, target)
    watch.lap("export_and_target_check")
    held, inputs = _verified_inputs(
        stage.path / FP32_FILE, holdout, calibration, shape, seed=seed, stats=stats,
        estimate=estimate, margin=margin,
    )  # fmt: skip
    watch.lap("verify")
    quantization, figures, serving = _quantize_and_measure(
        exported, stage.path, shape, held, inputs,
        threads=threads, repeats=latency_repeats, margin=margin, lap=watch.lap,
    )  # fmt: skip
    versions = _versions()
    files = _write_container(
        stage.path, name=name, image=image, ort_version=versions["onnxruntime"],
        probe_timeout=serving["probe_timeout_s"],
    )  # fmt: skip
    return DeployReport(
        name=name, target=target, input_shape=shape, input=input_info,
        preprocessing=dict(preprocessing or {}), metadata=dict(metadata or {}),
        estimate=None if estimate is None else float(estimate), margin=float(margin),
        holdout_size=len(held[1]), fp32=figures["fp32"], int8=figures["int8"],
        quantization=quantization, export=export, target_problems=(),
        tensorrt=_tensorrt_status(), threads=threads, throughput_batch=THROUGHPUT_BATCH,
        latency_repeats=latency_repeats, serving=serving, versions=versions,
        seconds=watch.total(), timings=watch.timings,
        files=(FP32_FILE, INT8_FILE, *files, REPORT_FILE),
    )  # fmt: skip


def _verified_inputs(
    fp32: Path,
    holdout: Dataset,
    calibration: Dataset,
    shape: tuple[int, ...],
    *,
    seed: int,
    stats: tuple[np.ndarray, np.ndarray] | None,
    estimate: float | None,
    margin: float,
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """``(holdout inputs and labels, calibration inputs)`` as the model takes them, once the
    FP32 model met the bar on the holdout."""
    held = _onnx.dataset_arrays(holdout)
    inputs = _calibration_inputs(calibration, shape, seed)
    if stats is not None:  # the datasets hold standardised samples; the model takes raw
        held = (raw_inputs(held[0], *stats), held[1])
        inputs = raw_inputs(inputs, *stats)
    _verify(_onnx.accuracy(_onnx.session(fp32), *held), estimate, margin, len(held[1]))
    return held, inputs


def _commit(stage: Staging, report: DeployReport) -> None:
    """``report.json`` staged, then everything moved in: the old report goes first and the
    new one comes last, so a report only ever describes the files beside it."""
    (stage.path / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    stage.remove(REPORT_FILE)
    wheels = [f for f in report.files if f.endswith(".whl")]
    stage.commit([FP32_FILE, INT8_FILE, *wheels, "Dockerfile", "chart", REPORT_FILE])


def _warn_int8_accuracy(fp32: float, int8: float, margin: float) -> None:
    # Not a refusal: the FP32 model met the bar and is deployed too; the server can take it.
    if int8 < fp32 - margin:
        _logger.warning(
            "INT8 accuracy %.4f is more than %.4f below FP32 (%.4f): serve with --model fp32.",
            int8,
            margin,
            fp32,
        )


def _tensorrt_status() -> str:
    if not tensorrt_available():
        return "skipped (needs a CUDA device and the tensorrt package)"
    # The target check ran TensorRT's ONNX parser for target "tensorrt"; building an engine
    # is left to the serving side (trtexec), as the engine is specific to the GPU it runs on.
    return "available (ONNX parser check with target 'tensorrt')"


def load_report(model_dir: str | Path) -> dict[str, Any]:
    """The ``report.json`` of a deployment directory, checked for what serving needs."""
    path = Path(model_dir) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"No {REPORT_FILE} in {str(model_dir)!r}: not a directory written by deploy_model."
        )
    report = json.loads(path.read_text())
    shape = report.get("input_shape")
    if not isinstance(shape, list) or not shape or not all(isinstance(s, int) for s in shape):
        raise ValueError(f"{path} has no valid `input_shape` (got {shape!r}).")
    return dict(report)
