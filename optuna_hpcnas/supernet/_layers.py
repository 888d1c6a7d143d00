"""Stem, head and cell wrappers: the layers a subnet is made of, in execution order.

A subnet is ``Sequential(stem, cell_0, ..., cell_{n-1}, head)``; every layer takes and returns
one tensor, so the sequence can be cut anywhere into pipeline stages. The macro topology is
flattened as follows:

* ``chain``: ``x_{i+1} = op_i(x_i)``.
* ``residual``: ``x_{i+1} = op_i(x_i) + x_i`` (the narrower tensor zero-padded to the wider).
* ``dense``: cell ``i`` sees every earlier state ``x_0 .. x_i`` (``x_0`` is the stem output):
  a 1x1 projection of their concatenation to the width of ``x_i``, then ``op_i``. The layer
  carries the running concatenation ``[x_0, ..., x_{i+1}]`` forward; the last cell returns
  ``x_n`` alone.

Cell 0 of a dense net has a single earlier state and no projection.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
import torch.nn.functional as F

from optuna_hpcnas.search_space import CellConfig
from optuna_hpcnas.search_space import pooling_factor
from optuna_hpcnas.search_space import stem_positions
from optuna_hpcnas.supernet._ops import _copy_bn
from optuna_hpcnas.supernet._ops import _copy_ln
from optuna_hpcnas.supernet._ops import IMAGE
from optuna_hpcnas.supernet._ops import SharedOp
from optuna_hpcnas.supernet._ops import sliced_batch_norm
from optuna_hpcnas.supernet._ops import sliced_layer_norm


def to_length(x: torch.Tensor, length: int) -> torch.Tensor:
    """A ``(N, L, C)`` sequence averaged down to ``length`` positions (a shortcut or an earlier
    state beside a cell that downsampled); unchanged when it has them already."""
    if x.dim() != 3 or x.shape[1] == length:
        return x
    return F.adaptive_avg_pool1d(x.transpose(1, 2), length).transpose(1, 2)


def padded_add(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """``a + b`` where the narrower tensor (along ``dim``) is zero-padded to the wider; a
    longer sequence is averaged down to the shorter one's positions first."""
    if a.dim() == 3 and a.shape[1] != b.shape[1]:
        if a.shape[1] > b.shape[1]:
            a = to_length(a, b.shape[1])
        else:
            b = to_length(b, a.shape[1])
    ca, cb = a.shape[dim], b.shape[dim]
    if ca == cb:
        return a + b
    if ca < cb:
        a, b = b, a
    narrow = b.shape[dim]
    if dim in (1, -3) and a.dim() == 4:
        head = a[:, :narrow] + b
        return torch.cat([head, a[:, narrow:]], dim=1)
    head = a[..., :narrow] + b
    return torch.cat([head, a[..., narrow:]], dim=-1)


class Stem(nn.Module):
    """What turns a sample into the first state, by ``kind``:

    * ``"conv"`` (images): 3x3 conv-BN-ReLU to ``channels``;
    * ``"embed"`` (sequences): a linear embedding to ``channels`` plus learned positions;
    * ``"none"`` (sequences): the sample itself, ``(L, F)``;
    * ``"flatten"`` (sequences): every position as one token, ``(1, L * F)``.

    A sequence longer than ``MAX_POSITIONS`` is first averaged over windows of
    ``pooling_factor(L)`` positions (``optuna_hpcnas.search_space.fit_to_input``).
    """

    def __init__(
        self, input_shape: Sequence[int], channels: int, domain: str, kind: str | None = None
    ) -> None:
        super().__init__()
        self.domain = domain
        self.kind = kind or ("conv" if domain == IMAGE else "embed")
        self.input_shape = tuple(int(s) for s in input_shape)
        self.pool = pooling_factor(self.input_shape[0]) if domain != IMAGE else 1
        if self.kind == "conv":
            self.conv = nn.Conv2d(self.input_shape[0], channels, 3, padding=1, bias=False)
            nn.init.kaiming_normal_(self.conv.weight, mode="fan_in", nonlinearity="relu")
            self.bn = nn.BatchNorm2d(channels)
        elif self.kind == "embed":
            length, features = stem_positions(self.input_shape[0]), self.input_shape[1]
            self.embed = nn.Linear(features, channels)
            self.position = nn.Parameter(torch.randn(length, channels) * 0.02)
        elif self.kind not in ("none", "flatten"):
            raise ValueError(f"Stem kind {self.kind!r} is not one of conv, embed, none, flatten.")

    @staticmethod
    def out_shape(input_shape: Sequence[int], channels: int, kind: str | None) -> tuple[int, int]:
        """``(positions, width)`` of a sequence stem's output."""
        length, features = stem_positions(int(input_shape[0])), int(input_shape[1])
        if kind == "none":
            return length, features
        if kind == "flatten":
            return 1, length * features
        return length, channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "conv":
            return F.relu(self.bn(self.conv(x)))
        if self.pool > 1:
            x = F.avg_pool1d(x.transpose(1, 2), self.pool, ceil_mode=True).transpose(1, 2)
        if self.kind == "embed":
            return self.embed(x) + self.position
        if self.kind == "flatten":
            return x.reshape(x.shape[0], 1, -1)
        return x


class SharedHead(nn.Module):
    """Average pooling to a ``grid x grid`` map (global pooling loses where strokes are, which
    matters on small images), then a linear classifier sliced to the input width.
    Sequences: the mean over the positions, then the classifier; after pre-norm attention
    or transformer cells (``normalize``) a LayerNorm first, their residual stream's final
    norm. Convolutional paths are pooled as they are: normalising every position's channels
    before the pooling loses how strongly each feature fires (about 10 points of test
    accuracy for the FCN on a small time-series set, docs/signals.md).
    """

    def __init__(
        self, channels: int, num_classes: int, domain: str, grid: int = 2, *, norm: bool = True
    ) -> None:
        super().__init__()
        self.domain, self.channels, self.grid = domain, channels, grid if domain == IMAGE else 1
        self.norm = nn.LayerNorm(channels) if domain != IMAGE and norm else None
        self.fc = nn.Linear(channels * self.grid * self.grid, num_classes)

    def forward(self, x: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Logits of ``x``; ``normalize``: the LayerNorm before the pooling, where this
        head has one (the supernet's shared head decides per path)."""
        if self.domain == IMAGE:
            pooled = F.adaptive_avg_pool2d(x, self.grid).flatten(1)
        else:
            normed = sliced_layer_norm(x, self.norm) if normalize and self.norm is not None else x
            pooled = normed.mean(dim=1)
        c = x.shape[1] if self.domain == IMAGE else x.shape[-1]
        return F.linear(pooled, self._weight(c), self.fc.bias)

    def _weight(self, c: int) -> torch.Tensor:
        cells = self.grid * self.grid
        weight = self.fc.weight.view(self.fc.out_features, self.channels, cells)
        return weight[:, :c].reshape(self.fc.out_features, c * cells)

    def export(self, c_in: int, normalize: bool = True) -> SharedHead:
        """A standalone head of input width ``c_in``, with the LayerNorm if ``normalize``."""
        out = SharedHead(c_in, self.fc.out_features, self.domain, self.grid, norm=normalize)
        with torch.no_grad():
            out.fc.weight.copy_(self._weight(c_in))
            out.fc.bias.copy_(self.fc.bias)
            if self.norm is not None and out.norm is not None:
                _copy_ln(self.norm, out.norm, c_in)
        return out


class FlattenHead(nn.Module):
    """A linear classifier on every position of the last state, ``(N, L, C) -> (N, L * C)``
    (the MNIST-1D paper's heads). The shared weight keeps one ``(classes, L, channels)`` block
    per length a path can end with, sliced to the path's width.

    Written as the mean over positions of a per-position classifier, ``mean_l W_l x_l + b``:
    the same function and parameters as ``nn.Linear(L * C, classes)`` (its weight is ``W / L``),
    but an optimizer step moves the logits as much as a pooled head's would, whatever ``L``.
    As a plain linear layer on 40 x 100 features, one Adam step at the supernet's learning rate
    moved the logits by tens and the supernet's loss diverged.
    """

    def __init__(self, channels: int, num_classes: int, lengths: Sequence[int]) -> None:
        super().__init__()
        self.channels, self.num_classes = channels, num_classes
        self.weights = nn.ParameterDict()
        bound = 1.0 / channels**0.5  # each position's classifier starts as nn.Linear(C, .)
        for length in sorted(set(int(n) for n in lengths)):
            w = torch.empty(num_classes, length, channels).uniform_(-bound, bound)
            self.weights[str(length)] = nn.Parameter(w)
        self.bias = nn.Parameter(torch.empty(num_classes).uniform_(-bound, bound))

    def _weight(self, length: int, c: int) -> torch.Tensor:
        key = str(length)
        if key not in self.weights:
            raise ValueError(
                f"A path ends with {length} positions; this head has weights for "
                f"{sorted(int(k) for k in self.weights)}."
            )
        return self.weights[key][:, :, :c].reshape(self.num_classes, length * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, c = x.shape
        return F.linear(x.reshape(n, length * c), self._weight(length, c) / length, self.bias)

    def export(self, c_in: int, length: int) -> FlattenHead:
        out = FlattenHead(c_in, self.num_classes, [length])
        with torch.no_grad():
            out.weights[str(length)].copy_(
                self._weight(length, c_in).view_as(out.weights[str(length)])
            )
            out.bias.copy_(self.bias)
        return out


class DenseProjection(nn.Module):
    """1x1 projection of the concatenated earlier states (each at most ``channels`` wide).

    The shared weight reserves ``channels`` input columns per earlier state; a state of width
    ``c_j`` uses the first ``c_j`` columns of its block.
    """

    def __init__(self, num_inputs: int, channels: int, domain: str) -> None:
        super().__init__()
        self.domain, self.channels, self.num_inputs = domain, channels, num_inputs
        self.weight = nn.Parameter(torch.empty(channels, num_inputs * channels))
        nn.init.kaiming_normal_(self.weight, mode="fan_in", nonlinearity="relu")
        self.norm: nn.Module = (
            nn.BatchNorm2d(channels) if domain == IMAGE else nn.LayerNorm(channels)
        )

    def _weight(self, widths: Sequence[int], c_out: int) -> torch.Tensor:
        blocks = [
            self.weight[:c_out, j * self.channels : j * self.channels + c]
            for j, c in enumerate(widths)
        ]
        return torch.cat(blocks, dim=1)

    def project(self, x: torch.Tensor, widths: Sequence[int], c_out: int) -> torch.Tensor:
        w = self._weight(widths, c_out)
        if self.domain == IMAGE:
            y = F.conv2d(x, w[:, :, None, None])
            assert isinstance(self.norm, nn.BatchNorm2d)
            return F.relu(sliced_batch_norm(y, self.norm))
        assert isinstance(self.norm, nn.LayerNorm)
        return F.relu(sliced_layer_norm(F.linear(x, w), self.norm))

    def export(self, widths: Sequence[int], c_out: int) -> DenseProjection:
        out = DenseProjection(1, c_out, self.domain)
        out.weight = nn.Parameter(self._weight(widths, c_out).detach().clone())
        out.channels = sum(widths)
        if isinstance(self.norm, nn.BatchNorm2d):
            _copy_bn(self.norm, out.norm, c_out)
        else:
            assert isinstance(self.norm, nn.LayerNorm) and isinstance(out.norm, nn.LayerNorm)
            _copy_ln(self.norm, out.norm, c_out)
        return out


class CellLayer(nn.Module):
    """One cell of a subnet with its place in the topology (see the module docstring)."""

    def __init__(
        self,
        op: SharedOp,
        cell: CellConfig,
        *,
        topology: str,
        domain: str,
        widths_before: Sequence[int] = (),
        projection: DenseProjection | None = None,
        last: bool = False,
    ) -> None:
        super().__init__()
        self.op = op
        self.cell = cell
        self.topology = topology
        self.dim = 1 if domain == IMAGE else -1
        self.widths_before = tuple(widths_before)
        self.projection = projection
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.topology == "chain":
            return self.op(x, self.cell)
        if self.topology == "residual":
            return padded_add(self.op(x, self.cell), x, self.dim)
        # Dense: x is the concatenation of the earlier states.
        if self.projection is not None:
            c_last = self.widths_before[-1]
            h = self.projection.project(x, [x.shape[self.dim]], c_last)
        else:
            h = x
        y = self.op(h, self.cell)
        if self.last:
            return y
        if y.dim() == 3:  # a sequence cell that downsampled: the earlier states follow it
            x = to_length(x, y.shape[1])
        return torch.cat([x, y], dim=self.dim)
