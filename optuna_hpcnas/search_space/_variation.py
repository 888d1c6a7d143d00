"""What a ``HierarchicalSearchSpace`` does with its decisions beyond suggesting them:
counting and enumerating its architectures, their one-hot codes, one-decision mutations and
uniform draws (the samplers' moves)."""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
import itertools
from typing import TYPE_CHECKING

import numpy as np

from optuna_hpcnas.search_space._architecture import Architecture
from optuna_hpcnas.search_space._architecture import CellConfig
from optuna_hpcnas.search_space._architecture import ClusterConfig
from optuna_hpcnas.search_space._decisions import Choice
from optuna_hpcnas.search_space._decisions import Decision
from optuna_hpcnas.search_space._decisions import Level
from qubo import OneHotEncoding


class SpaceVariation:
    """Counting, encoding, mutation and sampling; mixed into ``HierarchicalSearchSpace``,
    whose definition (the attributes below) and parameter mapping (the methods below) it
    uses."""

    _decisions: tuple[Decision, ...]
    _by_name: dict[str, Decision]
    _encoding: OneHotEncoding
    _num_cells: int
    _topologies: tuple[str, ...]
    _stems: tuple[str, ...] | None
    _heads: tuple[str, ...] | None
    _data_parallel: tuple[int, ...]
    _pipeline_stages: tuple[int, ...]
    _micro_batch_sizes: tuple[int, ...]
    _max_ranks: int | None

    if TYPE_CHECKING:  # defined by HierarchicalSearchSpace; declared here for the checker

        def _active(self, decision: Decision, values: Mapping[str, Choice]) -> bool: ...

        def _cell(self, op: Choice, micro: Mapping[str, Choice]) -> CellConfig: ...

        def _architecture(self, values: Mapping[str, Choice]) -> Architecture: ...

        def _values(self, arch: Architecture) -> dict[str, Choice]: ...

        def from_params(self, params: Mapping[str, object]) -> Architecture: ...

        def is_feasible(self, arch: Architecture) -> bool: ...

    # ------------------------------------------------------------------ counting
    def _cell_configs(self) -> list[dict[str, Choice]]:
        configs: list[dict[str, Choice]] = []
        cell_decisions = [d for d in self._decisions if d.name.startswith("node.cell0.")]
        op_decision, micro = cell_decisions[0], cell_decisions[1:]
        for op in op_decision.choices:
            active = [d for d in micro if d.active_when and op in d.active_when]
            for combo in itertools.product(*(d.choices for d in active)):
                config: dict[str, Choice] = {"op": op}
                config.update({d.name.rsplit(".", 1)[1]: v for d, v in zip(active, combo)})
                configs.append(config)
        return configs

    def _cluster_layouts(self) -> list[tuple[int, int, int]]:
        return [
            (dp, pp, mb)
            for dp, pp, mb in itertools.product(
                self._data_parallel, self._pipeline_stages, self._micro_batch_sizes
            )
            if self._max_ranks is None or dp * pp <= self._max_ranks
        ]

    def cardinality(self) -> int:
        """Number of distinct feasible architectures (an exact integer)."""
        return (
            len(self._topologies)
            * len(self._stems or (None,))
            * len(self._heads or (None,))
            * len(self._cell_configs()) ** self._num_cells
            * len(self._cluster_layouts())
        )

    def enumerate(self, max_size: int = 100_000) -> Iterator[Architecture]:
        """Every feasible architecture, in a fixed order; for small spaces only."""
        size = self.cardinality()
        if size > max_size:
            raise ValueError(
                f"The space has {size} architectures, more than `max_size`={max_size}; "
                "enumerate only small spaces."
            )
        cells = [self._cell(c["op"], c) for c in self._cell_configs()]
        layouts = self._cluster_layouts()
        macro = itertools.product(self._topologies, self._stems or (None,), self._heads or (None,))
        for topology, stem, head in macro:
            for node in itertools.product(cells, repeat=self._num_cells):
                for dp, pp, mb in layouts:
                    yield Architecture(
                        str(topology), node, ClusterConfig(dp, pp, mb), stem=stem, head=head
                    )

    # ------------------------------------------------------------------ encoding
    def encode(self, arch: Architecture) -> np.ndarray:
        """One-hot bits of ``arch`` (``uint8``), in the order of ``self.encoding``."""
        values = self._values(arch)
        return self._encoding.encode([values.get(name) for name in self._encoding.names])

    def decode(self, bits: Sequence[int] | np.ndarray) -> Architecture:
        """The architecture of one-hot ``bits``; inconsistent bits raise ``ValueError``."""
        decoded = dict(zip(self._encoding.names, self._encoding.decode(bits)))
        params = {k: v for k, v in decoded.items() if v is not None}
        inactive_set = [
            k
            for k, v in decoded.items()
            if v is None and self._active(self._by_name[k], decoded)  # type: ignore[arg-type]
        ]
        if inactive_set:
            raise ValueError(f"Bits leave {inactive_set[0]!r} unset, but it applies.")
        return self.from_params(params)

    # ------------------------------------------------------------------ mutation
    def mutate(
        self,
        arch: Architecture,
        rng: np.random.Generator,
        level: Level | str | None = None,
    ) -> Architecture:
        """Change exactly one decision of ``arch``, at ``level`` if given.

        The decision is drawn uniformly among the active, non-constant decisions (of that
        level). Micro parameters that start to apply get a random value; those that stop
        applying are dropped; the cluster layout stays feasible.
        """
        values = self._values(arch)
        wanted = Level(level) if level is not None else None
        candidates = [
            d
            for d in self._decisions
            if not d.is_constant and d.name in values and (wanted is None or d.level == wanted)
        ]
        order = rng.permutation(len(candidates))
        for index in order:
            d = candidates[int(index)]
            alternatives = [c for c in d.choices if c != values[d.name]]
            if d.level == Level.CLUSTER and self._max_ranks is not None:
                alternatives = [
                    c
                    for c in alternatives
                    if self._layout_ranks(values, d.name, c) <= self._max_ranks
                ]
            if not alternatives:
                continue
            new_values = dict(values)
            new_values[d.name] = alternatives[int(rng.integers(len(alternatives)))]
            return self._architecture(self._complete(new_values, rng))
        where = f" at level {wanted.value!r}" if wanted is not None else ""
        raise ValueError(f"The architecture has no decision that can change{where}.")

    @staticmethod
    def _layout_ranks(values: Mapping[str, Choice], name: str, value: Choice) -> int:
        dp = int(value if name == "cluster.data_parallel" else values["cluster.data_parallel"])
        pp = int(value if name == "cluster.pipeline_stages" else values["cluster.pipeline_stages"])
        return dp * pp

    def _complete(
        self, values: Mapping[str, Choice], rng: np.random.Generator
    ) -> dict[str, Choice]:
        """Keep values that still apply, draw those that start to apply, drop the rest."""
        out: dict[str, Choice] = {}
        for d in self._decisions:
            if not self._active(d, out):
                continue
            if d.name in values:
                out[d.name] = values[d.name]
            else:
                out[d.name] = d.choices[int(rng.integers(len(d.choices)))]
        return out

    def sample(
        self, rng: np.random.Generator, *, fixed: Mapping[str, Choice] | None = None
    ) -> Architecture:
        """A uniformly random choice per decision (a feasible layout is redrawn if needed).

        ``fixed``: values kept wherever their decision applies (the rest is drawn), e.g.
        ``{"node.cell0.op": "conv3x3"}`` samples the part of the space with that operator.
        """
        fixed = dict(fixed or {})
        unknown = sorted(set(fixed) - set(self._by_name))
        if unknown:
            raise ValueError(
                f"`fixed` names {unknown[0]!r}, which is not a decision of the space."
            )
        for name, value in fixed.items():
            if value not in self._by_name[name].choices:
                raise ValueError(
                    f"`fixed` gives {name!r} the value {value!r}, but its choices are "
                    f"{list(self._by_name[name].choices)}."
                )
        for _ in range(1000):
            arch = self._architecture(self._complete(fixed, rng))
            if self.is_feasible(arch):
                return arch
        raise RuntimeError("No feasible architecture found in 1000 draws.")  # pragma: no cover
