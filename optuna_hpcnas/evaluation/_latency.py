"""A latency predictor: a per-layer lookup table calibrated on this device (as nn-Meter does
with kernels), so a candidate's latency is known without building and timing the whole net.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from optuna_hpcnas.evaluation._measure import measure_latency
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.supernet import SuperNet


class LatencyPredictor:
    """Predicts the forward latency of a subnet as the sum of its layers' measured latencies.

    A layer is keyed by what determines its cost: its kind, the topology, the cell
    configuration and the widths it reads. A missing entry is measured once (the layer alone,
    median of ``repeats`` timed forwards on ``batch_size`` samples) and kept in the table.

    Args:
        supernet: The supernet whose layers are timed.
        batch_size: Samples per timed forward.
        repeats: Timed forwards per entry.
    """

    def __init__(self, supernet: SuperNet, *, batch_size: int = 1, repeats: int = 10) -> None:
        if not isinstance(supernet, SuperNet):
            raise TypeError(f"`supernet` must be a SuperNet, but got {type(supernet).__name__}.")
        if repeats < 1:
            raise ValueError(f"`repeats` is {repeats}, but must be >= 1.")
        self._supernet = supernet
        self._batch_size = batch_size
        self._repeats = repeats
        self._table: dict[str, float] = {}

    def _keys(self, arch: Architecture) -> list[str]:
        widths = self._supernet.widths(arch)
        n = arch.num_cells
        keys = ["stem"]
        for i, cell in enumerate(arch.cells):
            reads = widths[: i + 1] if arch.topology == "dense" else widths[i : i + 1]
            last = arch.topology == "dense" and i == n - 1
            keys.append(f"cell|{arch.topology}|{cell}|{list(reads)}|{last}")
        keys.append(f"head|{widths[-1]}")
        return keys

    def _measure(self, arch: Architecture, missing: set[str]) -> None:
        layers = self._supernet.layers(arch)
        shape = (self._batch_size, *self._supernet.input_shape)
        x = torch.zeros(shape)
        for key, layer in zip(self._keys(arch), layers):
            layer.eval()
            if key in missing:
                self._table[key] = measure_latency(
                    layer, tuple(x.shape[1:]), batch_size=x.shape[0], repeats=self._repeats
                )
            with torch.no_grad():
                x = layer(x)

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
        keys = self._keys(arch)
        missing = set(keys) - set(self._table)
        if missing:
            self._measure(arch, missing)
        return float(sum(self._table[k] for k in keys))

    @property
    def table(self) -> dict[str, float]:
        """The lookup table (JSON-ready copy)."""
        return dict(self._table)

    def load_table(self, table: dict[str, Any]) -> None:
        self._table.update({str(k): float(v) for k, v in table.items()})
