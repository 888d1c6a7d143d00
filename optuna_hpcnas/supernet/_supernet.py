"""``SuperNet``: every candidate operator of every cell, with weights shared by all
architectures of a ``HierarchicalSearchSpace``.

Positions are ``0`` (stem), ``1 .. n`` (cells) and ``n + 1`` (head). Each module of a position
is initialised from its own seed, derived from ``(seed, position, operator name)``, so the
weights of a layer do not depend on the other positions, on the operators added to the space
later, or on how a pipeline later splits the net (``layer_recipes`` rebuilds one position
alone with the same weights).
"""

from __future__ import annotations

from collections.abc import Sequence
import copy
import dataclasses
from dataclasses import dataclass
from typing import Any
import zlib

import torch
from torch import nn

from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_seed
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import ClusterConfig
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.search_space._input_fit import FLATTEN_STEM_FACTOR
from optuna_hpcnas.supernet._layers import CellLayer
from optuna_hpcnas.supernet._layers import DenseProjection
from optuna_hpcnas.supernet._layers import FlattenHead
from optuna_hpcnas.supernet._layers import padded_add
from optuna_hpcnas.supernet._layers import SharedHead
from optuna_hpcnas.supernet._layers import Stem
from optuna_hpcnas.supernet._layers import to_length
from optuna_hpcnas.supernet._ops import build_op
from optuna_hpcnas.supernet._ops import channel_dim
from optuna_hpcnas.supernet._ops import IMAGE
from optuna_hpcnas.supernet._ops import SharedOp

# operator families whose residual stream ends in the head's LayerNorm (pre-norm blocks)
PRE_NORM_FAMILIES = frozenset({"attention", "transformer"})


def position_seed(seed: int, position: int, name: str) -> int:
    """The seed of one module: stable across runs, processes and Python versions."""
    return zlib.crc32(f"{seed}:{position}:{name}".encode()) & 0x7FFFFFFF


def _seeded(seed: int, build: Any) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def reachable_lengths(length: int, strides: Sequence[int], cells: int) -> list[int]:
    """Every number of positions a sequence of ``length`` can have after ``cells`` cells that
    each keep it or divide it (rounded up) by one of ``strides`` (stride-2 pooling included)."""
    lengths = {length}
    for _ in range(cells):
        lengths |= {-(-n // s) for n in lengths for s in (*strides, 2)}
    return sorted(lengths)


def check_input_shape(domain: str, input_shape: Sequence[int]) -> tuple[int, ...]:
    """Validate ``input_shape`` (one sample, no batch dimension) for ``domain``."""
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise TypeError(f"`input_shape` must be a sequence of ints, but got {input_shape!r}.")
    shape = tuple(input_shape)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"`input_shape` is {shape}, but must hold positive integers.")
    want = 3 if domain == IMAGE else 2
    if len(shape) != want:
        layout = "(channels, height, width)" if domain == IMAGE else "(length, features)"
        raise ValueError(
            f"`input_shape` is {shape}, but the {domain!r} search space needs {layout} "
            "(one sample, without the batch dimension)."
        )
    return shape


class SuperNet(nn.Module):
    """The weight-sharing network of a search space.

    Args:
        space: The search space; every architecture of it is a path through this net.
        input_shape: Shape of one sample: ``(C, H, W)`` for images, ``(L, F)`` for sequences.
        num_classes: Number of classes of the classification head.
        seed: Seed of the initial weights (see the module docstring).

    Widths are handled by channel slicing from the largest width of the space (as in
    Once-for-All): a cell of width ``w`` uses the first ``w`` output channels of its operator's
    weights; searched kernels use the centred window of the largest kernel.

    Examples:
        >>> import torch
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10)
        >>> arch = next(iter(space.enumerate()))
        >>> net(torch.zeros(2, 1, 8, 8), arch).shape
        torch.Size([2, 10])
        >>> sub = net.eval().subnet(arch)
        >>> x = torch.randn(2, 1, 8, 8)
        >>> torch.allclose(sub(x), net(x, arch), atol=1e-5)
        True
    """

    def __init__(
        self,
        space: HierarchicalSearchSpace,
        *,
        input_shape: Sequence[int],
        num_classes: int,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(space, HierarchicalSearchSpace):
            raise TypeError(f"`space` must be a HierarchicalSearchSpace, but got {space!r}.")
        check_int("num_classes", num_classes, 2)
        check_seed("seed", seed)
        self.space = space
        self.domain = space.domain
        self.input_shape = check_input_shape(self.domain, input_shape)
        self.num_classes = num_classes
        self.seed = seed
        self._configure(space)
        n = space.num_cells
        if self._searched_stems:
            self.stems = nn.ModuleDict({k: self._build_stem(k) for k in space.stems})
        else:
            self.stem = self._build_stem(None)
        self.cells = nn.ModuleList(
            nn.ModuleDict({name: self._build_op(i + 1, name) for name in self._operators})
            for i in range(n)
        )
        self.projections = nn.ModuleDict()
        if self._dense:
            for i in range(1, n):
                self.projections[str(i)] = self._build_projection(i + 1, i + 1)
        if self._searched_heads:
            self.heads = nn.ModuleDict({k: self._build_head(k) for k in space.heads})
        else:
            self.head = self._build_head(None)

    def _configure(self, space: HierarchicalSearchSpace) -> None:
        """Sizes every module is allocated at (shared by ``_PositionNet``)."""
        definition = space.to_dict()
        self._max_kernel = int(max(definition["kernel_sizes"]))
        self._max_expansion = int(max(definition["expansion_ratios"]))
        self._operators: tuple[str, ...] = tuple(definition["operators"])
        self._dense = "dense" in definition["topologies"]
        self._searched_stems = "stems" in definition
        self._searched_heads = "heads" in definition
        self._strides = tuple(definition.get("strides", (1,)))
        # The widest state: a cell, or a stem that passes the raw or flattened sample on.
        self.channels = int(max(definition["widths"]))
        if self.domain != IMAGE:
            for kind in space.stems:
                self.channels = max(self.channels, Stem.out_shape(self.input_shape, 0, kind)[1])
        self.stem_widths = {
            kind: self.channels
            if self.domain == IMAGE
            else Stem.out_shape(self.input_shape, self.channels, kind)[1]
            for kind in space.stems
        }
        widest = int(max(definition["widths"]))
        if "flatten" in space.stems and self.channels > FLATTEN_STEM_FACTOR * widest:
            raise ValueError(
                f"The flatten stem makes {self.channels} features of a {self.input_shape} "
                f"sample, more than the widest cell ({widest}): leave 'flatten' out of "
                "`stems` for samples this large (``fit_to_input`` does)."
            )

    def _build_stem(self, kind: str | None) -> Stem:
        name = "stem" if kind is None else f"stem:{kind}"
        return _seeded(
            position_seed(self.seed, 0, name),
            lambda: Stem(self.input_shape, self.channels, self.domain, kind),
        )

    def _build_head(self, kind: str | None) -> nn.Module:
        n = self.space.num_cells
        name = "head" if kind is None else f"head:{kind}"
        if kind == "flatten":
            starts = {Stem.out_shape(self.input_shape, 0, k)[0] for k in self.space.stems}
            lengths = sorted({m for s in starts for m in reachable_lengths(s, self._strides, n)})
            return _seeded(
                position_seed(self.seed, n + 1, name),
                lambda: FlattenHead(self.channels, self.num_classes, lengths),
            )
        return _seeded(
            position_seed(self.seed, n + 1, name),
            lambda: SharedHead(self.channels, self.num_classes, self.domain),
        )

    # ------------------------------------------------------------------ construction
    def _build_op(self, position: int, name: str) -> SharedOp:
        spec = self.space.registry[name]
        return _seeded(
            position_seed(self.seed, position, name),
            lambda: build_op(
                spec,
                domain=self.domain,
                channels=self.channels,
                max_kernel=self._max_kernel,
                max_expansion=self._max_expansion,
            ),
        )

    def _build_projection(self, position: int, num_inputs: int) -> DenseProjection:
        return _seeded(
            position_seed(self.seed, position, "dense-projection"),
            lambda: DenseProjection(num_inputs, self.channels, self.domain),
        )

    def _op(self, index: int, name: str) -> SharedOp:
        cell = self.cells[index]
        assert isinstance(cell, nn.ModuleDict)
        if name not in cell:
            raise ValueError(
                f"Cell {index} has no operator {name!r}; this supernet holds {sorted(cell)}."
            )
        op = cell[name]
        assert isinstance(op, SharedOp)
        return op

    def _stem(self, arch: Architecture) -> Stem:
        stem = self.stems[str(arch.stem)] if self._searched_stems else self.stem
        assert isinstance(stem, Stem)
        return stem

    def _head(self, arch: Architecture) -> nn.Module:
        head = self.heads[str(arch.head)] if self._searched_heads else self.head
        assert isinstance(head, nn.Module)
        return head

    def _projection(self, index: int) -> DenseProjection:
        projection = self.projections[str(index)]
        assert isinstance(projection, DenseProjection)
        return projection

    # ------------------------------------------------------------------ checks
    def check_architecture(self, arch: Architecture) -> None:
        """Raise ``ValueError`` unless ``arch`` is a point of this net's space."""
        if not isinstance(arch, Architecture):
            raise TypeError(f"Expected an Architecture, but got {type(arch).__name__}.")
        # The cluster layout does not change the network: check the cells and topology only.
        d = self.space.to_dict()
        layout = ClusterConfig(
            d["data_parallel"][0], d["pipeline_stages"][0], d["micro_batch_sizes"][0]
        )
        if not self.space.contains(dataclasses.replace(arch, cluster=layout)):
            raise ValueError(f"The architecture {arch.describe()} is not in this search space.")

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``x`` is a batch of samples of ``input_shape``."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Expected a torch.Tensor batch, but got {type(x).__name__}.")
        if tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(
                f"The batch has shape {tuple(x.shape)}, but this SuperNet takes batches of "
                f"shape (N, {', '.join(map(str, self.input_shape))})."
            )

    # ------------------------------------------------------------------ weight sharing
    def forward(self, x: torch.Tensor, arch: Architecture) -> torch.Tensor:
        """Logits of ``arch`` on the batch ``x``, through the shared weights."""
        if arch.num_cells != len(self.cells):
            self.check_architecture(arch)
        dim = channel_dim(self.domain)
        h = self._stem(arch)(x)
        # dense: the earlier states, concatenated as the layers carry them (averaged down to a
        # downsampling cell's positions in the same steps, so both compute the same function)
        earlier, widths = h, [h.shape[dim]]
        for i, cell in enumerate(arch.cells):
            op = self._op(i, cell.op)
            if arch.topology == "chain":
                h = op(h, cell)
            elif arch.topology == "residual":
                h = padded_add(op(h, cell), h, dim)
            else:
                inp = self._projection(i).project(earlier, widths, widths[-1]) if i > 0 else h
                h = op(inp, cell)
                earlier = torch.cat([to_length(earlier, h.shape[1]), h], dim=dim)
                widths.append(h.shape[dim])
        head = self._head(arch)
        if isinstance(head, SharedHead):
            return head(h, normalize=self.head_normalizes(arch))
        return head(h)

    def head_normalizes(self, arch: Architecture) -> bool:
        """Whether ``arch``'s sequence head puts a LayerNorm before its pooling: when the path
        holds a pre-norm attention or transformer cell (the final norm of its residual
        stream), not on convolutional, recurrent or pooling paths."""
        families = {self.space.registry[cell.op].family for cell in arch.cells}
        return bool(families & PRE_NORM_FAMILIES)

    def lengths(self, arch: Architecture) -> list[int]:
        """Positions of the states ``x_0 .. x_n`` of a sequence path (stem output, then each
        cell's output)."""
        if self.domain == IMAGE:
            raise ValueError("Images have no sequence lengths.")
        n = Stem.out_shape(self.input_shape, 0, arch.stem)[0]
        out = [n]
        for i, cell in enumerate(arch.cells):
            n = self._op(i, cell.op).out_length(n, cell)
            out.append(n)
        return out

    def widths(self, arch: Architecture) -> list[int]:
        """Widths of the states ``x_0 .. x_n`` (stem output, then each cell's output)."""
        c = self.stem_widths[str(arch.stem) if self._searched_stems else self.space.stems[0]]
        out = [c]
        for i, cell in enumerate(arch.cells):
            op = self._op(i, cell.op)
            w = op.out_channels(c, cell)
            c = max(c, w) if arch.topology == "residual" else w
            out.append(c)
        return out

    def layers(self, arch: Architecture) -> list[nn.Module]:
        """Standalone layers of ``arch`` in execution order, with inherited weights.

        ``[stem, cell_0, ..., cell_{n-1}, head]``; each maps one tensor to one tensor (see
        ``optuna_hpcnas.supernet._layers`` for how residual and dense topologies are carried).
        The layers share no storage with the supernet.
        """
        self.check_architecture(arch)
        widths = self.widths(arch)
        n = arch.num_cells
        out: list[nn.Module] = [copy.deepcopy(self._stem(arch))]
        for i, cell in enumerate(arch.cells):
            op = self._op(i, cell.op)
            projection = None
            if arch.topology == "dense" and i > 0:
                shared = self._projection(i)
                projection = shared.export(widths[: i + 1], widths[i])
            c_in = widths[i]
            out.append(
                CellLayer(
                    op.export(c_in, cell),
                    cell,
                    topology=arch.topology,
                    domain=self.domain,
                    widths_before=widths[: i + 1],
                    projection=projection,
                    last=i == n - 1,
                )
            )
        out.append(self._export_head(arch, widths[-1]))
        for layer in out:
            layer.train(self.training)
        return out

    def _export_head(self, arch: Architecture, width: int) -> nn.Module:
        head = self._head(arch)
        if isinstance(head, FlattenHead):
            return head.export(width, self.lengths(arch)[-1])
        assert isinstance(head, SharedHead)
        return head.export(width, normalize=self.head_normalizes(arch))

    def subnet(self, arch: Architecture) -> nn.Sequential:
        """A standalone ``nn.Sequential`` of ``layers(arch)``: plain PyTorch, own weights."""
        return nn.Sequential(*self.layers(arch))


@dataclass(frozen=True)
class LayerRecipe:
    """How to build one layer of a subnet without the whole supernet (for pipeline stages).

    ``typename(**kwargs)`` builds it; ``deepspeed.pipe.LayerSpec(r.typename, **r.kwargs)``
    defers it to the rank that owns the stage. The weights equal those of
    ``SuperNet(space, ..., seed=seed).layers(arch)[index]`` at initialisation.
    """

    index: int
    typename: type[nn.Module]
    kwargs: dict[str, Any]

    def build(self) -> nn.Module:
        return self.typename(**self.kwargs)


class RecipeLayer(nn.Module):
    """One position of a freshly initialised subnet, built on its own (see ``LayerRecipe``)."""

    def __init__(
        self,
        *,
        space_json: str,
        arch_json: str,
        index: int,
        input_shape: Sequence[int],
        num_classes: int,
        seed: int = 0,
    ) -> None:
        super().__init__()
        space = HierarchicalSearchSpace.from_json(space_json)
        arch = Architecture.from_json(arch_json)
        net = _PositionNet(space, input_shape, num_classes, seed, arch, index)
        self.inner = net.layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class _PositionNet:
    """Builds only the shared modules one position of ``arch`` needs, then exports it."""

    def __init__(
        self,
        space: HierarchicalSearchSpace,
        input_shape: Sequence[int],
        num_classes: int,
        seed: int,
        arch: Architecture,
        index: int,
    ) -> None:
        n = arch.num_cells
        if not 0 <= index <= n + 1:
            raise ValueError(f"`index` is {index}, but must be in [0, {n + 1}].")
        # An empty shell holding only the needed modules, so widths/export logic is shared.
        shell = SuperNet.__new__(SuperNet)
        nn.Module.__init__(shell)
        shell.space, shell.domain, shell.seed = space, space.domain, seed
        shell.input_shape = check_input_shape(space.domain, input_shape)
        shell.num_classes = num_classes
        shell._configure(space)
        shell.check_architecture(arch)
        # Width bookkeeping needs each cell's operator (no weights allocated for pools etc.,
        # and conv ops are cheap to allocate at these sizes only once per recipe).
        shell.cells = nn.ModuleList(
            nn.ModuleDict({cell.op: shell._build_op(i + 1, cell.op)})
            for i, cell in enumerate(arch.cells)
        )
        widths = shell.widths(arch)
        if index == 0:
            if shell._searched_stems:
                shell.stems = nn.ModuleDict({str(arch.stem): shell._build_stem(arch.stem)})
            else:
                shell.stem = shell._build_stem(None)
            self.layer: nn.Module = copy.deepcopy(shell._stem(arch))
        elif index == n + 1:
            if shell._searched_heads:
                shell.heads = nn.ModuleDict({str(arch.head): shell._build_head(arch.head)})
            else:
                shell.head = shell._build_head(None)
            self.layer = shell._export_head(arch, widths[-1])
        else:
            i = index - 1
            cell = arch.cells[i]
            projection = None
            if arch.topology == "dense" and i > 0:
                shared = shell._build_projection(i + 1, i + 1)
                projection = shared.export(widths[: i + 1], widths[i])
            op = shell._op(i, cell.op)
            self.layer = CellLayer(
                op.export(widths[i], cell),
                cell,
                topology=arch.topology,
                domain=shell.domain,
                widths_before=widths[: i + 1],
                projection=projection,
                last=i == n - 1,
            )


def layer_recipes(
    space: HierarchicalSearchSpace,
    arch: Architecture,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int = 0,
) -> list[LayerRecipe]:
    """Recipes of the ``num_cells + 2`` layers of a freshly initialised ``arch``, in order."""
    kwargs = {
        "space_json": space.to_json(),
        "arch_json": arch.to_json(),
        "input_shape": tuple(input_shape),
        "num_classes": num_classes,
        "seed": seed,
    }
    return [
        LayerRecipe(index, RecipeLayer, {**kwargs, "index": index})
        for index in range(arch.num_cells + 2)
    ]
