"""Weight-sharing candidate operators of one supernet cell.

Every operator is allocated once at its largest size (widest channels, largest kernel, largest
expansion ratio) and runs any smaller configuration by *slicing* its tensors, as in
Once-for-All: the first ``c`` input channels, the first ``w`` output channels, the centred
``k x k`` window of the kernel. ``export`` copies those slices into a new operator of exactly
the requested size, so a subnet is plain PyTorch that shares no storage with the supernet and
computes the same function.

Tensor layouts: images ``(N, C, H, W)``, sequences ``(N, L, C)``. Channels are the operator's
width; ``x.shape[channel_dim]`` is the input width, read at run time.
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING

import torch
from torch import nn
import torch.nn.functional as F

from optuna_hpcnas.search_space import CellConfig
from optuna_hpcnas.search_space import OperatorSpec

if TYPE_CHECKING:
    from collections.abc import Callable

IMAGE = "image"
SEQUENCE = "sequence"


def channel_dim(domain: str) -> int:
    return 1 if domain == IMAGE else -1


def _crop(weight: torch.Tensor, k: int, dims: int) -> torch.Tensor:
    """The centred ``k``-window of the last ``dims`` (kernel) dimensions."""
    big = weight.shape[-1]
    if k == big:
        return weight
    start = (big - k) // 2
    if dims == 2:
        return weight[..., start : start + k, start : start + k]
    return weight[..., start : start + k]


def sliced_batch_norm(x: torch.Tensor, bn: nn.BatchNorm2d | nn.BatchNorm1d) -> torch.Tensor:
    """``bn`` applied to the first ``x.shape[1]`` channels (running stats update in place)."""
    c = x.shape[1]
    assert bn.running_mean is not None and bn.running_var is not None
    use_batch = bn.training or not bn.track_running_stats
    # As ``nn.BatchNorm2d.forward``: count the batch, and ``momentum=None`` means the
    # cumulative average (what BatchNorm recalibration sets), not a fixed factor.
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:
            factor = 1.0 / float(bn.num_batches_tracked)
    return F.batch_norm(
        x,
        bn.running_mean[:c],
        bn.running_var[:c],
        bn.weight[:c],
        bn.bias[:c],
        use_batch,
        factor,
        bn.eps,
    )


def sliced_layer_norm(x: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
    c = x.shape[-1]
    return F.layer_norm(x, (c,), ln.weight[:c], ln.bias[:c], ln.eps)


def _copy_bn(src: nn.BatchNorm2d | nn.BatchNorm1d, dst: nn.Module, c: int) -> None:
    assert isinstance(dst, (nn.BatchNorm2d, nn.BatchNorm1d))
    assert src.running_mean is not None and src.running_var is not None
    assert dst.running_mean is not None and dst.running_var is not None
    with torch.no_grad():
        dst.weight.copy_(src.weight[:c])
        dst.bias.copy_(src.bias[:c])
        dst.running_mean.copy_(src.running_mean[:c])
        dst.running_var.copy_(src.running_var[:c])
        if src.num_batches_tracked is not None and dst.num_batches_tracked is not None:
            dst.num_batches_tracked.copy_(src.num_batches_tracked)


def _copy_ln(src: nn.LayerNorm, dst: nn.LayerNorm, c: int) -> None:
    with torch.no_grad():
        dst.weight.copy_(src.weight[:c])
        dst.bias.copy_(src.bias[:c])


class SharedOp(nn.Module, abc.ABC):
    """Base class of a weight-sharing operator: ``forward(x, cell)`` and ``export``."""

    domain: str

    def out_channels(self, c_in: int, cell: CellConfig) -> int:
        """Width of the output for an input of ``c_in`` channels."""
        return c_in

    def out_length(self, length: int, cell: CellConfig) -> int:
        """Positions of the output for a sequence of ``length`` positions."""
        return length

    @abc.abstractmethod
    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        """The operator applied to ``x`` with the micro parameters of ``cell``."""

    @abc.abstractmethod
    def export(self, c_in: int, cell: CellConfig) -> SharedOp:
        """A standalone copy sized exactly for ``c_in`` channels and ``cell``."""


class ConvOp(SharedOp):
    """Conv-BN-ReLU; ``separable`` makes it depthwise (dilated) + pointwise, as in DARTS."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        *,
        dilation: int = 1,
        separable: bool = False,
        fixed_kernel: int | None = None,
    ) -> None:
        super().__init__()
        self.domain = IMAGE
        self.c_in, self.c_out, self.kernel = c_in, c_out, kernel
        self.dilation, self.separable, self.fixed_kernel = dilation, separable, fixed_kernel
        if separable:
            self.depthwise = nn.Parameter(torch.empty(c_in, 1, kernel, kernel))
            self.pointwise = nn.Parameter(torch.empty(c_out, c_in, 1, 1))
            nn.init.kaiming_normal_(self.depthwise, mode="fan_out", nonlinearity="relu")
            nn.init.kaiming_normal_(self.pointwise, mode="fan_in", nonlinearity="relu")
        else:
            self.weight = nn.Parameter(torch.empty(c_out, c_in, kernel, kernel))
            nn.init.kaiming_normal_(self.weight, mode="fan_in", nonlinearity="relu")
        self.bn = nn.BatchNorm2d(c_out)

    def _kernel(self, cell: CellConfig) -> int:
        return self.fixed_kernel or cell.kernel or self.kernel

    def out_channels(self, c_in: int, cell: CellConfig) -> int:
        return cell.width or self.c_out

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        c, w, k = x.shape[1], self.out_channels(x.shape[1], cell), self._kernel(cell)
        pad = self.dilation * (k - 1) // 2
        if self.separable:
            dw = _crop(self.depthwise[:c], k, 2)
            x = F.conv2d(x, dw, padding=pad, dilation=self.dilation, groups=c)
            x = F.conv2d(x, self.pointwise[:w, :c])
        else:
            x = F.conv2d(x, _crop(self.weight[:w, :c], k, 2), padding=pad, dilation=self.dilation)
        return F.relu(sliced_batch_norm(x, self.bn))

    def export(self, c_in: int, cell: CellConfig) -> ConvOp:
        w, k = self.out_channels(c_in, cell), self._kernel(cell)
        out = ConvOp(c_in, w, k, dilation=self.dilation, separable=self.separable, fixed_kernel=k)
        with torch.no_grad():
            if self.separable:
                out.depthwise.copy_(_crop(self.depthwise[:c_in], k, 2))
                out.pointwise.copy_(self.pointwise[:w, :c_in])
            else:
                out.weight.copy_(_crop(self.weight[:w, :c_in], k, 2))
        _copy_bn(self.bn, out.bn, w)
        return out


class PoolOp(SharedOp):
    """3x3 max or average pooling, stride 1 (shape-preserving; average excludes padding).

    On CPU an NCHW ``max_pool2d`` costs several times a 3x3 convolution of the same size, so
    max pooling runs in ``channels_last`` (about 3x faster here) and average pooling as a
    depthwise convolution with a box kernel (about 3.5x faster than ``avg_pool2d``).
    """

    def __init__(self, kind: str, kernel: int = 3, domain: str = IMAGE) -> None:
        super().__init__()
        if kind not in ("max", "avg"):
            raise ValueError(f"Pooling kind is {kind!r}, but must be 'max' or 'avg'.")
        self.kind, self.kernel, self.domain = kind, kernel, domain

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        k, pad = self.kernel, self.kernel // 2
        if self.kind == "max":
            x = x.contiguous(memory_format=torch.channels_last)
            return F.max_pool2d(x, k, 1, pad).contiguous()
        c = x.shape[1]
        box = torch.ones(c, 1, k, k, dtype=x.dtype, device=x.device)
        ones = torch.ones(1, 1, *x.shape[2:], dtype=x.dtype, device=x.device)
        counts = F.conv2d(ones, box[:1], padding=pad)
        return F.conv2d(x, box, padding=pad, groups=c) / counts

    def export(self, c_in: int, cell: CellConfig) -> PoolOp:
        return PoolOp(self.kind, self.kernel, self.domain)


class IdentityOp(SharedOp):
    def __init__(self, domain: str) -> None:
        super().__init__()
        self.domain = domain

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        return x

    def export(self, c_in: int, cell: CellConfig) -> IdentityOp:
        return IdentityOp(self.domain)


class Conv1dOp(SharedOp):
    """Sequence convolution: Conv1d-LayerNorm-ReLU over ``(N, L, C)`` tensors."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, fixed_kernel: int | None = None
    ) -> None:
        super().__init__()
        self.domain = SEQUENCE
        self.c_in, self.c_out, self.kernel, self.fixed_kernel = c_in, c_out, kernel, fixed_kernel
        self.weight = nn.Parameter(torch.empty(c_out, c_in, kernel))
        nn.init.kaiming_normal_(self.weight, mode="fan_in", nonlinearity="relu")
        self.bias = nn.Parameter(torch.zeros(c_out))
        self.norm = nn.LayerNorm(c_out)

    def _kernel(self, cell: CellConfig) -> int:
        return self.fixed_kernel or cell.kernel or self.kernel

    def out_channels(self, c_in: int, cell: CellConfig) -> int:
        return cell.width or self.c_out

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        c, w, k = x.shape[-1], self.out_channels(x.shape[-1], cell), self._kernel(cell)
        y = F.conv1d(x.transpose(1, 2), _crop(self.weight[:w, :c], k, 1), self.bias[:w], 1, k // 2)
        return F.relu(sliced_layer_norm(y.transpose(1, 2), self.norm))

    def export(self, c_in: int, cell: CellConfig) -> Conv1dOp:
        w, k = self.out_channels(c_in, cell), self._kernel(cell)
        out = Conv1dOp(c_in, w, k, fixed_kernel=k)
        with torch.no_grad():
            out.weight.copy_(_crop(self.weight[:w, :c_in], k, 1))
            out.bias.copy_(self.bias[:w])
        _copy_ln(self.norm, out.norm, w)
        return out


def effective_heads(heads: int, width: int) -> int:
    """The most heads, up to ``heads``, that divide ``width`` (a width a space reaches from a
    raw signal or a paper's odd width can be indivisible by the searched head count)."""
    return max(h for h in range(1, heads + 1) if width % h == 0)


class AttentionOp(SharedOp):
    """Pre-norm multi-head self-attention, plus a feed-forward block when ``ffn`` (transformer).

    On images the tokens are the ``H x W`` positions. Both sub-blocks are residual, so the
    width is the input width; the heads split the (sliced) width.
    """

    def __init__(self, channels: int, *, domain: str, ffn: bool, max_expansion: int = 4) -> None:
        super().__init__()
        self.domain, self.channels, self.ffn, self.max_expansion = (
            domain,
            channels,
            ffn,
            max_expansion,
        )
        self.norm1 = nn.LayerNorm(channels)
        self.qkv = nn.Parameter(torch.empty(3, channels, channels))
        self.qkv_bias = nn.Parameter(torch.zeros(3, channels))
        self.proj = nn.Linear(channels, channels)
        bound = 1.0 / math.sqrt(channels)
        nn.init.uniform_(self.qkv, -bound, bound)
        if ffn:
            hidden = channels * max_expansion
            self.norm2 = nn.LayerNorm(channels)
            self.fc1 = nn.Linear(channels, hidden)
            self.fc2 = nn.Linear(hidden, channels)

    def _tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
        if self.domain == IMAGE:
            n, c, h, w = x.shape
            return x.flatten(2).transpose(1, 2), (n, c, h, w)
        return x, None

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        t, shape = self._tokens(x)
        n, length, c = t.shape
        heads = effective_heads(cell.heads or 1, c)
        h = sliced_layer_norm(t, self.norm1)
        qkv = (
            torch.einsum("nlc,kdc->knld", h, self.qkv[:, :c, :c])
            + self.qkv_bias[:, None, None, :c]
        )
        q, k, v = (z.reshape(n, length, heads, c // heads).transpose(1, 2) for z in qkv)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, length, c)
        t = t + F.linear(a, self.proj.weight[:c, :c], self.proj.bias[:c])
        if self.ffn:
            e = cell.expansion or self.max_expansion
            h = sliced_layer_norm(t, self.norm2)
            h = F.gelu(F.linear(h, self.fc1.weight[: e * c, :c], self.fc1.bias[: e * c]))
            t = t + F.linear(h, self.fc2.weight[:c, : e * c], self.fc2.bias[:c])
        if shape is not None:
            return t.transpose(1, 2).reshape(shape)
        return t

    def export(self, c_in: int, cell: CellConfig) -> AttentionOp:
        e = cell.expansion or self.max_expansion
        out = AttentionOp(c_in, domain=self.domain, ffn=self.ffn, max_expansion=e)
        c = c_in
        with torch.no_grad():
            _copy_ln(self.norm1, out.norm1, c)
            out.qkv.copy_(self.qkv[:, :c, :c])
            out.qkv_bias.copy_(self.qkv_bias[:, :c])
            out.proj.weight.copy_(self.proj.weight[:c, :c])
            out.proj.bias.copy_(self.proj.bias[:c])
            if self.ffn:
                _copy_ln(self.norm2, out.norm2, c)
                out.fc1.weight.copy_(self.fc1.weight[: e * c, :c])
                out.fc1.bias.copy_(self.fc1.bias[: e * c])
                out.fc2.weight.copy_(self.fc2.weight[:c, : e * c])
                out.fc2.bias.copy_(self.fc2.bias[:c])
        return out


class SignalConvOp(SharedOp):
    """Conv1d over ``(N, L, C)`` sequences, then BatchNorm and ReLU (``norm``), or with a bias
    and ReLU only (the plain convolutions and, with kernel 1, the linear layers of the
    MNIST-1D paper's models); a stride of 2 halves the positions."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        *,
        norm: bool,
        dilation: int = 1,
        fixed_kernel: int | None = None,
        fixed_stride: int | None = None,
    ) -> None:
        super().__init__()
        self.domain = SEQUENCE
        self.c_in, self.c_out, self.kernel, self.norm = c_in, c_out, kernel, norm
        self.dilation, self.fixed_kernel, self.fixed_stride = dilation, fixed_kernel, fixed_stride
        self.weight = nn.Parameter(torch.empty(c_out, c_in, kernel))
        nn.init.kaiming_normal_(self.weight, mode="fan_in", nonlinearity="relu")
        if norm:
            self.bn = nn.BatchNorm1d(c_out)
        else:
            self.bias = nn.Parameter(torch.zeros(c_out))

    def _kernel(self, cell: CellConfig) -> int:
        return self.fixed_kernel or cell.kernel or self.kernel

    def _stride(self, cell: CellConfig) -> int:
        return self.fixed_stride or cell.stride or 1

    def out_channels(self, c_in: int, cell: CellConfig) -> int:
        return cell.width or self.c_out

    def out_length(self, length: int, cell: CellConfig) -> int:
        k, d, s = self._kernel(cell), self.dilation, self._stride(cell)
        return (length + 2 * (d * (k - 1) // 2) - d * (k - 1) - 1) // s + 1

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        c, w, k = x.shape[-1], self.out_channels(x.shape[-1], cell), self._kernel(cell)
        weight = _crop(self.weight[:w, :c], k, 1)
        bias = None if self.norm else self.bias[:w]
        pad = self.dilation * (k - 1) // 2
        y = F.conv1d(x.transpose(1, 2), weight, bias, self._stride(cell), pad, self.dilation)
        if self.norm:
            y = sliced_batch_norm(y, self.bn)
        return F.relu(y).transpose(1, 2)

    def export(self, c_in: int, cell: CellConfig) -> SignalConvOp:
        w, k = self.out_channels(c_in, cell), self._kernel(cell)
        out = SignalConvOp(
            c_in,
            w,
            k,
            norm=self.norm,
            dilation=self.dilation,
            fixed_kernel=k,
            fixed_stride=self._stride(cell),
        )
        with torch.no_grad():
            out.weight.copy_(_crop(self.weight[:w, :c_in], k, 1))
            if self.norm:
                _copy_bn(self.bn, out.bn, w)
            else:
                out.bias.copy_(self.bias[:w])
        return out


class Pool1dOp(SharedOp):
    """Max or average pooling over 3 positions with stride 2 (halves a sequence)."""

    def __init__(self, kind: str, kernel: int = 3) -> None:
        super().__init__()
        if kind not in ("max", "avg"):
            raise ValueError(f"Pooling kind is {kind!r}, but must be 'max' or 'avg'.")
        self.kind, self.kernel, self.domain = kind, kernel, SEQUENCE

    def out_length(self, length: int, cell: CellConfig) -> int:
        return (length + 2 * (self.kernel // 2) - self.kernel) // 2 + 1

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        t = x.transpose(1, 2)
        pad = self.kernel // 2
        if self.kind == "max":
            y = F.max_pool1d(t, self.kernel, 2, pad)
        else:
            y = F.avg_pool1d(t, self.kernel, 2, pad, count_include_pad=False)
        return y.transpose(1, 2)

    def export(self, c_in: int, cell: CellConfig) -> Pool1dOp:
        return Pool1dOp(self.kind, self.kernel)


# nn.GRU's parameters of one bidirectional layer, in the order its kernel takes them.
_GRU_WEIGHTS = tuple(
    f"{kind}_l0{direction}"
    for direction in ("", "_reverse")
    for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
)


class GruOp(SharedOp):
    """A bidirectional GRU over ``(N, L, C)``: ``width // 2`` hidden units each way, every
    position's two states concatenated (width ``2 * (width // 2)``). Shared weights are
    sliced by gate: the first ``h`` units of each of the reset, update and new gates."""

    def __init__(self, c_in: int, width: int) -> None:
        super().__init__()
        self.domain = SEQUENCE
        self.c_in, self.hidden = c_in, max(1, width // 2)
        self.gru = nn.GRU(c_in, self.hidden, batch_first=True, bidirectional=True)

    def out_channels(self, c_in: int, cell: CellConfig) -> int:
        return 2 * self._hidden(cell)

    def _hidden(self, cell: CellConfig) -> int:
        return max(1, (cell.width or 2 * self.hidden) // 2)

    def _weights(self, c: int, h: int) -> list[torch.Tensor]:
        """The flat weights of an ``nn.GRU(c, h, bidirectional=True)``, sliced."""
        big = self.hidden
        out = []
        for name in _GRU_WEIGHTS:
            w = getattr(self.gru, name)
            gates = w.view(3, big, *w.shape[1:])[:, :h]
            if name.startswith("weight_ih"):
                gates = gates[..., :c]
            elif name.startswith("weight_hh"):
                gates = gates[..., :h]
            out.append(gates.reshape(3 * h, *gates.shape[2:]))
        return out

    def forward(self, x: torch.Tensor, cell: CellConfig) -> torch.Tensor:
        c, h = x.shape[-1], self._hidden(cell)
        if c == self.c_in and h == self.hidden:
            return self.gru(x)[0]
        hx = x.new_zeros(2, x.shape[0], h)
        # nn.GRU.forward calls this with its own flat weights; here they are sliced views
        output, _ = torch._VF.gru(
            x, hx, self._weights(c, h), True, 1, 0.0, self.training, True, True
        )
        return output

    def export(self, c_in: int, cell: CellConfig) -> GruOp:
        h = self._hidden(cell)
        out = GruOp(c_in, 2 * h)
        with torch.no_grad():
            for name, w in zip(_GRU_WEIGHTS, self._weights(c_in, h)):
                getattr(out.gru, name).copy_(w)
        return out


def build_op(
    spec: OperatorSpec,
    *,
    domain: str,
    channels: int,
    max_kernel: int,
    max_expansion: int,
) -> SharedOp:
    """The weight-sharing module of ``spec`` at its largest size."""
    if spec.factory is not None:
        factory: Callable[..., SharedOp] = spec.factory
        op = factory(spec=spec, domain=domain, channels=channels)
        if not isinstance(op, SharedOp):
            raise TypeError(
                f"The factory of operator {spec.name!r} returned {type(op).__name__}, "
                "but must return an optuna_hpcnas.supernet.SharedOp."
            )
        return op
    family = spec.family
    kernel = spec.kernel or max_kernel
    if family in ("conv", "sepconv", "dilconv"):
        if domain != IMAGE:
            raise ValueError(f"Operator {spec.name!r} works on images only.")
        return ConvOp(
            channels,
            channels,
            kernel,
            dilation=spec.dilation,
            separable=family != "conv",
            fixed_kernel=spec.kernel,
        )
    if family == "pool":
        return PoolOp("max" if spec.name.startswith("max") else "avg", spec.kernel or 3, domain)
    if family == "identity":
        return IdentityOp(domain)
    if family in ("attention", "transformer"):
        return AttentionOp(
            channels, domain=domain, ffn=family == "transformer", max_expansion=max_expansion
        )
    if family == "conv1d":
        return Conv1dOp(channels, channels, kernel, fixed_kernel=spec.kernel)
    if family in ("conv1d_bn", "conv1d_plain"):
        return SignalConvOp(
            channels,
            channels,
            kernel,
            norm=family == "conv1d_bn",
            dilation=spec.dilation,
            fixed_kernel=spec.kernel,
            fixed_stride=None if spec.has_stride else 1,
        )
    if family == "pool1d":
        return Pool1dOp("max" if spec.name.startswith("max") else "avg", spec.kernel or 3)
    if family == "gru":
        return GruOp(channels, channels)
    raise ValueError(
        f"Operator {spec.name!r} has family {family!r}, which SuperNet cannot build; give the "
        "OperatorSpec a `factory` returning a SharedOp."
    )
