"""How a ``HierarchicalSearchSpace`` maps Optuna parameters to architectures and back: which
decisions apply, the cells and architecture of a set of values, an Optuna ``params`` dict
checked and turned into an ``Architecture``, and an architecture's values."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from optuna_hpcnas.search_space._architecture import Architecture
from optuna_hpcnas.search_space._architecture import CellConfig
from optuna_hpcnas.search_space._architecture import ClusterConfig
from optuna_hpcnas.search_space._decisions import Choice
from optuna_hpcnas.search_space._decisions import Decision
from optuna_hpcnas.search_space._operators import OperatorRegistry
from optuna_hpcnas.search_space._operators import OperatorSpec

# Micro parameters of a cell: (decision suffix = CellConfig field, does an operator take it).
MICRO_PARAMETERS: tuple[tuple[str, Callable[[OperatorSpec], bool]], ...] = (
    ("kernel", lambda spec: spec.searches_kernel),
    ("width", lambda spec: spec.has_width),
    ("expansion", lambda spec: spec.has_expansion),
    ("heads", lambda spec: spec.has_heads),
    ("stride", lambda spec: spec.has_stride),
)
_CLUSTER_FIELDS = ("data_parallel", "pipeline_stages", "micro_batch_size")


class SpaceParams:
    """Parameters <-> architectures; mixed into ``HierarchicalSearchSpace``, whose definition
    (the attributes below) it reads."""

    _decisions: tuple[Decision, ...]
    _by_name: dict[str, Decision]
    _registry: OperatorRegistry
    _num_cells: int
    _stems: tuple[str, ...] | None
    _heads: tuple[str, ...] | None

    def _active(self, decision: Decision, values: Mapping[str, Choice]) -> bool:
        if decision.parent is None:
            return True
        assert decision.active_when is not None
        return values.get(decision.parent) in decision.active_when

    def _cell(self, op: Choice, micro: Mapping[str, Choice]) -> CellConfig:
        spec = self._registry[str(op)]
        fields: dict[str, Any] = {n: micro[n] for n, _ in MICRO_PARAMETERS if n in micro}
        if spec.kernel is not None:
            fields["kernel"] = spec.kernel
        return CellConfig(op=str(op), **fields)

    def _architecture(self, values: Mapping[str, Choice]) -> Architecture:
        cells = []
        for i in range(self._num_cells):
            prefix = f"node.cell{i}."
            micro = {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
            cells.append(self._cell(micro.pop("op"), micro))
        cluster = ClusterConfig(*(int(values[f"cluster.{f}"]) for f in _CLUSTER_FIELDS))
        stem, head = values.get("node.stem"), values.get("node.head")
        return Architecture(
            str(values["node.topology"]),
            tuple(cells),
            cluster,
            stem=None if stem is None else str(stem),
            head=None if head is None else str(head),
        )

    def from_params(self, params: Mapping[str, Any]) -> Architecture:
        """The architecture of an Optuna ``params`` dict (e.g. ``study.best_params``).

        Every active, non-constant decision must be present with a valid value, and no other
        key; constants may be given with their fixed value.
        """
        values: dict[str, Choice] = {}
        for d in self._decisions:
            if not self._active(d, values):
                if d.name in params:
                    raise ValueError(
                        f"Parameter {d.name!r} is given, but it does not apply when "
                        f"{d.parent!r} is {values.get(d.parent or '')!r}."
                    )
                continue
            if d.name not in params:
                if d.is_constant:
                    values[d.name] = d.choices[0]
                    continue
                raise ValueError(f"Parameter {d.name!r} is missing.")
            value = params[d.name]
            if value not in d.choices or isinstance(value, bool):
                raise ValueError(
                    f"Parameter {d.name!r} is {value!r}, but must be one of {list(d.choices)}."
                )
            values[d.name] = value
        extra = sorted(set(params) - set(self._by_name))
        if extra:
            raise ValueError(f"Parameter {extra[0]!r} is not part of this search space.")
        return self._architecture(values)

    def _values(self, arch: Architecture) -> dict[str, Choice]:
        """Decision values of ``arch`` (active decisions only, constants included)."""
        if not isinstance(arch, Architecture):
            raise TypeError(f"Expected an Architecture, but got {type(arch).__name__}.")
        if arch.num_cells != self._num_cells:
            raise ValueError(
                f"The architecture has {arch.num_cells} cells, "
                f"but the space has {self._num_cells}."
            )
        raw: dict[str, Any] = {"node.topology": arch.topology}
        for key, searched in (("stem", self._stems), ("head", self._heads)):
            value = getattr(arch, key)
            if searched is None and value is not None:
                raise ValueError(
                    f"The architecture sets {key}={value!r}, which this space does not search."
                )
            raw[f"node.{key}"] = value
        for i, cell in enumerate(arch.cells):
            raw[f"node.cell{i}.op"] = cell.op
            spec = self._registry[cell.op] if cell.op in self._registry else None
            for attr, applies in MICRO_PARAMETERS:
                value = getattr(cell, attr)
                takes = spec is not None and applies(spec)
                if attr == "kernel" and spec is not None and spec.kernel is not None:
                    if value not in (None, spec.kernel):
                        raise ValueError(
                            f"Cell {i} has kernel {value}, but operator {cell.op!r} has a fixed "
                            f"kernel of {spec.kernel}."
                        )
                    continue
                if value is not None and not takes:
                    raise ValueError(
                        f"Cell {i} sets {attr}={value!r}, which {cell.op!r} does not take."
                    )
                if takes:
                    raw[f"node.cell{i}.{attr}"] = value
        for f in _CLUSTER_FIELDS:
            raw[f"cluster.{f}"] = getattr(arch.cluster, f)
        values: dict[str, Choice] = {}
        for d in self._decisions:
            if not self._active(d, values):
                continue
            value = raw.get(d.name)
            if value is None or value not in d.choices:
                raise ValueError(f"{d.name!r} is {value!r}, but must be one of {list(d.choices)}.")
            values[d.name] = value
        return values

    def to_params(self, arch: Architecture) -> dict[str, Choice]:
        """The Optuna params of ``arch`` (for ``study.enqueue_trial``); constants left out."""
        return {k: v for k, v in self._values(arch).items() if not self._by_name[k].is_constant}

    def contains(self, arch: Architecture) -> bool:
        """Whether ``arch`` is a point of this space (feasibility of the layout aside)."""
        try:
            self._values(arch)
        except ValueError:
            return False
        return True
