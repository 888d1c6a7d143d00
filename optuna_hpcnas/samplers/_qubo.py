"""``QUBOSampler``: surrogate -> binary quadratic model -> annealing, for small discrete spaces.

Each ask (after ``n_startup_trials`` random trials) fits a second-order surrogate on the
one-hot codes of the finished trials, draws one quadratic acquisition (Thompson sample),
turns it into a BQM with the space's constraints (``qubo.QUBOProblem``), samples it with a
``dimod.Sampler`` and returns the decoded code that no finished or running trial has with the
highest expected improvement under the surrogate's posterior, pooled with the incumbent's
nearest unseen neighbours (a surrogate without a posterior: the best by the draw, and every
other ask ranks the neighbours alone).

The search space is the ``HierarchicalSearchSpace`` recorded in the study when there is one
(its ``encoding``; conditional micro parameters are tied to their operator by quadratic
penalties and checked again at decoding; layouts over ``max_ranks`` are forbidden), plus the
intersection search space of any other parameters. All state comes from the storage, so
several workers share one study without talking; with a seed, each trial's draw is seeded by
``(seed, trial.number)``.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
import itertools
import logging
import math
import time
from typing import Any
from typing import TYPE_CHECKING

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.samplers import BaseSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas._validation import check_bool
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.samplers import _proposals
from optuna_hpcnas.samplers._base import ArchitectureSampler
from optuna_hpcnas.samplers._independent import PerTrialRandomSampler
from optuna_hpcnas.samplers._ranking import constraint_target
from optuna_hpcnas.samplers._ranking import feasibility_keys
from optuna_hpcnas.samplers._ranking import normal_scores
from optuna_hpcnas.samplers._threads import AskThreads
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from qubo import BayesianQuadratic
from qubo import conditional_pairs
from qubo import FactorizationMachine
from qubo import LinearBudget
from qubo import OneHotEncoding
from qubo import QuadraticModel
from qubo import QUBOProblem
from qubo import Surrogate

if TYPE_CHECKING:
    import dimod

    from qubo import BayesianPosterior
    from qubo import Solution

_logger = logging.getLogger(__name__)

_SURROGATES = {"bayes": BayesianQuadratic, "fm": FactorizationMachine}
# Local asks look this many groups away from the incumbent at most, growing each ring from
# at most this many codes of the previous one.
_LOCAL_RADIUS = 3
_LOCAL_FRONTIER = 64


@dataclass(frozen=True)
class _Layout:
    """How one relative search space maps to bits."""

    problem: QUBOProblem | None  # None: nothing to encode
    distributions: dict[str, BaseDistribution]
    space: HierarchicalSearchSpace | None
    n_hierarchical: int  # the first groups come from ``space.encoding``

    @property
    def encoding(self) -> OneHotEncoding:
        assert self.problem is not None
        return self.problem.encoding

    def encode(self, params: Mapping[str, Any]) -> np.ndarray | None:
        """Bits of a trial's params, or ``None`` if they do not fit this layout."""
        enc = self.encoding
        bits = np.zeros(enc.n_bits, dtype=np.uint8)
        for g, name in enumerate(enc.names):
            if g < self.n_hierarchical:
                value = params.get(name)
                if value is None and None not in enc.groups[g]:
                    return None
            else:
                if name not in params:
                    return None
                value = _to_slot(self.distributions[name], enc.groups[g], params[name])
            try:
                bits[enc.bit(g, value)] = 1
            except ValueError:
                return None
        assert self.problem is not None
        return bits if self.problem.is_feasible(bits) else None

    def decode(self, bits: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g, (name, value) in enumerate(zip(self.encoding.names, self.encoding.decode(bits))):
            if g < self.n_hierarchical:
                if value is not None:
                    out[name] = value
            else:
                out[name] = _from_slot(self.distributions[name], value)
        return out


def _slots(name: str, dist: BaseDistribution, float_grid: int | None) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return list(range(len(dist.choices)))
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution):
        if float_grid is None:
            raise ValueError(
                f"QUBOSampler handles categorical and integer parameters, but {name!r} is "
                f"{dist!r}. Pass `discretize_floats=<points per float>` to search it on a grid."
            )
        if dist.step is not None:
            count = int(round((dist.high - dist.low) / dist.step)) + 1
            index = np.unique(np.round(np.linspace(0, count - 1, min(count, float_grid))))
            return [float(dist.low + i * dist.step) for i in index]
        if dist.log:
            return [float(v) for v in np.geomspace(dist.low, dist.high, float_grid)]
        return [float(v) for v in np.linspace(dist.low, dist.high, float_grid)]
    raise TypeError(f"Unsupported distribution {dist!r} for {name!r}.")


def _to_slot(dist: BaseDistribution, slots: Sequence[Any], value: Any) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return int(dist.to_internal_repr(value))
    if isinstance(dist, FloatDistribution):
        grid = np.log(slots) if dist.log else np.asarray(slots)
        v = math.log(value) if dist.log else float(value)
        return slots[int(np.argmin(np.abs(grid - v)))]
    return int(value)


def _local_codes(
    problem: QUBOProblem, centre: np.ndarray, seen: Sequence[np.ndarray], rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """The unseen feasible codes of the smallest ring around ``centre`` (codes that differ
    in 1, 2, ... groups, up to ``_LOCAL_RADIUS``) that has any, and that ring's radius;
    ``(empty, 0)`` when none has. Rings beyond the first are grown from at most
    ``_LOCAL_FRONTIER`` codes of the previous one, drawn at random."""
    known = {np.asarray(c, dtype=np.uint8).tobytes() for c in seen}
    frontier, reached = [centre], {centre.tobytes()}
    for radius in range(1, _LOCAL_RADIUS + 1):
        ring = problem.neighbours(frontier, exclude=reached)
        fresh = [c for c in ring if c.tobytes() not in known]
        if fresh:
            return np.array(fresh, dtype=np.uint8), radius
        reached |= {c.tobytes() for c in ring}
        frontier = ring
        if len(frontier) > _LOCAL_FRONTIER:
            pick = rng.choice(len(frontier), _LOCAL_FRONTIER, replace=False)
            frontier = [frontier[int(i)] for i in pick]
    return np.zeros((0, problem.n_bits), dtype=np.uint8), 0


def _local_solution(
    layout: _Layout,
    model: QuadraticModel,
    centre: np.ndarray,
    seen: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> tuple[Solution | None, int]:
    """The unseen codes of the nearest ring around ``centre``, best draw first, and the
    ring's radius; ``(None, 0)`` when no ring within ``_LOCAL_RADIUS`` has one."""
    from qubo import Solution

    assert layout.problem is not None
    near, radius = _local_codes(layout.problem, centre, seen, rng)
    if not len(near):
        return None, 0
    energies = model.energy(near)
    rank = np.argsort(energies, kind="stable")
    return Solution(near[rank], energies[rank], {"n_local": len(near)}), radius


def _pooled(
    problem: QUBOProblem,
    posterior: BayesianPosterior,
    model: QuadraticModel,
    annealed: Solution,
    centre: np.ndarray,
    seen: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> tuple[Solution, int]:
    """The draw's annealed codes and the unseen codes of the nearest ring around ``centre``,
    highest expected improvement under the posterior first (energies: the draw's), and the
    ring's radius if a ring code leads, else 0.

    The draw proposes where the posterior may be low far from the data; the ring, the
    incumbent's neighbours, which a draw's minimum rarely is. The expected improvement then
    weighs both on one scale, so how often an ask refines the incumbent follows the data.
    """
    from qubo import Solution

    near, radius = _local_codes(problem, centre, seen, rng)
    pool = np.concatenate([annealed.codes, near]) if len(near) else annealed.codes
    if not len(pool):
        return annealed, 0
    _, first = np.unique(pool, axis=0, return_index=True)
    pool = pool[np.sort(first)]
    score = posterior.log_expected_improvement(pool)
    rank = np.argsort(-score, kind="stable")
    info = dict(annealed.info, n_local=len(near), n_pool=len(pool))
    info["log_ei"] = float(score[rank[0]])
    leads_local = any(np.array_equal(pool[rank[0]], c) for c in near)
    return Solution(pool[rank], model.energy(pool[rank]), info), radius if leads_local else 0


def _believed(
    codes: np.ndarray, values: np.ndarray, fantasies: np.ndarray, predicted: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` and ``values`` with each of ``fantasies`` observed at ``predicted``, which
    is on the standardised scale of ``values`` (the scale the surrogates fit)."""
    std = float(values.std())
    guess = float(values.mean()) + (std if std > 0 else 1.0) * np.asarray(predicted)
    return np.concatenate([codes, fantasies]), np.concatenate([values, guess])


def _from_slot(dist: BaseDistribution, slot: Any) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(slot)]
    if isinstance(dist, IntDistribution):
        return int(slot)
    return float(slot)


# ParEGO's augmentation: the weighted sum's share beside the weighted maximum, so that weakly
# dominated points do not tie with the points that dominate them.
PAREGO_RHO = 0.05


def parego_scalarise(values: np.ndarray, rng: np.random.Generator) -> list[float]:
    """One value per row of ``values`` (rows: trials, columns: objectives to minimise), the
    augmented Chebyshev scalarisation of ParEGO with a weight vector drawn uniformly from the
    simplex; a single objective is returned as it is (no draw)."""
    if values.ndim != 2 or values.shape[1] == 1:
        return [float(v) for v in values.reshape(-1)]
    low, high = values.min(axis=0), values.max(axis=0)
    normalised = (values - low) / np.where(high > low, high - low, 1.0)
    weights = rng.dirichlet(np.ones(values.shape[1]))
    weighted = normalised * weights
    return [float(v) for v in weighted.max(axis=1) + PAREGO_RHO * weighted.sum(axis=1)]


class QUBOSampler(ArchitectureSampler):
    """Surrogate-to-QUBO search with simulated annealing for small discrete spaces.

    Combines FMQA (factorization machine + annealing) and BOCS (Bayesian second-order model
    with Thompson sampling + annealing as acquisition optimiser). Several objectives are
    searched as ParEGO does (Knowles 2006): each ask draws a weight vector uniformly from the
    simplex and fits the surrogate to the augmented Chebyshev scalarisation of the objectives
    (each normalised to [0, 1] over the complete trials), so successive asks aim at different
    parts of the Pareto front.

    Args:
        seed: Seed of the random start-up trials, the surrogate draws and the annealer.
        n_startup_trials: Random trials before the surrogate takes over.
        max_binary_variables: Largest one-hot encoding accepted; beyond it the first ask that
            sees the space raises ``ValueError`` naming both numbers.
        solver: Any ``dimod.Sampler``; ``dwave.samplers.SimulatedAnnealingSampler`` by default.
        surrogate: ``"bayes"`` (default: ``qubo.BayesianQuadratic(exploration=0.5)``, a
            Bayesian pairwise model with tempered Thompson sampling), ``"fm"``
            (``qubo.FactorizationMachine``) or a ``qubo.Surrogate`` instance. The default and
            ``n_startup_trials=5`` had the lowest regret at 50 and 100 trials in
            ``bench/qubo_regret.py``.
        num_reads: Samples per ask from the solver.
        solver_kwargs: Extra keyword arguments for ``solver.sample`` (e.g. ``num_sweeps``).
        budgets: Linear resource budgets (``qubo.LinearBudget``) over ``(param, value)``
            costs; for non-hierarchical categorical parameters use the choice, for integers
            the value.
        evaluated_penalty: Strength of the BQM penalty against evaluated codes (in units of
            the surrogate's spread over them); evaluated codes are never returned anyway.
        discretize_floats: Grid points per float parameter; ``None`` (default) rejects floats.
        independent_sampler: Sampler for parameters outside the relative search space;
            ``RandomSampler(seed=seed)`` by default.
        constraints_func: Optional function of a finished ``FrozenTrial`` returning its
            constraint values (feasible when all are <= 0), stored as Optuna's own samplers
            store it; ``trial.set_constraint`` values are used the same way.
        threads: BLAS/OpenMP threads of an ask (fit and annealing), set with
            ``threadpoolctl`` while it runs; one by default, as asks run beside training.
        fantasize_running: Fit the objective surrogate and the feasibility model as if each
            RUNNING trial had already returned what they predict for its code (a kriging
            believer, the model-based counterpart of ``TPESampler(constant_liar=True)``), so
            that parallel workers spread their asks instead of crowding where one already
            evaluates. Off by default: with 16 simulated workers on the digits and
            NAS-Bench-201 budgets (``bench/async_budget.py``) it did not lower the regret,
            and a running trial's code is never proposed again either way. Without running
            trials it changes nothing.

    The surrogate never sees raw objective values: it is fitted to the normal scores of the
    order of the complete trials, feasible ones by value first, then infeasible ones by total
    constraint violation. Any strictly monotone transform of the objective (a log, a penalty
    of 5 or 1e6 on infeasible points) therefore proposes the same codes, and the surrogate
    models feasibility along with the objective: codes like the infeasible ones score badly
    in the BQM.

    A proposal is claimed in the storage before it is returned (``hpcnas:samplers:proposal``,
    checked against the trials that proposed meanwhile, the next-best code taken if another
    worker holds it), so parallel workers do not evaluate one code twice.

    Sampling facts (fit and solve time, feasibility rate, BQM size, fallback, the proposed
    params, which other workers read before the trial suggests them) go to the trial system
    attribute ``hpcnas:qubo:info``.

    Examples:
        >>> import optuna
        >>> from optuna_hpcnas.samplers import QUBOSampler
        >>> def objective(trial):
        ...     a = trial.suggest_categorical("a", ["x", "y", "z"])
        ...     b = trial.suggest_int("b", 0, 3)
        ...     return {"x": 1.0, "y": 0.0, "z": 2.0}[a] + (b - 2) ** 2
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study(sampler=QUBOSampler(seed=0, n_startup_trials=4))
        >>> study.optimize(objective, n_trials=12)
        >>> study.best_value
        0.0
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = 5,
        max_binary_variables: int = 256,
        solver: dimod.Sampler | None = None,
        surrogate: str | Surrogate = "bayes",
        num_reads: int = 32,
        solver_kwargs: Mapping[str, Any] | None = None,
        budgets: Sequence[LinearBudget] = (),
        evaluated_penalty: float = 0.1,
        discretize_floats: int | None = None,
        independent_sampler: BaseSampler | None = None,
        constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
        threads: int = 1,
        fantasize_running: bool = False,
    ) -> None:
        if constraints_func is not None and not callable(constraints_func):
            raise TypeError(f"`constraints_func` must be callable, but got {constraints_func!r}.")
        self._constraints_func = constraints_func
        if seed is not None:
            check_int("seed", seed, 0)
        check_int("n_startup_trials", n_startup_trials, 0)
        check_int("max_binary_variables", max_binary_variables, 1)
        check_int("num_reads", num_reads, 1)
        check_int("threads", threads, 1)
        check_bool("fantasize_running", fantasize_running)
        self._fantasize = fantasize_running
        self._threads = AskThreads(threads)
        if discretize_floats is not None:
            check_int("discretize_floats", discretize_floats, 2)
        if isinstance(surrogate, str):
            if surrogate not in _SURROGATES:
                raise ValueError(
                    f"`surrogate` is {surrogate!r}, but must be one of {sorted(_SURROGATES)} "
                    "or a qubo.Surrogate."
                )
            model: Surrogate = _SURROGATES[surrogate]()
        elif isinstance(surrogate, Surrogate):
            model = surrogate
        else:
            raise TypeError(f"`surrogate` must be a str or qubo.Surrogate, got {surrogate!r}.")
        if solver is not None and not callable(getattr(solver, "sample", None)):
            raise TypeError(f"`solver` must be a dimod.Sampler, but got {solver!r}.")
        if isinstance(evaluated_penalty, bool) or not float(evaluated_penalty) >= 0:
            raise ValueError(f"`evaluated_penalty` is {evaluated_penalty!r}, but must be >= 0.")
        for budget in budgets:
            if not isinstance(budget, LinearBudget):
                raise TypeError(f"`budgets` must hold qubo.LinearBudget, but got {budget!r}.")
        self._seed = seed if seed is not None else int(np.random.default_rng().integers(2**31))
        self._n_startup_trials = n_startup_trials
        self._max_bits = max_binary_variables
        self._solver = solver
        self._surrogate = model
        # Feasibility is predicted by the posterior mean: exploration comes from the
        # objective's draw, and a noisy budget only moves the search off the boundary.
        self._feasibility = BayesianQuadratic(exploration=0.0)
        self._num_reads = num_reads
        self._solver_kwargs = dict(solver_kwargs or {})
        self._budgets = tuple(budgets)
        self._evaluated_penalty = float(evaluated_penalty)
        self._float_grid = discretize_floats
        self._independent = independent_sampler or PerTrialRandomSampler(self._seed)
        self._intersection = IntersectionSearchSpace()
        self._space_cache: tuple[str, HierarchicalSearchSpace] | None = None
        # Codes of finished trials for the current layout; finished params never change.
        self._code_cache: tuple[Any, dict[int, np.ndarray | None]] = (None, {})
        self._late = _proposals.LateProposals()

    def reseed_rng(self) -> None:
        self._seed = int(np.random.default_rng().integers(2**31))
        self._independent.reseed_rng()

    # ------------------------------------------------------------------ search space
    def _hierarchical_space(self, study: optuna.Study) -> HierarchicalSearchSpace | None:
        attrs = study._storage.get_study_system_attrs(study._study_id)
        text = attrs.get(_keys.SEARCH_SPACE)
        if text is None:
            return None
        if self._space_cache is None or self._space_cache[0] != text:
            self._space_cache = (text, HierarchicalSearchSpace.from_json(text))
        return self._space_cache[1]

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        out: dict[str, BaseDistribution] = {}
        space = self._hierarchical_space(study)
        if space is not None:
            out.update(space.distributions())
        for name, dist in self._intersection.calculate(study).items():
            if name not in out and not dist.single():
                out[name] = dist
        return out

    def _layout(
        self, study: optuna.Study, search_space: Mapping[str, BaseDistribution]
    ) -> _Layout:
        space = self._hierarchical_space(study)
        names: list[str] = []
        groups: list[list[Any]] = []
        forbidden: list[tuple[int, ...]] = []
        n_hier = 0
        if space is not None and all(n in search_space for n in space.encoding.names):
            names += list(space.encoding.names)
            groups += [list(g) for g in space.encoding.groups]
            n_hier = len(names)
        else:
            space = None
        extras = sorted(n for n in search_space if n not in names)
        for name in extras:
            dist = search_space[name]
            if dist.single():
                continue
            names.append(name)
            groups.append(_slots(name, dist, self._float_grid))
        n_bits = sum(len(g) for g in groups)
        if n_bits > self._max_bits:
            raise ValueError(
                f"The search space needs {n_bits} binary variables (one-hot encoding of "
                f"{len(names)} parameters), more than `max_binary_variables`={self._max_bits}. "
                "QUBOSampler is meant for small spaces: shrink the space or raise the limit."
            )
        enc = OneHotEncoding(names, groups)
        if space is not None:
            forbidden = self._hierarchical_constraints(space, enc)
        budgets = [self._budget_slots(b, enc, search_space, n_hier) for b in self._budgets]
        problem = QUBOProblem(enc, forbidden=forbidden, budgets=budgets) if n_bits else None
        return _Layout(problem, dict(search_space), space, n_hier)

    @staticmethod
    def _hierarchical_constraints(
        space: HierarchicalSearchSpace, enc: OneHotEncoding
    ) -> list[tuple[int, ...]]:
        forbidden: list[tuple[int, ...]] = []
        names = list(enc.names)
        for d in space.decisions:
            if d.parent is None or d.is_constant or d.name not in names:
                continue
            assert d.active_when is not None
            parent = space.decision(d.parent)
            if parent.name in names:
                forbidden += conditional_pairs(enc, d.name, parent.name, d.active_when)
            else:  # a constant parent fixes whether the child applies
                g = names.index(d.name)
                applies = parent.choices[0] in d.active_when
                bad = [None] if applies else [v for v in enc.groups[g] if v is not None]
                forbidden += [(enc.bit(g, v),) for v in bad]
        if space.max_ranks is not None:
            dp, pp = (
                space.decision("cluster.data_parallel"),
                space.decision("cluster.pipeline_stages"),
            )
            for a in dp.choices:
                for b in pp.choices:
                    if int(a) * int(b) > space.max_ranks:
                        bits = [
                            enc.bit(names.index(d.name), v)
                            for d, v in ((dp, a), (pp, b))
                            if d.name in names
                        ]
                        if bits:
                            forbidden.append(tuple(bits))
        return forbidden

    @staticmethod
    def _budget_slots(
        budget: LinearBudget,
        enc: OneHotEncoding,
        search_space: Mapping[str, BaseDistribution],
        n_hier: int,
    ) -> LinearBudget:
        """Re-key a budget from ``(param, value)`` to ``(group, slot)``; unknown params (such
        as constants) cost nothing."""
        names = list(enc.names)
        costs: dict[tuple[str, Any], float] = {}
        for (name, value), cost in budget.costs.items():
            if name not in names:
                continue
            g = names.index(name)
            slot = value if g < n_hier else _to_slot(search_space[name], enc.groups[g], value)
            costs[(name, slot)] = float(cost)
        return LinearBudget(
            budget.name,
            costs=costs,
            limit=budget.limit,
            method=budget.method,
            resolution=budget.resolution,
            strength=budget.strength,
        )

    # ------------------------------------------------------------------ sampling
    def sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        with self._threads.limit():
            return self._sample_relative(study, trial, search_space)

    def _sample_relative(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        layout = self._layout(study, search_space)
        if layout.problem is None:
            return {}
        rng = np.random.default_rng([self._seed, trial.number])
        # Failed, pruned and running codes are not proposed again; only complete ones are fitted.
        trials = study._get_trials(deepcopy=False, states=None, use_cache=True)
        codes, values, busy, running = [], [], [], []
        constraints: list[list[float] | None] = []
        pending = [t._trial_id for t in trials if not t.state.is_finished()]
        signs = np.array([-1.0 if d == StudyDirection.MAXIMIZE else 1.0 for d in study.directions])
        key = (
            id(study._storage),
            study._study_id,
            layout.encoding.names,
            layout.encoding.groups,
            layout.problem.forbidden,
        )
        if self._code_cache[0] != key:
            self._code_cache = (key, {})
        cache = self._code_cache[1]
        for t in trials:
            if t.number == trial.number or t.state == TrialState.WAITING:
                continue
            if t._trial_id in cache:
                bits = cache[t._trial_id]
            else:
                # A running trial may not have suggested yet: use what was proposed for it.
                bits = layout.encode(_proposals.trial_params(t))
                if t.state.is_finished():
                    cache[t._trial_id] = bits
            if bits is None:
                continue
            if (
                t.state == TrialState.COMPLETE
                and t.values is not None
                and all(math.isfinite(v) for v in t.values)
            ):
                codes.append(bits)
                values.append(signs * np.asarray(t.values, dtype=float))
                cons = t.constraints
                constraints.append(list(cons.values()) if cons else None)
            else:
                busy.append(bits)
                if t.state == TrialState.RUNNING:
                    running.append(bits)
        if len(codes) < max(self._n_startup_trials, 1):
            seen = codes + busy
            randoms = self._randoms(layout, rng, seen)
            return self._claim(study, trial, layout, randoms, pending, seen)
        scalar = parego_scalarise(np.array(values), rng)
        constraint = constraint_target(constraints)
        # With a feasibility surrogate the objective one learns from every complete trial;
        # without one, infeasible trials rank last in the objective's own target.
        keys = feasibility_keys(
            scalar, constraints if constraint is None else [None] * len(scalar)
        )
        ranked = feasibility_keys(scalar, constraints)  # the incumbent is feasible if any is
        incumbent = min(range(len(ranked)), key=ranked.__getitem__)
        return self._optimise(
            study,
            trial,
            layout,
            rng,
            np.array(codes),
            normal_scores(keys),
            busy,
            running,
            pending,
            constraint,
            incumbent,
        )

    def _claim(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        layout: _Layout,
        candidates: Iterator[dict[str, Any]],
        pending: list[int],
        seen: Sequence[np.ndarray],
    ) -> dict[str, Any]:
        """The first candidate whose code no trial read at the start of this ask had and no
        other worker holds (see ``_proposals.claim``)."""

        def key(params: dict[str, Any]) -> Any:
            bits = layout.encode(params)
            return None if bits is None else bits.tobytes()

        known = {bits.tobytes() for bits in seen}
        params, _ = _proposals.claim(
            study._storage, study._study_id, trial, candidates, key, pending, known.__contains__
        )
        self._late.record(trial._trial_id, params)
        return params

    def _randoms(
        self, layout: _Layout, rng: np.random.Generator, seen: list[np.ndarray]
    ) -> Iterator[dict[str, Any]]:
        known = list(seen)
        while True:
            params = self._random(layout, rng, known)
            bits = layout.encode(params)
            if bits is not None:
                known.append(bits)
            yield params

    def _random(
        self, layout: _Layout, rng: np.random.Generator, seen: Sequence[np.ndarray]
    ) -> dict[str, Any]:
        """A uniformly random feasible code (fresh if possible) through ``repair``."""
        enc = layout.encoding
        if layout.space is not None:
            # Draw like ``space.sample`` so start-up trials match the space's own prior.
            arch = layout.space.sample(rng)
            params = dict(layout.space.to_params(arch))
            for name, dist in layout.distributions.items():
                if name not in enc.names[: layout.n_hierarchical] and not dist.single():
                    slots = enc.groups[list(enc.names).index(name)]
                    params[name] = _from_slot(dist, slots[int(rng.integers(len(slots)))])
            return params
        problem = layout.problem
        assert problem is not None
        known = {c.tobytes() for c in seen}
        bits = np.zeros(enc.n_bits, dtype=np.uint8)
        for _ in range(32):
            bits[:] = 0
            for g in range(len(enc.names)):
                s = enc.slice(g)
                bits[s.start + int(rng.integers(s.stop - s.start))] = 1
            if problem.is_feasible(bits) and bits.tobytes() not in known:
                break
        if not problem.is_feasible(bits):
            from qubo import QuadraticModel

            zero = QuadraticModel(np.zeros(enc.n_bits), np.zeros((enc.n_bits, enc.n_bits)))
            bits = problem.repair(bits, zero)
        return layout.decode(bits)

    def _optimise(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        layout: _Layout,
        rng: np.random.Generator,
        codes: np.ndarray,
        values: np.ndarray,
        busy: list[np.ndarray],
        running: list[np.ndarray],
        pending: list[int],
        constraint: tuple[np.ndarray, np.ndarray, float] | None,
        incumbent: int,
    ) -> dict[str, Any]:
        from qubo import solve

        assert layout.problem is not None
        start = time.perf_counter()
        fantasies = np.array(running if self._fantasize else [], dtype=float)
        posterior, model = self._draw(codes, values, fantasies, rng)
        feasibility, threshold = self._draw_feasibility(codes, fantasies, constraint)
        problem = self._with_feasibility(layout, feasibility, threshold)
        fit_time = time.perf_counter() - start
        seen = list(codes) + busy
        solution, radius = None, 0
        if posterior is None and self._is_local(trial, layout, len(codes)):
            solution, radius = _local_solution(layout, model, codes[incumbent], seen, rng)
        if solution is None:
            solution = solve(
                problem,
                model,
                sampler=self._solver,
                evaluated=seen,
                evaluated_penalty=self._evaluated_penalty,
                num_reads=self._num_reads,
                seed=int(rng.integers(2**31)),
                sampler_kwargs=self._solver_kwargs,
            )
        if posterior is not None:
            solution, radius = _pooled(
                layout.problem, posterior, model, solution, codes[incumbent], seen, rng
            )
        info: dict[str, Any] = dict(solution.info)
        info.update(
            {
                "fit_time_s": fit_time,
                "n_bits": layout.encoding.n_bits,
                "n_observations": len(values),
                "surrogate": type(self._surrogate).__name__,
                "step": "local" if radius else "global",
                "fallback": len(solution.codes) == 0,
            }
        )
        if radius:
            info["radius"] = radius
        if len(fantasies):
            info["n_fantasies"] = len(fantasies)
        if not len(solution.codes):
            _logger.info("Trial %d: no new feasible code from the solver; random.", trial.number)
        order = np.arange(len(solution.codes))
        if feasibility is not None and len(order):
            # The BQM saw the linear part of the feasibility draw; rank by all of it.
            ok = feasibility.energy(solution.codes) <= threshold
            order = np.concatenate([order[ok], order[~ok]])
            info["predicted_feasible"] = int(ok.sum())
        decoded = (layout.decode(solution.codes[i]) for i in order)
        randoms = self._randoms(layout, rng, seen)
        params = self._claim(
            study, trial, layout, itertools.chain(decoded, randoms), pending, seen
        )
        info["params"] = params
        claimed = layout.encode(params)
        for i in order:  # the surrogate energy of the claimed code, when the solver found it
            if claimed is not None and np.array_equal(solution.codes[i], claimed):
                info["predicted"] = float(solution.energies[i])
                break
        study._storage.set_trial_system_attr(trial._trial_id, _keys.QUBO_INFO, info)
        return params

    def _draw(
        self,
        codes: np.ndarray,
        values: np.ndarray,
        fantasies: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[BayesianPosterior | None, QuadraticModel]:
        """The surrogate's draw, and its posterior when it has one (``BayesianQuadratic``),
        with each of ``fantasies`` (running codes) believed at the surrogate's prediction: the
        posterior mean, or a first draw for a surrogate without a posterior."""
        if isinstance(self._surrogate, BayesianQuadratic):
            posterior = self._surrogate.fit(codes, values)
            if len(fantasies):
                guess = posterior.predict(fantasies)[0]
                posterior = self._surrogate.fit(*_believed(codes, values, fantasies, guess))
            return posterior, posterior.draw(rng, self._surrogate.exploration)
        if len(fantasies):
            guess = self._surrogate.draw(codes, values, rng).energy(fantasies)
            codes, values = _believed(codes, values, fantasies, guess)
        return None, self._surrogate.draw(codes, values, rng)

    def _draw_feasibility(
        self,
        codes: np.ndarray,
        fantasies: np.ndarray,
        constraint: tuple[np.ndarray, np.ndarray, float] | None,
    ) -> tuple[QuadraticModel | None, float]:
        """The feasibility model (its posterior mean) and the threshold under which it
        predicts a code feasible; ``(None, 0.0)`` without a constraint to learn. Each of
        ``fantasies`` counts as observed at the model's prediction for it."""
        if constraint is None:
            return None, 0.0
        rows, target, threshold = constraint
        x = codes[rows]
        if len(fantasies):
            guess = self._feasibility.fit(x, target).predict(fantasies)[0]
            x, target = _believed(x, target, fantasies, guess)
            # The fit standardises its target again: move the threshold with it.
            mean, std = float(target.mean()), float(target.std()) or 1.0
            target, threshold = (target - mean) / std, (threshold - mean) / std
        return self._feasibility.fit(x, target).mean(), threshold

    def _is_local(self, trial: FrozenTrial, layout: _Layout, n_complete: int) -> bool:
        """Whether this ask refines the incumbent instead of annealing, for a
        surrogate without a posterior (with one, every ask anneals and ``_pooled`` weighs
        the annealed codes against the incumbent's ring).

        A draw's global minimum lies where the posterior is widest, mostly several groups
        away from every evaluated code, so annealing alone rarely tries the incumbent's
        neighbours: every other ask does. Only after as many global asks as there are
        groups: before, the incumbent is one of a few draws and a local search around it is
        premature (with a penalised black box it is often infeasible, and one stays there).
        """
        start = self._n_startup_trials + len(layout.encoding.names)
        return n_complete >= start and trial.number % 2 == 1

    @staticmethod
    def _with_feasibility(
        layout: _Layout, model: QuadraticModel | None, threshold: float
    ) -> QUBOProblem:
        """The layout's problem plus a budget from the linear part of a feasibility draw:
        ``sum(linear of the chosen bits) <= threshold`` (pairs inside a group vanish on
        codes, pairs across groups are left to the ranking after decoding); the problem
        alone without a draw."""
        problem = layout.problem
        assert problem is not None
        if model is None:
            return problem
        enc = layout.encoding
        costs = {
            (name, value): float(model.linear[enc.bit(g, value)])
            for g, name in enumerate(enc.names)
            for value in enc.groups[g]
        }
        learned = LinearBudget("feasibility", costs=costs, limit=float(threshold))
        try:
            return QUBOProblem(
                enc, forbidden=problem.forbidden, budgets=[*problem.budgets, learned]
            )
        except ValueError:  # the draw finds no code feasible: leave the BQM as it is
            return problem

    def _check_independent(self, param_name: str, param_distribution: BaseDistribution) -> None:
        if isinstance(param_distribution, FloatDistribution) and self._float_grid is None:
            _slots(param_name, param_distribution, None)  # raises the float error

    def _late_proposal(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """A whole proposal for a trial that started before the study recorded its
        hierarchical space (see ``_proposals.LateProposals``); ``None`` without one."""
        if self._hierarchical_space(study) is None:
            return None
        return self.sample_relative(study, trial, self.infer_relative_search_space(study, trial))
