"""LatencyPredictor measured by a given callable and fitted on whole-model latencies."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from optuna_hpcnas import HierarchicalSearchSpace

torch = pytest.importorskip("torch")

from optuna_hpcnas.evaluation import LatencyPredictor  # noqa: E402
from optuna_hpcnas.supernet import SuperNet  # noqa: E402

SPACE = HierarchicalSearchSpace.preset("digits-small")


def _supernet() -> SuperNet:
    return SuperNet(SPACE, input_shape=(1, 8, 8), num_classes=10, seed=0)


def _cost(layer: Any, shape: tuple[int, ...]) -> float:
    """A deterministic stand-in for a timer: parameters plus input size, in microseconds."""
    params = sum(p.numel() for p in layer.parameters())
    return (params + int(np.prod(shape))) * 1e-6


def test_measure_callable_fills_the_table() -> None:
    calls: list[tuple[str, tuple[int, ...]]] = []

    def measure(layer: Any, shape: tuple[int, ...]) -> float:
        calls.append((type(layer).__name__, shape))
        return _cost(layer, shape)

    predictor = LatencyPredictor(_supernet(), measure=measure)
    arch = next(iter(SPACE.enumerate()))
    expected = sum(_cost(layer, s) for layer, s in _layers_with_shapes(arch))
    assert predictor.predict(arch) == pytest.approx(expected)
    assert len(calls) == arch.num_cells + 2  # stem, cells, head
    assert calls[0][1] == (1, 8, 8)
    predictor.predict(arch)
    assert len(calls) == arch.num_cells + 2  # measured once, then looked up
    assert predictor.coefficients == (1.0, 0.0)


def _layers_with_shapes(arch: Any) -> list[tuple[Any, tuple[int, ...]]]:
    x = torch.zeros(1, 1, 8, 8)
    out = []
    for layer in _supernet().layers(arch):
        layer.eval()
        out.append((layer, tuple(x.shape[1:])))
        with torch.no_grad():
            x = layer(x)
    return out


def test_fit_recovers_scale_and_offset() -> None:
    predictor = LatencyPredictor(_supernet(), measure=_cost)
    archs = list(SPACE.enumerate())[::97][:12]
    sums = [predictor.predict(a) for a in archs]
    assert len(set(np.round(sums, 12))) > 3
    scale, offset = predictor.fit([(a, 2.5 * s + 3e-4) for a, s in zip(archs, sums)])
    assert scale == pytest.approx(2.5, rel=1e-6) and offset == pytest.approx(3e-4, rel=1e-6)
    assert predictor.coefficients == (scale, offset)
    other = list(SPACE.enumerate())[5]
    unfitted = LatencyPredictor(_supernet(), measure=_cost).predict(other)
    assert predictor.predict(other) == pytest.approx(2.5 * unfitted + 3e-4)


def test_fit_never_goes_negative() -> None:
    predictor = LatencyPredictor(_supernet(), measure=_cost)
    archs = list(SPACE.enumerate())[::131][:8]
    sums = np.array([predictor.predict(a) for a in archs])
    # Larger models measured faster: no positive scale explains it; offsets stay >= 0.
    scale, offset = predictor.fit([(a, float(1.0 / s)) for a, s in zip(archs, sums)])
    assert scale > 0 and offset >= 0
    assert all(predictor.predict(a) > 0 for a in archs)
    # One measurement: a ratio.
    scale, offset = predictor.fit([(archs[0], 2 * float(sums[0]))])
    assert (scale, offset) == (pytest.approx(2.0), 0.0)


def test_fit_and_measure_errors() -> None:
    predictor = LatencyPredictor(_supernet(), measure=_cost)
    arch = next(iter(SPACE.enumerate()))
    with pytest.raises(ValueError, match="`measurements` is empty"):
        predictor.fit([])
    with pytest.raises(ValueError, match="but must be > 0"):
        predictor.fit([(arch, -1.0)])
    with pytest.raises(TypeError, match="`measure` must be callable"):
        LatencyPredictor(_supernet(), measure=3)  # type: ignore[arg-type]
    broken = LatencyPredictor(_supernet(), measure=lambda layer, shape: float("nan"))
    with pytest.raises(ValueError, match="`measure` returned nan"):
        broken.predict(arch)


def test_default_is_unchanged_torch_timing() -> None:
    predictor = LatencyPredictor(_supernet(), repeats=2)
    arch = next(iter(SPACE.enumerate()))
    value = predictor.predict(arch)
    assert value == pytest.approx(sum(predictor.table[k] for k in predictor._keys(arch)))
    assert predictor.coefficients == (1.0, 0.0)


def test_fitted_on_onnxruntime_latency() -> None:
    """Layers and whole models timed with onnxruntime: the fit can only reduce the error."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from optuna_hpcnas.deploy import onnx_latency

    supernet = _supernet().eval()
    predictor = LatencyPredictor(
        supernet, measure=lambda layer, shape: onnx_latency(layer, shape, int8=False, repeats=10)
    )
    first = next(iter(SPACE.enumerate()))
    archs = [first, SPACE.mutate(first, np.random.default_rng(0), level="operator")]
    measured = [
        onnx_latency(supernet.subnet(a).eval(), (1, 8, 8), int8=False, repeats=10) for a in archs
    ]
    before = np.array([predictor.predict(a) for a in archs]) - measured
    predictor.fit(zip(archs, measured))
    after = np.array([predictor.predict(a) for a in archs]) - measured
    assert float((after**2).sum()) <= float((before**2).sum()) * (1 + 1e-9)
