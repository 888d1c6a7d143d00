"""A user's own operator: squeeze-and-excitation over the channels of a sequence.

``SqueezeExcite1d`` gates each channel of an ``(N, L, C)`` sequence by a weight computed from
the whole sequence (Hu et al. 2018): ``x * sigmoid(W2 relu(W1 mean_L(x)))``. As every
operator of the supernet it holds the weights of its largest size and slices them for the
width it is given (weight sharing), and ``export`` copies the slice into a standalone module.

Two ways to search it, both adding it to every cell's choices:

* Python (``own_operator.py``): ``OperatorRegistry.register(OperatorSpec(..., factory=...))``.
* TOML (``own_operator.toml``): a ``[[space.operator]]`` table naming
  ``factory = "own_ops:make_squeeze_excite"``; the module must be importable (installed, or
  on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
import torch.nn.functional as F

from optuna_hpcnas import CellConfig
from optuna_hpcnas.supernet import SharedOp


class SqueezeExcite1d(SharedOp):
    """Channel gating of an ``(N, L, C)`` sequence; the output has the input's width."""

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.domain = "sequence"
        self.channels, self.reduction = channels, reduction
        self.squeeze = nn.Linear(channels, self._hidden(channels))
        self.excite = nn.Linear(self._hidden(channels), channels)

    def _hidden(self, channels: int) -> int:
        return max(1, channels // self.reduction)

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        c = x.shape[-1]
        h = self._hidden(c)
        s = F.relu(F.linear(x.mean(1), self.squeeze.weight[:h, :c], self.squeeze.bias[:h]))
        gate = torch.sigmoid(F.linear(s, self.excite.weight[:c, :h], self.excite.bias[:c]))
        return x * gate[:, None, :]

    def export(self, c_in: int, cell: CellConfig) -> SqueezeExcite1d:
        out = SqueezeExcite1d(c_in, self.reduction)
        h = out._hidden(c_in)
        with torch.no_grad():
            out.squeeze.weight.copy_(self.squeeze.weight[:h, :c_in])
            out.squeeze.bias.copy_(self.squeeze.bias[:h])
            out.excite.weight.copy_(self.excite.weight[:c_in, :h])
            out.excite.bias.copy_(self.excite.bias[:c_in])
        return out


def make_squeeze_excite(*, spec: Any, domain: str, channels: int) -> SqueezeExcite1d:
    """The factory ``SuperNet`` calls: the operator at the space's widest ``channels``."""
    if domain != "sequence":
        raise ValueError(f"{spec.name!r} works on sequences, not {domain!r} data")
    return SqueezeExcite1d(channels)
