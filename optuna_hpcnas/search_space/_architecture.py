"""``Architecture``: one point of a hierarchical search space, frozen, hashable and JSON."""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
import json
from typing import Any


@dataclass(frozen=True)
class CellConfig:
    """One cell: its operator and the micro parameters that apply to it (``None`` otherwise)."""

    op: str
    kernel: int | None = None
    width: int | None = None
    expansion: int | None = None
    heads: int | None = None
    stride: int | None = None


@dataclass(frozen=True)
class ClusterConfig:
    """How one candidate is evaluated on the cluster."""

    data_parallel: int = 1
    pipeline_stages: int = 1
    micro_batch_size: int = 32

    @property
    def ranks(self) -> int:
        """Ranks one evaluation of this candidate needs (data parallel x pipeline stages)."""
        return self.data_parallel * self.pipeline_stages


@dataclass(frozen=True)
class Architecture:
    """A candidate network: macro topology, one ``CellConfig`` per cell, cluster layout, and
    (in spaces that search them) the stem and the head; ``None`` is the domain's default.

    Examples:
        >>> arch = Architecture("residual", (CellConfig("conv3x3", width=16),), ClusterConfig())
        >>> Architecture.from_json(arch.to_json()) == arch
        True
    """

    topology: str
    cells: tuple[CellConfig, ...]
    cluster: ClusterConfig = ClusterConfig()
    stem: str | None = None
    head: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cells", tuple(self.cells))

    @property
    def num_cells(self) -> int:
        return len(self.cells)

    def to_dict(self) -> dict[str, Any]:
        # stem and head only when set: architectures of spaces that do not search them keep
        # the JSON (and the claims keyed by it) of earlier versions
        out: dict[str, Any] = {
            "topology": self.topology,
            "cells": [{k: v for k, v in asdict(c).items() if v is not None} for c in self.cells],
            "cluster": asdict(self.cluster),
        }
        for key in ("stem", "head"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def to_json(self) -> str:
        """A canonical JSON string (sorted keys): equal architectures give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Architecture:
        try:
            return cls(
                topology=data["topology"],
                cells=tuple(CellConfig(**cell) for cell in data["cells"]),
                cluster=ClusterConfig(**data.get("cluster", {})),
                stem=data.get("stem"),
                head=data.get("head"),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"Not an architecture description: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> Architecture:
        return cls.from_dict(json.loads(text))

    def describe(self) -> str:
        """A short human-readable form, e.g. ``residual[conv3x3/w16 > identity] dp1xpp1 mb32``
        (``residual[stem:none > conv1d_bn/k5/w50/s1 > head:mean] ...`` where the space searches
        the stem and the head)."""
        parts = [] if self.stem is None else [f"stem:{self.stem}"]
        for cell in self.cells:
            extras = [
                f"{tag}{value}"
                for tag, value in (
                    ("k", cell.kernel),
                    ("w", cell.width),
                    ("e", cell.expansion),
                    ("h", cell.heads),
                    ("s", cell.stride),
                )
                if value is not None
            ]
            parts.append("/".join([cell.op, *extras]))
        if self.head is not None:
            parts.append(f"head:{self.head}")
        c = self.cluster
        return (
            f"{self.topology}[{' > '.join(parts)}] "
            f"dp{c.data_parallel}xpp{c.pipeline_stages} mb{c.micro_batch_size}"
        )
