"""The operator registry: what each candidate operator of a cell is and which micro parameters
apply to it.

The registry holds metadata only (and an optional module factory for user operators); the
PyTorch implementations live in ``optuna_hpcnas.supernet``.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from typing import Any

IMAGE = "image"
SEQUENCE = "sequence"
DOMAINS = (IMAGE, SEQUENCE)


@dataclass(frozen=True)
class OperatorSpec:
    """One candidate operator of a cell.

    Args:
        name: Registry name, e.g. ``"sepconv3x3"``.
        family: Implementation family (``conv``, ``sepconv``, ``dilconv``, ``pool``,
            ``identity``, ``transformer``, ``attention``, ``conv1d`` or a user family).
        domains: Data domains the operator works on (``"image"``, ``"sequence"``).
        kernel: Fixed kernel size (``conv3x3`` has 3); ``None`` if not fixed.
        kernel_choices: Kernel sizes the operator can take when the kernel is searched.
        dilation: Dilation of the kernel.
        has_width: Whether the cell's output width (channels) is searched.
        has_expansion: Whether an expansion ratio (feed-forward width factor) is searched.
        has_heads: Whether a number of attention heads is searched.
        has_stride: Whether a stride is searched (sequence operators that can downsample).
        factory: Optional module factory for user operators, used by ``SuperNet``.
    """

    name: str
    family: str
    domains: frozenset[str]
    kernel: int | None = None
    kernel_choices: tuple[int, ...] | None = None
    dilation: int = 1
    has_width: bool = False
    has_expansion: bool = False
    has_heads: bool = False
    has_stride: bool = False
    factory: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`name` must be a non-empty string, but got {self.name!r}.")
        object.__setattr__(self, "domains", frozenset(self.domains))
        unknown = self.domains - set(DOMAINS)
        if not self.domains or unknown:
            raise ValueError(
                f"`domains` of operator {self.name!r} is {sorted(self.domains)}, "
                f"but must be a non-empty subset of {list(DOMAINS)}."
            )
        if self.kernel is not None and self.kernel_choices is not None:
            raise ValueError(
                f"Operator {self.name!r} sets both `kernel` and `kernel_choices`; set one."
            )
        for k in ([self.kernel] if self.kernel is not None else []) + list(
            self.kernel_choices or ()
        ):
            if not isinstance(k, int) or k < 1:
                raise ValueError(
                    f"Kernel size of operator {self.name!r} is {k!r}, but must be >= 1."
                )
        if self.kernel_choices is not None:
            object.__setattr__(self, "kernel_choices", tuple(self.kernel_choices))
            if not self.kernel_choices:
                raise ValueError(f"`kernel_choices` of operator {self.name!r} is empty.")
        if self.dilation < 1:
            raise ValueError(
                f"`dilation` of operator {self.name!r} is {self.dilation}, but must be >= 1."
            )

    @property
    def searches_kernel(self) -> bool:
        """Whether the kernel size is a searched micro parameter of this operator."""
        return self.kernel_choices is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready metadata (the factory is not serialised)."""
        out = {
            "name": self.name,
            "family": self.family,
            "domains": sorted(self.domains),
            "kernel": self.kernel,
            "kernel_choices": list(self.kernel_choices) if self.kernel_choices else None,
            "dilation": self.dilation,
            "has_width": self.has_width,
            "has_expansion": self.has_expansion,
            "has_heads": self.has_heads,
        }
        if self.has_stride:  # only when set: spaces recorded before strides compare equal
            out["has_stride"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperatorSpec:
        kernel_choices = data.get("kernel_choices")
        return cls(
            name=data["name"],
            family=data["family"],
            domains=frozenset(data["domains"]),
            kernel=data.get("kernel"),
            kernel_choices=tuple(kernel_choices) if kernel_choices else None,
            dilation=data.get("dilation", 1),
            has_width=data.get("has_width", False),
            has_expansion=data.get("has_expansion", False),
            has_heads=data.get("has_heads", False),
            has_stride=data.get("has_stride", False),
        )


def _builtin_operators() -> list[OperatorSpec]:
    image = frozenset({IMAGE})
    both = frozenset({IMAGE, SEQUENCE})
    seq = frozenset({SEQUENCE})
    ops = [
        OperatorSpec("conv3x3", "conv", image, kernel=3, has_width=True),
        OperatorSpec("conv5x5", "conv", image, kernel=5, has_width=True),
        OperatorSpec("sepconv3x3", "sepconv", image, kernel=3, has_width=True),
        OperatorSpec("sepconv5x5", "sepconv", image, kernel=5, has_width=True),
        OperatorSpec("dilconv3x3", "dilconv", image, kernel=3, dilation=2, has_width=True),
        OperatorSpec("dilconv5x5", "dilconv", image, kernel=5, dilation=2, has_width=True),
        OperatorSpec("conv", "conv", image, kernel_choices=(1, 3, 5, 7), has_width=True),
        OperatorSpec("sepconv", "sepconv", image, kernel_choices=(3, 5, 7), has_width=True),
        OperatorSpec(
            "dilconv", "dilconv", image, kernel_choices=(3, 5), dilation=2, has_width=True
        ),
        OperatorSpec("maxpool3x3", "pool", image, kernel=3),
        OperatorSpec("avgpool3x3", "pool", image, kernel=3),
        OperatorSpec("identity", "identity", both),
        OperatorSpec("transformer", "transformer", both, has_expansion=True, has_heads=True),
        OperatorSpec("attention", "attention", both, has_heads=True),
        OperatorSpec("conv1d", "conv1d", seq, kernel_choices=(1, 3, 5, 7), has_width=True),
        # Signals (N, L, F): Conv1d-BatchNorm-ReLU, strided to downsample; dilated; the
        # plain Conv1d + bias + ReLU of the MNIST-1D paper (and, on the flattened stem with
        # kernel 1, its MLP's Linear layers); stride-2 pooling; a bidirectional GRU.
        OperatorSpec(
            "conv1d_bn",
            "conv1d_bn",
            seq,
            kernel_choices=(1, 3, 5, 7),
            has_width=True,
            has_stride=True,
        ),
        OperatorSpec("dilconv1d_bn", "conv1d_bn", seq, kernel=3, dilation=2, has_width=True),
        OperatorSpec(
            "conv1d_plain",
            "conv1d_plain",
            seq,
            kernel_choices=(1, 3, 5, 7),
            has_width=True,
            has_stride=True,
        ),
        OperatorSpec("maxpool1d", "pool1d", seq, kernel=3),
        OperatorSpec("avgpool1d", "pool1d", seq, kernel=3),
        OperatorSpec("gru", "gru", seq, has_width=True),
    ]
    return ops


class OperatorRegistry:
    """Named operator specifications; open for user operators.

    Each registry is its own object (there is no global registry): pass it to
    ``HierarchicalSearchSpace(registry=...)`` and to ``SuperNet``.

    Examples:
        >>> registry = OperatorRegistry.default()
        >>> registry.register(OperatorSpec("mbconv3x3", "mbconv", {"image"}, kernel=3,
        ...                                has_width=True, has_expansion=True))
        >>> "mbconv3x3" in registry
        True
    """

    def __init__(self, specs: Iterable[OperatorSpec] = ()) -> None:
        self._specs: dict[str, OperatorSpec] = {}
        for spec in specs:
            self.register(spec)

    @classmethod
    def default(cls) -> OperatorRegistry:
        """A new registry holding the built-in operators."""
        return cls(_builtin_operators())

    def register(self, spec: OperatorSpec) -> None:
        """Add an operator; a name already taken raises ``ValueError``."""
        if not isinstance(spec, OperatorSpec):
            raise TypeError(f"Expected an OperatorSpec, but got {type(spec).__name__}.")
        if spec.name in self._specs:
            raise ValueError(f"Operator {spec.name!r} is already registered.")
        self._specs[spec.name] = spec

    def __getitem__(self, name: str) -> OperatorSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise ValueError(
                f"Unknown operator {name!r}; registered: {sorted(self._specs)}."
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)
