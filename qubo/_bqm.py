"""From a quadratic surrogate to a ``dimod.BinaryQuadraticModel`` with constraints.

``QUBOProblem`` holds what does not change between asks: the one-hot encoding, forbidden bit
combinations (conditional activity of hierarchical spaces, cluster layouts over the rank
limit) and linear resource budgets. ``build_bqm`` adds, for one drawn surrogate:

1. the surrogate terms (pairs inside one one-hot group are dropped: they vanish on codes);
2. a penalty against already evaluated codes: ``w / C(G, 2)`` on every pair of a code's G set
   bits, so the code itself pays ``w`` and a code agreeing in m groups pays
   ``w m(m-1)/(G(G-1))`` (exact exclusion happens at decoding);
3. budgets ``sum(cost * x) <= limit``: ``slack`` adds binary slack variables (dimod's
   ``add_linear_inequality_constraint``, costs rounded to ``resolution``), ``unbalanced`` adds
   the slack-free unbalanced penalty. Both are soft in the BQM, scaled so that exceeding the
   budget by 10 % of its range costs more than the whole surrogate swing; decoding checks
   the exact float costs;
4. forbidden combinations: a penalty ``2 (r1 + r2) (1 + margin)`` per combination, r the
   largest absolute row sum of the terms so far in each involved group: changing those groups
   always pays, so ground states respect them when such a change exists (true for
   conditional activity and rank limits);
5. one-hot penalties ``P_g (sum_g x - 1)^2`` with ``P_g`` the largest absolute row sum in
   group g times ``1 + margin``: flipping one bit towards feasibility then always lowers the
   energy, so every ground state is one-hot feasible.

numpy only at import; ``build_bqm`` imports dimod.
"""

from __future__ import annotations

from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
import math
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

from qubo._encoding import OneHotEncoding
from qubo._surrogate import QuadraticModel

if TYPE_CHECKING:
    import dimod

_MARGIN = 1e-3
_BUDGET_METHODS = ("slack", "unbalanced")


@dataclass(frozen=True)
class LinearBudget:
    """``sum(cost of each chosen value) <= limit``, e.g. FLOPs, parameters or latency.

    Args:
        name: A label (used for slack variables and in reports).
        costs: Additive cost per ``(group name, value)``; missing pairs cost 0.
        limit: The budget.
        method: ``"slack"`` (exact inequality through binary slack variables) or
            ``"unbalanced"`` (a slack-free quadratic penalty; fewer variables, approximate).
        resolution: Cost unit for the integer slack encoding; ``(limit - min cost) / 64`` by
            default.
        strength: Multiplier of the default penalty scale.
    """

    name: str
    costs: Mapping[tuple[str, Hashable], float]
    limit: float
    method: str = "slack"
    resolution: float | None = None
    strength: float = 1.0
    _frozen_costs: tuple[tuple[tuple[str, Hashable], float], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`name` must be a non-empty string, but got {self.name!r}.")
        if self.method not in _BUDGET_METHODS:
            raise ValueError(
                f"`method` is {self.method!r}, but must be one of {list(_BUDGET_METHODS)}."
            )
        if not math.isfinite(float(self.limit)):
            raise ValueError(f"`limit` is {self.limit!r}, but must be finite.")
        if self.resolution is not None and not float(self.resolution) > 0:
            raise ValueError(f"`resolution` is {self.resolution!r}, but must be > 0.")
        if not float(self.strength) > 0:
            raise ValueError(f"`strength` is {self.strength!r}, but must be > 0.")
        for key, cost in dict(self.costs).items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise TypeError(f"Budget costs are keyed by (group, value), but got {key!r}.")
            if not math.isfinite(float(cost)):
                raise ValueError(f"Cost of {key!r} is {cost!r}, but must be finite.")
        object.__setattr__(self, "_frozen_costs", tuple(dict(self.costs).items()))


def conditional_pairs(
    encoding: OneHotEncoding,
    child: str,
    parent: str,
    active_when: Iterable[Hashable],
    inactive_value: Hashable = None,
) -> list[tuple[int, ...]]:
    """Forbidden bit combinations tying ``child``'s ``inactive_value`` slot to ``parent``.

    ``child`` takes ``inactive_value`` exactly when ``parent`` is not in ``active_when``.
    """
    names = list(encoding.names)
    c = names.index(child)
    p = names.index(parent)
    active = set(active_when)
    off = encoding.bit(c, inactive_value)
    pairs: list[tuple[int, ...]] = []
    for value in encoding.groups[p]:
        pbit = encoding.bit(p, value)
        if value in active:
            pairs.append((pbit, off))
        else:
            pairs.extend(
                (pbit, encoding.bit(c, v)) for v in encoding.groups[c] if v != inactive_value
            )
    return pairs


class QUBOProblem:
    """A one-hot encoded discrete problem with constraints, ready to become a BQM.

    Args:
        encoding: The one-hot groups.
        forbidden: Bit combinations (one or two bit positions) that must not all be set.
        budgets: Linear resource budgets.

    Examples:
        >>> from qubo import OneHotEncoding, QuadraticModel
        >>> import numpy as np
        >>> problem = QUBOProblem(OneHotEncoding(["a", "b"], [[0, 1], [0, 1, 2]]))
        >>> bqm = problem.build_bqm(QuadraticModel(np.arange(5.0), np.zeros((5, 5))))
        >>> bqm.num_variables
        5
    """

    def __init__(
        self,
        encoding: OneHotEncoding,
        *,
        forbidden: Sequence[Sequence[int]] = (),
        budgets: Sequence[LinearBudget] = (),
    ) -> None:
        if not isinstance(encoding, OneHotEncoding):
            raise TypeError(f"`encoding` must be a OneHotEncoding, but got {encoding!r}.")
        if encoding.n_bits == 0:
            raise ValueError("The encoding is empty: a QUBO problem needs at least one group.")
        self._encoding = encoding
        n = encoding.n_bits
        self._group_of = np.empty(n, dtype=int)
        for g in range(len(encoding.names)):
            self._group_of[encoding.slice(g)] = g
        combos = []
        for combo in forbidden:
            bits = tuple(sorted({int(b) for b in combo}))
            if not 1 <= len(bits) <= 2 or not all(0 <= b < n for b in bits):
                raise ValueError(
                    f"A forbidden combination must hold 1 or 2 bit positions in [0, {n}), "
                    f"but got {tuple(combo)!r}."
                )
            combos.append(bits)
        self._forbidden = tuple(dict.fromkeys(combos))
        self._starts = np.array([encoding.slice(g).start for g in range(len(encoding.names))])
        self._single = np.array([c[0] for c in self._forbidden if len(c) == 1], dtype=int)
        pairs = np.array([c for c in self._forbidden if len(c) == 2], dtype=int).reshape(-1, 2)
        self._pair_a, self._pair_b = pairs[:, 0], pairs[:, 1]
        self._budgets = tuple(budgets)
        self._costs = np.zeros((len(self._budgets), n))
        for k, budget in enumerate(self._budgets):
            if not isinstance(budget, LinearBudget):
                raise TypeError(f"`budgets` must hold LinearBudget, but got {budget!r}.")
            for (group, value), cost in budget.costs.items():
                if group not in encoding.names:
                    raise ValueError(f"Budget {budget.name!r} names unknown group {group!r}.")
                self._costs[k, encoding.bit(list(encoding.names).index(group), value)] = cost
        self._limits = np.array([float(b.limit) for b in self._budgets])
        mins = self._group_reduce(self._costs, np.min)
        for k, budget in enumerate(self._budgets):
            if mins[k] > budget.limit:
                raise ValueError(
                    f"Budget {budget.name!r} cannot be met: the cheapest code costs "
                    f"{mins[k]:g} > limit {budget.limit:g}."
                )

    def _group_reduce(self, costs: np.ndarray, func: Any) -> np.ndarray:
        out = np.zeros(costs.shape[0])
        for g in range(len(self._encoding.names)):
            block = costs[:, self._encoding.slice(g)]
            if block.shape[0]:
                out += func(block, axis=1)
        return out

    @property
    def encoding(self) -> OneHotEncoding:
        return self._encoding

    @property
    def n_bits(self) -> int:
        return self._encoding.n_bits

    @property
    def forbidden(self) -> tuple[tuple[int, ...], ...]:
        return self._forbidden

    @property
    def budgets(self) -> tuple[LinearBudget, ...]:
        return self._budgets

    def costs(self, bits: np.ndarray) -> np.ndarray:
        """The cost of ``bits`` under every budget (rows for 2-D input)."""
        return np.asarray(bits, dtype=float) @ self._costs.T

    def n_violations(self, bits: np.ndarray) -> np.ndarray:
        """Per code (row of ``bits``): one-hot groups not exactly set, plus forbidden
        combinations present, plus budgets exceeded. A 1-D input gives a 0-d array."""
        x = np.asarray(bits, dtype=np.int64)
        sums = np.add.reduceat(x, self._starts, axis=-1)
        count = np.sum(sums != 1, axis=-1)
        if len(self._single):
            count = count + x[..., self._single].sum(axis=-1)
        if len(self._pair_a):
            count = count + (x[..., self._pair_a] * x[..., self._pair_b]).sum(axis=-1)
        if len(self._budgets):
            over = self.costs(x) > self._limits + 1e-9 * np.abs(self._limits)
            count = count + over.sum(axis=-1)
        return np.asarray(count)

    def is_feasible(self, bits: np.ndarray) -> bool:
        return bool(self.n_violations(bits) == 0)

    def group_penalties(self, row: np.ndarray) -> np.ndarray:
        """One-hot penalty per group from absolute row sums ``row`` (see module docstring)."""
        return np.array(
            [
                max(float(row[self._encoding.slice(g)].max()), 1e-6) * (1.0 + _MARGIN)
                for g in range(len(self._encoding.names))
            ]
        )

    def build_bqm(
        self,
        model: QuadraticModel,
        *,
        evaluated: Sequence[np.ndarray] = (),
        evaluated_penalty: float = 0.0,
    ) -> dimod.BinaryQuadraticModel:
        """The BQM of ``model`` under this problem's constraints.

        Variables ``0 .. n_bits - 1`` are the code bits; slack variables follow, labelled
        ``"slack_<budget>_<k>"``.
        """
        import dimod

        enc = self._encoding
        n = enc.n_bits
        if model.n_bits != n:
            raise ValueError(f"The model has {model.n_bits} bits, the encoding {n}.")
        if evaluated_penalty < 0:
            raise ValueError(f"`evaluated_penalty` is {evaluated_penalty}, but must be >= 0.")
        same_group = self._group_of[:, None] == self._group_of[None, :]
        linear = model.linear.copy()
        quad = np.where(same_group, 0.0, model.quadratic)
        swing = sum(float(np.ptp(linear[enc.slice(g)])) for g in range(len(enc.names))) + float(
            np.abs(quad).sum()
        )
        if evaluated_penalty > 0 and len(evaluated):
            codes = np.asarray(evaluated, dtype=float)
            spread = float(np.std(model.energy(codes))) if len(codes) > 1 else 1.0
            weight = evaluated_penalty * (spread if spread > 0 else 1.0)
            # Every code sets one bit per group, so all share G and the same pair weight.
            g_count = len(enc.names)
            if g_count == 1:
                linear += weight * codes.sum(axis=0)
            else:
                share = weight / (g_count * (g_count - 1) / 2.0)
                quad += share * np.triu(codes.T @ codes, 1)
        bqm = dimod.BinaryQuadraticModel(dimod.BINARY)
        bqm.add_linear_from_array(linear.tolist())
        bqm.add_quadratic_from_dense(quad)
        self._add_budgets(bqm, max(swing, 1e-6))
        row = self._row_sums(bqm, n)
        for combo in self._forbidden:
            groups = {int(self._group_of[b]) for b in combo}
            strength = 2.0 * sum(float(row[enc.slice(g)].max()) for g in groups)
            strength = max(strength, 1e-6) * (1.0 + _MARGIN)
            if len(combo) == 1:
                bqm.add_linear(combo[0], strength)
            else:
                bqm.add_quadratic(combo[0], combo[1], strength)
        row = self._row_sums(bqm, n)
        for g, penalty in enumerate(self.group_penalties(row)):
            bits = range(enc.slice(g).start, enc.slice(g).stop)
            bqm.add_linear_equality_constraint(
                [(i, 1.0) for i in bits], lagrange_multiplier=float(penalty), constant=-1.0
            )
        return bqm

    def _add_budgets(self, bqm: dimod.BinaryQuadraticModel, swing: float) -> None:
        enc = self._encoding
        for k, budget in enumerate(self._budgets):
            costs = self._costs[k]
            low = sum(float(costs[enc.slice(g)].min()) for g in range(len(enc.names)))
            span = max(budget.limit - low, 1e-12)
            unit = budget.resolution if budget.resolution is not None else span / 64.0
            ints = np.round(costs / unit).astype(int)
            terms = [(i, int(c)) for i, c in enumerate(ints) if c != 0]
            if not terms:
                continue
            # Exceeding the budget by 10 % of its range must outweigh the whole surrogate swing.
            tenth = max(0.1 * span / unit, 1.0)
            lagrange = budget.strength * swing / tenth**2
            lb = int(sum(int(ints[enc.slice(g)].min()) for g in range(len(enc.names))))
            ub = int(math.floor(budget.limit / unit + 1e-9))
            if budget.method == "slack":
                bqm.add_linear_inequality_constraint(
                    terms,
                    lagrange_multiplier=lagrange,
                    label=f"slack_{budget.name}",
                    lb=min(lb, ub),
                    ub=ub,
                )
            else:
                bqm.add_linear_inequality_constraint(
                    terms,
                    lagrange_multiplier=(lagrange, lagrange),  # type: ignore[arg-type]
                    label=f"unbalanced_{budget.name}",
                    ub=ub,
                    penalization_method="unbalanced",
                )

    @staticmethod
    def _row_sums(bqm: dimod.BinaryQuadraticModel, n: int) -> np.ndarray:
        """Absolute row sums (linear + couplings) of the code bits ``0 .. n - 1``."""
        order = list(bqm.variables)
        position = np.full(len(order), -1)
        for k, v in enumerate(order):
            if isinstance(v, (int, np.integer)) and 0 <= v < n:
                position[k] = int(v)
        vectors = bqm.to_numpy_vectors(variable_order=order)
        ldata = vectors.linear_biases
        irow, icol, qdata = vectors.quadratic
        row = np.zeros(n + 1)  # the last slot collects slack variables
        np.add.at(row, position, np.abs(ldata))
        np.add.at(row, position[irow], np.abs(qdata))
        np.add.at(row, position[icol], np.abs(qdata))
        return row[:n]

    def neighbours(
        self, codes: Sequence[np.ndarray], exclude: Iterable[bytes] = ()
    ) -> list[np.ndarray]:
        """Feasible codes that differ from one of ``codes`` in exactly one group, in order of
        discovery, without duplicates and without the codes whose ``tobytes()`` is in
        ``exclude``."""
        enc = self._encoding
        skip = set(exclude) | {np.asarray(c, dtype=np.uint8).tobytes() for c in codes}
        out: dict[bytes, np.ndarray] = {}
        for code in codes:
            code = np.asarray(code, dtype=np.uint8)
            for g in range(len(enc.names)):
                s = enc.slice(g)
                options = np.repeat(code[None, :], s.stop - s.start, axis=0)
                options[:, s] = np.eye(s.stop - s.start, dtype=np.uint8)
                for x in options[self.n_violations(options) == 0]:
                    key = x.tobytes()
                    if key not in skip:
                        out.setdefault(key, x)
        return list(out.values())

    def penalised_energy(self, model: QuadraticModel, bits: np.ndarray) -> np.ndarray:
        """Repair scores per code: ``violations * big + budget excess * big' + energy`` as
        columns (violations, excess, energy) for lexicographic comparison."""
        x = np.atleast_2d(np.asarray(bits))
        excess = np.maximum(self.costs(x) - self._limits, 0.0).sum(axis=-1)
        return np.stack([self.n_violations(x), excess, model.energy(x)], axis=-1)

    def repair(self, bits: np.ndarray, model: QuadraticModel, max_passes: int = 5) -> np.ndarray:
        """A code near ``bits``: one bit per group first, then group-wise descent on
        ``penalised_energy`` (fewest violations, then least budget excess, then lowest
        energy). The result may still be infeasible; check ``is_feasible``."""
        enc = self._encoding
        x = np.asarray(bits, dtype=np.uint8)[: enc.n_bits].copy()
        sym = model.quadratic + model.quadratic.T
        for g in range(len(enc.names)):
            s = enc.slice(g)
            if x[s].sum() != 1:
                ones = np.flatnonzero(x[s])
                candidates = ones if len(ones) > 1 else np.arange(s.stop - s.start)
                x[s] = 0
                local = model.linear[s] + sym[s] @ x
                x[s.start + int(candidates[np.argmin(local[candidates])])] = 1
        best = tuple(self.penalised_energy(model, x)[0])
        for _ in range(max_passes):
            improved = False
            for g in range(len(enc.names)):
                s = enc.slice(g)
                options = np.repeat(x[None, :], s.stop - s.start, axis=0)
                options[:, s] = np.eye(s.stop - s.start, dtype=np.uint8)
                scores = [tuple(row) for row in self.penalised_energy(model, options)]
                k = min(range(len(scores)), key=scores.__getitem__)
                if scores[k] < best:
                    best, x, improved = scores[k], options[k], True
            if not improved:
                break
        return x
