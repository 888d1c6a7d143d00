"""``HierarchicalSearchSpace``: macro topology, per-cell operators with micro parameters, and a
cluster layout, suggested through plain ``trial.suggest_categorical`` calls.

Every decision has a hierarchical name (``node.topology``, ``node.cell2.op``,
``node.cell2.kernel``, ``cluster.data_parallel``) and a level. Micro parameters are
conditional: they are suggested only when the cell's operator takes them, so every Optuna
sampler sees a plain (conditional) categorical space.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import json
from typing import Any
from typing import TYPE_CHECKING
import weakref

from optuna_hpcnas import _keys
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.search_space._architecture import Architecture
from optuna_hpcnas.search_space._decisions import Choice
from optuna_hpcnas.search_space._decisions import Decision
from optuna_hpcnas.search_space._decisions import Level
from optuna_hpcnas.search_space._operators import DOMAINS
from optuna_hpcnas.search_space._operators import OperatorRegistry
from optuna_hpcnas.search_space._operators import OperatorSpec
from optuna_hpcnas.search_space._params import MICRO_PARAMETERS
from optuna_hpcnas.search_space._params import SpaceParams
from optuna_hpcnas.search_space._targets import target_profile
from optuna_hpcnas.search_space._variation import SpaceVariation
from qubo import OneHotEncoding

if TYPE_CHECKING:
    import optuna

TOPOLOGIES = ("chain", "residual", "dense")
# What turns a sample into the first state, and the last state into class scores, per
# domain; the first of each is the default (what spaces that do not search them use).
STEMS = {
    "image": ("conv",),  # 3x3 conv-BN-ReLU to the widest cell
    # a linear embedding with learned positions; the raw signal; every position as one token
    "sequence": ("embed", "none", "flatten"),
}
HEADS = {
    "image": ("grid",),  # average pooling to 2x2, linear
    "sequence": ("mean", "flatten"),  # LayerNorm and mean over positions; all positions
}


def _check_choices(field_name: str, values: Sequence[Any], *, positive_int: bool) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"`{field_name}` must be a sequence, but got {values!r}.")
    values = tuple(values)
    if not values:
        raise ValueError(f"`{field_name}` is empty; give at least one choice.")
    if len(set(values)) != len(values):
        raise ValueError(f"`{field_name}` has duplicate values: {list(values)}.")
    if positive_int:
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{field_name}` contains {v!r}, but must hold integers >= 1.")
    return values


class HierarchicalSearchSpace(SpaceParams, SpaceVariation):
    """A hierarchical NAS search space for Optuna.

    Args:
        num_cells: Number of cells (nodes) of the macro network.
        operators: Names of the candidate operators of every cell (from ``registry``).
        topologies: Macro topologies among ``chain``, ``residual`` and ``dense``.
        widths: Output widths (channels) for operators that take a width.
        kernel_sizes: Kernel sizes for operators whose kernel is searched (e.g. ``conv``).
        expansion_ratios: Feed-forward expansion ratios (transformer blocks).
        num_heads: Numbers of attention heads (attention, transformer blocks).
        strides: Strides of operators that can downsample a sequence (``conv1d_bn``,
            ``conv1d_plain``).
        stems: Stems to search (``node.stem``): for sequences ``"embed"`` (a linear
            embedding with learned positions), ``"none"`` (the raw signal) or ``"flatten"``
            (every position as one token, for MLPs). ``None``: the domain's one stem, not
            part of the architecture.
        heads: Heads to search (``node.head``): for sequences ``"mean"`` (LayerNorm and the
            mean over positions) or ``"flatten"`` (a linear layer on every position).
            ``None``: the domain's one head.
        data_parallel: Data-parallel degrees of one evaluation group.
        pipeline_stages: Pipeline stages (at most ``num_cells``).
        micro_batch_sizes: Micro-batch sizes.
        max_ranks: Ranks available to one evaluation, when known: layouts with
            ``data_parallel * pipeline_stages > max_ranks`` are infeasible.
        domain: ``"image"`` or ``"sequence"``; every operator must support it.
        registry: Operator registry; the built-in operators by default.
        target: Deployment target (``"onnx-cpu"``, ``"tensorrt"``, ``"npu-no-grouped"``, see
            ``target_profile``): operators it cannot run are removed from ``operators``.
            ``None`` (the default) removes nothing.

    A choice list with one value makes a constant, which is not suggested.

    Examples:
        >>> import optuna
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> def objective(trial):
        ...     arch = space.suggest(trial)
        ...     return float(sum(c.width or 0 for c in arch.cells))
        >>> study = optuna.create_study()
        >>> study.optimize(objective, n_trials=3)
    """

    def __init__(
        self,
        *,
        num_cells: int,
        operators: Sequence[str],
        topologies: Sequence[str] = TOPOLOGIES,
        widths: Sequence[int] = (32,),
        kernel_sizes: Sequence[int] = (3,),
        expansion_ratios: Sequence[int] = (4,),
        num_heads: Sequence[int] = (2,),
        strides: Sequence[int] = (1,),
        stems: Sequence[str] | None = None,
        heads: Sequence[str] | None = None,
        data_parallel: Sequence[int] = (1,),
        pipeline_stages: Sequence[int] = (1,),
        micro_batch_sizes: Sequence[int] = (32,),
        max_ranks: int | None = None,
        domain: str = "image",
        registry: OperatorRegistry | None = None,
        target: str | None = None,
    ) -> None:
        check_int("num_cells", num_cells, 1)
        if domain not in DOMAINS:
            raise ValueError(f"`domain` is {domain!r}, but must be one of {list(DOMAINS)}.")
        check_int("max_ranks", max_ranks, 1, allow_none=True)
        self._registry = registry if registry is not None else OperatorRegistry.default()
        self._num_cells = num_cells
        self._domain = domain
        self._max_ranks = max_ranks
        self._target = target
        self._operators = self._for_target(
            _check_choices("operators", operators, positive_int=False)
        )
        self._topologies = _check_choices("topologies", topologies, positive_int=False)
        self._widths = _check_choices("widths", widths, positive_int=True)
        self._kernel_sizes = _check_choices("kernel_sizes", kernel_sizes, positive_int=True)
        self._expansion_ratios = _check_choices(
            "expansion_ratios", expansion_ratios, positive_int=True
        )
        self._num_heads = _check_choices("num_heads", num_heads, positive_int=True)
        self._strides = _check_choices("strides", strides, positive_int=True)
        self._stems = None if stems is None else _check_choices("stems", stems, positive_int=False)
        self._heads = None if heads is None else _check_choices("heads", heads, positive_int=False)
        self._data_parallel = _check_choices("data_parallel", data_parallel, positive_int=True)
        self._pipeline_stages = _check_choices(
            "pipeline_stages", pipeline_stages, positive_int=True
        )
        self._micro_batch_sizes = _check_choices(
            "micro_batch_sizes", micro_batch_sizes, positive_int=True
        )
        self._validate()
        self._decisions = self._build_decisions()
        self._by_name = {d.name: d for d in self._decisions}
        encoded = [d for d in self._decisions if not d.is_constant]
        self._encoding = OneHotEncoding(
            [d.name for d in encoded],
            [d.choices + ((None,) if d.parent is not None else ()) for d in encoded],
        )
        # storage object -> ids of its studies this space recorded itself in. Weak keys: an
        # id() of a freed storage can come back for a new one (in-memory studies all have id
        # 0), and the space would then skip recording itself in the new study.
        self._recorded_studies: weakref.WeakKeyDictionary[Any, set[int]] = (
            weakref.WeakKeyDictionary()
        )

    # ------------------------------------------------------------------ definition
    def _for_target(self, operators: tuple[str, ...]) -> tuple[str, ...]:
        """``operators`` less those the deployment target cannot run."""
        if self._target is None:
            return operators
        profile = target_profile(self._target)  # unknown names raise
        kept = tuple(op for op in operators if profile.allows(self._registry[op]))
        if not kept:
            raise ValueError(
                f"Target {self._target!r} cannot run any of `operators` {list(operators)}, "
                "so the cells would have no operator left."
            )
        return kept

    def _validate(self) -> None:
        for field_name, given, allowed in (
            ("stems", self._stems, STEMS[self._domain]),
            ("heads", self._heads, HEADS[self._domain]),
        ):
            for value in given or ():
                if value not in allowed:
                    raise ValueError(
                        f"`{field_name}` contains {value!r}, but the {self._domain!r} domain "
                        f"has {list(allowed)}."
                    )
        for topology in self._topologies:
            if topology not in TOPOLOGIES:
                raise ValueError(
                    f"`topologies` contains {topology!r}, "
                    f"but must hold values of {list(TOPOLOGIES)}."
                )
        specs = [self._registry[name] for name in self._operators]  # unknown names raise
        for spec in specs:
            if self._domain not in spec.domains:
                raise ValueError(
                    f"`operators` contains {spec.name!r}, which does not support the "
                    f"{self._domain!r} domain (it supports {sorted(spec.domains)})."
                )
            if spec.searches_kernel:
                assert spec.kernel_choices is not None
                for k in self._kernel_sizes:
                    if k not in spec.kernel_choices:
                        raise ValueError(
                            f"`kernel_sizes` contains {k}, which operator {spec.name!r} cannot "
                            f"take (allowed: {list(spec.kernel_choices)})."
                        )
            if spec.has_heads:
                for h in self._num_heads:
                    if max(self._widths) % h:
                        raise ValueError(
                            f"`num_heads` contains {h}, which does not divide the model width "
                            f"{max(self._widths)} (the largest of `widths`) used by {spec.name!r}."
                        )
        too_deep = [p for p in self._pipeline_stages if p > self._num_cells]
        if too_deep:
            raise ValueError(
                f"`pipeline_stages` contains {too_deep[0]}, but a pipeline cannot have more "
                f"stages than `num_cells` ({self._num_cells})."
            )
        if self._max_ranks is not None:
            if min(self._data_parallel) * min(self._pipeline_stages) > self._max_ranks:
                raise ValueError(
                    f"No cluster layout fits `max_ranks`={self._max_ranks}: the smallest is "
                    f"data_parallel={min(self._data_parallel)} x "
                    f"pipeline_stages={min(self._pipeline_stages)}."
                )

    def _build_decisions(self) -> tuple[Decision, ...]:
        specs = [self._registry[name] for name in self._operators]
        micro_choices = {
            "kernel": self._kernel_sizes,
            "width": self._widths,
            "expansion": self._expansion_ratios,
            "heads": self._num_heads,
            "stride": self._strides,
        }
        decisions = [Decision("node.topology", Level.TOPOLOGY, self._topologies)]
        if self._stems is not None:
            decisions.append(Decision("node.stem", Level.TOPOLOGY, self._stems))
        for i in range(self._num_cells):
            op_name = f"node.cell{i}.op"
            decisions.append(Decision(op_name, Level.OPERATOR, self._operators))
            for suffix, applies in MICRO_PARAMETERS:
                users = frozenset(s.name for s in specs if applies(s))
                if users:
                    decisions.append(
                        Decision(
                            f"node.cell{i}.{suffix}",
                            Level.MICRO,
                            micro_choices[suffix],
                            parent=op_name,
                            active_when=users,
                        )
                    )
        if self._heads is not None:
            decisions.append(Decision("node.head", Level.TOPOLOGY, self._heads))
        decisions.append(Decision("cluster.data_parallel", Level.CLUSTER, self._data_parallel))
        decisions.append(Decision("cluster.pipeline_stages", Level.CLUSTER, self._pipeline_stages))
        decisions.append(
            Decision("cluster.micro_batch_size", Level.CLUSTER, self._micro_batch_sizes)
        )
        return tuple(decisions)

    # ------------------------------------------------------------------ properties
    @property
    def num_cells(self) -> int:
        return self._num_cells

    @property
    def domain(self) -> str:
        return self._domain

    @property
    def target(self) -> str | None:
        """The deployment target the operators were restricted to, or ``None``."""
        return self._target

    @property
    def max_ranks(self) -> int | None:
        return self._max_ranks

    @property
    def registry(self) -> OperatorRegistry:
        return self._registry

    @property
    def operators(self) -> tuple[OperatorSpec, ...]:
        return tuple(self._registry[name] for name in self._operators)

    @property
    def widths(self) -> tuple[int, ...]:
        return self._widths

    @property
    def stems(self) -> tuple[str, ...]:
        """The stems an architecture of this space may have (the domain's one by default)."""
        return self._stems if self._stems is not None else STEMS[self._domain][:1]

    @property
    def heads(self) -> tuple[str, ...]:
        """The heads an architecture of this space may have (the domain's one by default)."""
        return self._heads if self._heads is not None else HEADS[self._domain][:1]

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """Every decision in suggestion order, constants included."""
        return self._decisions

    @property
    def encoding(self) -> OneHotEncoding:
        """One-hot groups of the non-constant decisions; conditional ones end in ``None``."""
        return self._encoding

    def decision(self, name: str) -> Decision:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"{name!r} is not a decision of this search space.") from None

    def distributions(self) -> dict[str, optuna.distributions.CategoricalDistribution]:
        """Optuna distributions of every non-constant decision (conditional ones included)."""
        import optuna

        return {
            d.name: optuna.distributions.CategoricalDistribution(d.choices)
            for d in self._decisions
            if not d.is_constant
        }

    # ------------------------------------------------------------------ suggesting
    def suggest(self, trial: optuna.trial.BaseTrial) -> Architecture:
        """Suggest an architecture through ``trial.suggest_categorical``.

        With ``max_ranks`` set, the constraint ``hpcnas.cluster_ranks``
        (``data_parallel * pipeline_stages - max_ranks``, feasible when <= 0) is recorded
        through ``trial.set_constraint``.
        """
        self._record_definition(trial)
        values: dict[str, Choice] = {}
        for d in self._decisions:
            if not self._active(d, values):
                continue
            if d.is_constant:
                values[d.name] = d.choices[0]
            else:
                values[d.name] = trial.suggest_categorical(d.name, d.choices)  # type: ignore[assignment]
        arch = self._architecture(values)
        if self._max_ranks is not None and hasattr(trial, "set_constraint"):
            trial.set_constraint(_keys.CLUSTER_RANKS_CONSTRAINT, float(self.rank_excess(arch)))
        return arch

    # ------------------------------------------------------------------ feasibility
    def fitting(self, ranks: int) -> HierarchicalSearchSpace:
        """This space with only cluster layouts that ``ranks`` ranks can run.

        The data-parallel and pipeline choices are cut to a box whose every layout fits
        (``data_parallel * pipeline_stages <= ranks``), so no suggested layout is infeasible:
        choices above ``ranks`` go, then the largest pipeline depth, then the largest
        data-parallel degree, until the largest layout fits (data parallelism is kept first:
        on a group this small it is the cheaper way to use the ranks). One rank leaves the
        layout constant, ``1 x 1``, and not suggested at all.

        Examples:
            >>> space = HierarchicalSearchSpace.preset("signal-1d").fitting(2)
            >>> space.to_dict()["data_parallel"], space.to_dict()["pipeline_stages"]
            ([1, 2], [1])
        """
        check_int("ranks", ranks, 1)
        dp = [d for d in self._data_parallel if d <= ranks]
        pp = [p for p in self._pipeline_stages if p <= ranks]
        if not dp or not pp:
            raise ValueError(
                f"No cluster layout of this space fits {ranks} rank(s): data_parallel "
                f"{list(self._data_parallel)}, pipeline_stages {list(self._pipeline_stages)}."
            )
        while max(dp) * max(pp) > ranks:
            if len(pp) > 1:
                pp.remove(max(pp))
            else:
                dp.remove(max(dp))
        definition = self.to_dict()
        if (definition["data_parallel"], definition["pipeline_stages"]) == (dp, pp):
            return self
        definition.update(data_parallel=dp, pipeline_stages=pp)
        return HierarchicalSearchSpace.from_dict(definition, registry=self._registry)

    def rank_excess(self, arch: Architecture) -> int:
        """``data_parallel * pipeline_stages - max_ranks`` (<= 0 is feasible; 0 if unknown)."""
        if self._max_ranks is None:
            return 0
        return arch.cluster.ranks - self._max_ranks

    def is_feasible(self, arch: Architecture) -> bool:
        return self.rank_excess(arch) <= 0

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready definition, operator metadata included."""
        data: dict[str, Any] = {
            "num_cells": self._num_cells,
            "operators": list(self._operators),
            "operator_specs": [self._registry[name].to_dict() for name in self._operators],
            "topologies": list(self._topologies),
            "widths": list(self._widths),
            "kernel_sizes": list(self._kernel_sizes),
            "expansion_ratios": list(self._expansion_ratios),
            "num_heads": list(self._num_heads),
            "data_parallel": list(self._data_parallel),
            "pipeline_stages": list(self._pipeline_stages),
            "micro_batch_sizes": list(self._micro_batch_sizes),
            "max_ranks": self._max_ranks,
            "domain": self._domain,
        }
        # Left out when unset, so spaces recorded in studies before targets, strides, stems
        # and heads existed still compare equal to the same space built today.
        if self._target is not None:
            data["target"] = self._target
        if self._strides != (1,):
            data["strides"] = list(self._strides)
        if self._stems is not None:
            data["stems"] = list(self._stems)
        if self._heads is not None:
            data["heads"] = list(self._heads)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], registry: OperatorRegistry | None = None
    ) -> HierarchicalSearchSpace:
        """Rebuild a space; operators missing from ``registry`` come from their metadata."""
        data = dict(data)
        specs = data.pop("operator_specs", [])
        registry = registry if registry is not None else OperatorRegistry.default()
        for spec in specs:
            if spec["name"] not in registry:
                registry.register(OperatorSpec.from_dict(spec))
        return cls(registry=registry, **data)

    @classmethod
    def from_json(
        cls, text: str, registry: OperatorRegistry | None = None
    ) -> HierarchicalSearchSpace:
        return cls.from_dict(json.loads(text), registry=registry)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HierarchicalSearchSpace) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return (
            f"HierarchicalSearchSpace(num_cells={self._num_cells}, domain={self._domain!r}, "
            f"operators={list(self._operators)}, cardinality={self.cardinality():.3g})"
        )

    # ------------------------------------------------------------------ study record
    def _record_definition(self, trial: optuna.trial.BaseTrial) -> None:
        """Store the definition in the study once, so samplers and tools can rebuild it."""
        study = getattr(trial, "study", None)
        if study is None:
            return
        storage, study_id = study._storage, study._study_id
        if study_id in self._recorded_studies.get(storage, ()):
            return
        stored = storage.get_study_system_attrs(study_id).get(_keys.SEARCH_SPACE)
        mine = self.to_json()
        if stored is None:
            storage.set_study_system_attr(study_id, _keys.SEARCH_SPACE, mine)
        elif stored != mine:
            raise ValueError(
                "This study already records a different HierarchicalSearchSpace; use one space "
                "per study (create a new study for a new space)."
            )
        self._recorded_studies.setdefault(storage, set()).add(study_id)

    @classmethod
    def from_study(cls, study: optuna.Study) -> HierarchicalSearchSpace | None:
        """The space recorded in ``study`` by ``suggest``, or ``None``."""
        text = study._storage.get_study_system_attrs(study._study_id).get(_keys.SEARCH_SPACE)
        return None if text is None else cls.from_json(text)

    # ------------------------------------------------------------------ presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> HierarchicalSearchSpace:
        """A named space: ``digits-small``, ``cifar-like`` or ``sequence``.

        Keyword ``overrides`` replace the preset's arguments (e.g. ``max_ranks=4``, or
        ``target="npu-no-grouped"`` to drop the operators that target cannot run).
        """
        from optuna_hpcnas.search_space._presets import PRESETS

        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; available: {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})
