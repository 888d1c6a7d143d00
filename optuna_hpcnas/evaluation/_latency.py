"""A latency predictor: a per-layer lookup table calibrated on this device (as nn-Meter does
with kernels), so a candidate's latency is known without building and timing the whole net.

The layers are timed with torch by default; ``measure=`` times them where the model will run
(``optuna_hpcnas.deploy.onnx_latency``: INT8 onnxruntime), and ``fit`` maps the sum of the
layers onto whole-model measurements (per-session overhead, fusion across layers).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from optuna_hpcnas.evaluation._measure import measure_latency
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.supernet import FewShotSuperNet
from optuna_hpcnas.supernet import SuperNet


class LatencyPredictor:
    """Predicts the forward latency of a subnet as the sum of its layers' measured latencies.

    A layer is keyed by what determines its cost: its kind, the topology, the cell
    configuration and the widths it reads. A missing entry is measured once (the layer alone,
    median of ``repeats`` timed forwards on ``batch_size`` samples, or ``measure``) and kept in
    the table. The prediction is ``scale * sum(entries) + offset``, with ``scale = 1`` and
    ``offset = 0`` until ``fit`` is called.

    Args:
        supernet: The supernet whose layers are timed.
        batch_size: Samples per timed forward (of the default torch measurement).
        repeats: Timed forwards per entry (of the default torch measurement).
        measure: ``measure(layer, input_shape) -> seconds`` for one layer (``input_shape``
            without the batch axis), instead of timing it with torch; for example
            ``lambda layer, shape: onnx_latency(layer, shape)`` from ``optuna_hpcnas.deploy``
            for INT8 onnxruntime latency.

    Examples:
        >>> from optuna_hpcnas.deploy import onnx_latency  # doctest: +SKIP
        >>> predictor = LatencyPredictor(  # doctest: +SKIP
        ...     supernet, measure=lambda layer, shape: onnx_latency(layer, shape, repeats=20)
        ... )
        >>> predictor.fit(  # doctest: +SKIP
        ...     [(a, onnx_latency(supernet.subnet(a), supernet.input_shape)) for a in archs]
        ... )
    """

    def __init__(
        self,
        supernet: SuperNet | FewShotSuperNet,
        *,
        batch_size: int = 1,
        repeats: int = 10,
        measure: Callable[[nn.Module, tuple[int, ...]], float] | None = None,
    ) -> None:
        if not isinstance(supernet, (SuperNet, FewShotSuperNet)):
            raise TypeError(f"`supernet` must be a SuperNet, but got {type(supernet).__name__}.")
        if repeats < 1:
            raise ValueError(f"`repeats` is {repeats}, but must be >= 1.")
        if measure is not None and not callable(measure):
            raise TypeError(f"`measure` must be callable, but got {measure!r}.")
        self._supernet = supernet
        self._batch_size = batch_size
        self._repeats = repeats
        self._measure_layer = measure
        self._table: dict[str, float] = {}
        self._scale = 1.0
        self._offset = 0.0

    def _keys(self, arch: Architecture) -> list[str]:
        widths = self._supernet.widths(arch)
        # a sequence cell costs by the positions it reads too (earlier cells may downsample)
        lengths: list[int | None] = [None] * len(widths)
        if self._supernet.domain != "image":
            lengths = list(self._supernet.lengths(arch))
        n = arch.num_cells
        keys = [f"stem|{arch.stem}"]
        for i, cell in enumerate(arch.cells):
            reads = widths[: i + 1] if arch.topology == "dense" else widths[i : i + 1]
            last = arch.topology == "dense" and i == n - 1
            keys.append(f"cell|{arch.topology}|{cell}|{list(reads)}|{lengths[i]}|{last}")
        keys.append(f"head|{arch.head}|{widths[-1]}|{lengths[-1]}")
        return keys

    def _measure(self, arch: Architecture, missing: set[str]) -> None:
        layers = self._supernet.layers(arch)
        shape = (self._batch_size, *self._supernet.input_shape)
        x = torch.zeros(shape)
        for key, layer in zip(self._keys(arch), layers):
            layer.eval()
            if key in missing:
                self._table[key] = self._time(layer, tuple(x.shape[1:]))
            with torch.no_grad():
                x = layer(x)

    def _time(self, layer: nn.Module, shape: tuple[int, ...]) -> float:
        if self._measure_layer is None:
            return measure_latency(
                layer, shape, batch_size=self._batch_size, repeats=self._repeats
            )
        seconds = float(self._measure_layer(layer, shape))
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"`measure` returned {seconds!r}, but must return seconds >= 0.")
        return seconds

    def _layer_sum(self, arch: Architecture) -> float:
        keys = self._keys(arch)
        missing = set(keys) - set(self._table)
        if missing:
            self._measure(arch, missing)
        return float(sum(self._table[k] for k in keys))

    def calibrate(self, archs: Iterable[Architecture]) -> int:
        """Measure every entry ``archs`` need; the number of new entries."""
        before = len(self._table)
        for arch in archs:
            missing = set(self._keys(arch)) - set(self._table)
            if missing:
                self._measure(arch, missing)
        return len(self._table) - before

    def predict(self, arch: Architecture) -> float:
        """Predicted latency (seconds) of ``arch``; measures missing entries first."""
        return self._scale * self._layer_sum(arch) + self._offset

    def fit(self, measurements: Iterable[tuple[Architecture, float]]) -> tuple[float, float]:
        """Fit ``scale`` and ``offset`` to whole-model latencies; returns them.

        ``measurements`` are ``(architecture, seconds)`` pairs measured where the model runs
        (e.g. ``onnx_latency`` of ``supernet.subnet(arch)``). Least squares of
        ``seconds ~ scale * sum(layer entries) + offset`` with both kept >= 0 (so a fit never
        predicts a negative latency); the table entries the architectures need are measured
        first. With one measurement, or sums that do not vary, only the scale is fitted.
        """
        from scipy.optimize import nnls  # scipy comes with scikit-learn (the torch extra)

        pairs = [(arch, float(seconds)) for arch, seconds in measurements]
        if not pairs:
            raise ValueError("`measurements` is empty; give (architecture, seconds) pairs.")
        for arch, seconds in pairs:
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"Measured latency of {arch} is {seconds!r}, but must be > 0.")
        sums = np.array([self._layer_sum(arch) for arch, _ in pairs])
        target = np.array([seconds for _, seconds in pairs])
        if len(pairs) >= 2 and np.ptp(sums) > 1e-12 * max(float(sums.max()), 1e-30):
            (scale, offset), _ = nnls(np.column_stack([sums, np.ones_like(sums)]), target)
        else:
            scale, offset = 0.0, 0.0
        if scale <= 0:  # degenerate: the layers do not explain the differences
            scale, offset = float(target.sum() / max(sums.sum(), 1e-30)), 0.0
        self._scale, self._offset = float(scale), float(offset)
        return self._scale, self._offset

    @property
    def coefficients(self) -> tuple[float, float]:
        """``(scale, offset)`` of the prediction (``(1.0, 0.0)`` until ``fit``)."""
        return self._scale, self._offset

    @property
    def table(self) -> dict[str, float]:
        """The lookup table (JSON-ready copy)."""
        return dict(self._table)

    def load_table(self, table: dict[str, Any]) -> None:
        self._table.update({str(k): float(v) for k, v in table.items()})
