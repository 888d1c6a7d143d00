"""``EvolutionarySampler``: steady-state aging (regularized) evolution as an Optuna sampler."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
import itertools
import math
import threading
from typing import Any
from typing import TYPE_CHECKING

import numpy as np
from optuna.samplers import BaseSampler

from optuna_hpcnas import _keys
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.samplers import _proposals
from optuna_hpcnas.samplers._base import ArchitectureSampler
from optuna_hpcnas.samplers._evolution import _variation
from optuna_hpcnas.samplers._evolution._breeding import architecture_key
from optuna_hpcnas.samplers._evolution._breeding import ArchitectureSpace
from optuna_hpcnas.samplers._evolution._breeding import BreedingSpace
from optuna_hpcnas.samplers._evolution._breeding import ParamSpace
from optuna_hpcnas.samplers._evolution._cache import StudyCache
from optuna_hpcnas.samplers._evolution._screening import Features
from optuna_hpcnas.samplers._evolution._screening import screen
from optuna_hpcnas.samplers._evolution._selection import selection_keys
from optuna_hpcnas.samplers._independent import PerTrialRandomSampler
from optuna_hpcnas.samplers._ranking import constraint_target
from optuna_hpcnas.samplers._ranking import normal_scores
from optuna_hpcnas.samplers._threads import AskThreads
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.search_space import Level
from qubo import BayesianQuadratic

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.samplers._evolution._cache import KeyFn
    from optuna_hpcnas.samplers._evolution._cache import Member
    from qubo import Surrogate

# Mutations (then random draws) tried before the next fallback. Few: enumerating the
# parent's neighbours is exact and, on small spaces, cheaper than many blind retries.
_MAX_ATTEMPTS = 4
# Screening pool: random two-decision mutations and random points beside the neighbourhoods
# (they let the surrogate leave a local optimum), and a cap for very large neighbourhoods;
# the sizes were tuned on NAS-Bench-201 cifar10 (docs/samplers.md).
_POOL_MUTANTS = 128
_POOL_RANDOM = 128
_POOL_MAX = 4_000
# Besides the tournament winner, the neighbourhoods of this many best trials are screened
# (more was worse on NAS-Bench-201 cifar10).
_POOL_PARENTS = 1
# Observations the surrogate is fitted on: the newest (where the search is) and the best so
# far (where it should go), so an ask costs the same at 300 and at 5,000 trials (its fit is
# cubic in their number). Up to _RECENT trials every one is used.
_RECENT = 100
_BEST = 50


def _check_probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"`{name}` must be a float, but got {value!r}.")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"`{name}` is {value}, but must be in [0, 1].")
    return float(value)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, but got {value!r}.")
    return value


class EvolutionarySampler(ArchitectureSampler):
    """Aging (regularized) evolution (Real et al., 2019), steady-state and asynchronous.

    Each new trial takes the newest ``population_size`` finished trials as the population,
    draws ``tournament_size`` of them without replacement, and mutates the winner (optionally
    after a uniform crossover with the winner of a second tournament). There is no generation
    barrier: a free worker gets a child at once, and the oldest trials leave the population as
    new ones finish. The first ``n_startup_trials`` finished trials are random.

    With a :class:`~optuna_hpcnas.HierarchicalSearchSpace` (detected from the study, where
    ``space.suggest`` records it) a mutation changes one decision at one level (topology,
    operator, micro parameter or cluster layout) through ``space.mutate``, so conditional
    parameters stay valid. On any other search space (the intersection of the finished
    trials' distributions) each parameter changes with probability ``1/n`` (at least one): a
    categorical one takes another value, a numerical one a Gaussian move of
    ``mutation_scale`` times its range (in log space for log distributions), clipped and
    snapped to its step. Parameters outside that space come from ``independent_sampler``.

    Selection: feasible trials (all ``trial.set_constraint`` values <= 0) beat infeasible ones,
    which are ordered by their total violation. With one objective the winner has the best
    normalised fitness; with several, the lowest Pareto rank and then the largest crowding
    distance (NSGA-II), both computed over the population.

    Pruned trials (with ``consider_pruned_trials``) take part with the last intermediate
    value they reported, normalised by stage: a member's fitness is its mid-rank quantile in
    [0, 1] (0 the best) among the reference values of its stage, where a complete trial's
    reference values are the objective values of the complete members, and a pruned trial's
    are the intermediate values that the members (complete or pruned, itself included)
    reported at the very step where it stopped. Ties go to the trial that got further
    (complete first). A pruned trial that reported nothing has fitness 1. Without pruned
    trials this ranking is the plain order of the objective values. Multi-objective studies
    have no intermediate values, so there pruned trials rank after every complete one.

    An architecture (or parameter set) already evaluated, running or failed is not proposed
    again while an unseen one-decision neighbour of the parent exists; if none does, the child
    is drawn among the unseen architectures (exactly, for spaces of up to 20,000; by a few
    random draws otherwise) before a duplicate is accepted.

    Surrogate screening (``surrogate="bayes"``, the default): once ``n_startup_trials`` have
    finished, the child is not a blind mutation of the tournament winner but the candidate
    that one Thompson draw of ``qubo.BayesianQuadratic`` ranks best among the unseen
    one-decision neighbours of the winner and of the incumbent, a few two-decision mutations
    and a few random points (local search with the full neighbourhood, White et al. 2021;
    surrogate-screened mutation, BANANAS). The surrogate is fitted to normal scores of the
    order of the finished trials (feasible by value, then infeasible by violation), so any
    strictly monotone transform of the objective, such as a large penalty on infeasible
    points, proposes the same children. ``surrogate=None`` is plain aging evolution.

    Every child's origin (operation, parents, mutated level and parameters) is written to the
    trial system attribute ``hpcnas:evolution:origin``; the population is rebuilt from the
    storage, so several workers on one RDB study, or a restarted process, agree without
    talking. The random stream of each trial is derived from ``seed`` and the trial number:
    with a seed, a study is reproducible, also across processes. Enqueued trials
    (``study.enqueue_trial``) keep their parameters; the others are drawn by the
    independent sampler.

    Args:
        population_size: Number of newest finished trials that form the population (>= 2).
        tournament_size: Trials drawn per tournament (1 <= S <= ``population_size``; default
            ``max(2, population_size // 4)``).
        crossover_prob: Probability that a child is a crossover of two tournament winners
            (then mutated).
        mutation_scale: Standard deviation of numerical moves, as a fraction of the range.
        level_weights: Relative probability of mutating each level of a hierarchical space
            (keys: ``"topology"``, ``"operator"``, ``"micro"``, ``"cluster"``); by default
            a decision is drawn uniformly among those that can change.
        n_startup_trials: Random trials before evolution starts (default:
            ``max(2, population_size // 2)``; the population fills up while it evolves).
        consider_pruned_trials: Whether pruned trials enter the population.
        avoid_duplicates: Whether to avoid proposing a seen candidate again.
        independent_sampler: Sampler for parameters outside the relative search space
            (default: :class:`~optuna.samplers.RandomSampler`).
        surrogate: ``"bayes"`` (default: Thompson samples of
            ``qubo.BayesianQuadratic(exploration=1.0)`` screen the candidate children), a
            ``qubo.Surrogate`` instance, or ``None`` (blind mutation).
        constraints_func: Optional function of a finished ``FrozenTrial`` returning its
            constraint values (feasible when all are <= 0), evaluated after each complete or
            pruned trial and stored as Optuna's own samplers store it; constraints set with
            ``trial.set_constraint`` are used the same way.
        threads: BLAS/OpenMP threads of an ask (surrogate fit and screening), set with
            ``threadpoolctl`` while it runs. One by default: in the main job asks run beside
            training, where more threads only fight torch's; a process that only samples
            may give its share of the cores.
        seed: Seed of the random streams.

    Examples:
        >>> import optuna
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> from optuna_hpcnas.samplers import EvolutionarySampler
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> def objective(trial):
        ...     arch = space.suggest(trial)
        ...     return sum(c.width or 0 for c in arch.cells)
        >>> study = optuna.create_study(sampler=EvolutionarySampler(population_size=8, seed=0))
        >>> study.optimize(objective, n_trials=30)
        >>> study.best_value <= 48
        True
    """

    def __init__(
        self,
        *,
        population_size: int = 20,
        tournament_size: int | None = None,
        crossover_prob: float = 0.0,
        mutation_scale: float = 0.1,
        level_weights: Mapping[str | Level, float] | None = None,
        n_startup_trials: int | None = None,
        consider_pruned_trials: bool = True,
        avoid_duplicates: bool = True,
        independent_sampler: BaseSampler | None = None,
        surrogate: str | Surrogate | None = "bayes",
        constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
        threads: int = 1,
        seed: int | None = None,
    ) -> None:
        check_int("population_size", population_size, 2)
        self._population_size = int(population_size)
        if tournament_size is None:
            tournament_size = max(2, self._population_size // 4)
        check_int("tournament_size", tournament_size, 1)
        self._tournament_size = int(tournament_size)
        if self._tournament_size > self._population_size:
            raise ValueError(
                f"`tournament_size` is {tournament_size}, but must be <= `population_size` "
                f"({population_size})."
            )
        self._crossover_prob = _check_probability("crossover_prob", crossover_prob)
        if isinstance(mutation_scale, bool) or not isinstance(mutation_scale, (int, float)):
            raise TypeError(f"`mutation_scale` must be a float, but got {mutation_scale!r}.")
        if not (0.0 < float(mutation_scale) <= 1.0):
            raise ValueError(f"`mutation_scale` is {mutation_scale}, but must be in (0, 1].")
        self._mutation_scale = float(mutation_scale)
        self._level_weights = self._check_level_weights(level_weights)
        if n_startup_trials is None:
            n_startup_trials = max(2, self._population_size // 2)
        check_int("n_startup_trials", n_startup_trials, 1)
        self._n_startup_trials = int(n_startup_trials)
        self._consider_pruned = _check_bool("consider_pruned_trials", consider_pruned_trials)
        self._avoid_duplicates = _check_bool("avoid_duplicates", avoid_duplicates)
        if independent_sampler is not None and not isinstance(independent_sampler, BaseSampler):
            raise TypeError(
                f"`independent_sampler` must be a BaseSampler, but got {independent_sampler!r}."
            )
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
        ):
            raise TypeError(f"`seed` must be an int or None, but got {seed!r}.")
        self._surrogate = self._check_surrogate(surrogate)
        # Feasibility is predicted by the posterior mean: exploration comes from the
        # objective's draw, and a noisy prediction only moves the search off the boundary.
        self._feasibility: Surrogate = BayesianQuadratic(exploration=0.0)
        if constraints_func is not None and not callable(constraints_func):
            raise TypeError(f"`constraints_func` must be callable, but got {constraints_func!r}.")
        self._constraints_func = constraints_func
        check_int("threads", threads, 1)
        self._threads = AskThreads(int(threads))
        self._seed = self._entropy(seed)
        self._independent = independent_sampler or PerTrialRandomSampler(self._seed)
        self._lock = threading.Lock()
        self._caches: dict[tuple[int, int], StudyCache] = {}
        self._late = _proposals.LateProposals()

    @staticmethod
    def _check_surrogate(surrogate: Any) -> Surrogate | None:
        from qubo import BayesianQuadratic
        from qubo import Surrogate

        if surrogate is None or isinstance(surrogate, Surrogate):
            return surrogate
        if surrogate == "bayes":
            # A plain Thompson sample (exploration 1): on the tuning benchmarks (30 seeds,
            # regret@100) it beat the tempered 0.5 on 7 of 9 variants, e.g. NAS-Bench-201
            # cifar10 0.048 against 0.109 (60 seeds), being stuck in a second basin less often.
            return BayesianQuadratic(exploration=1.0)
        if isinstance(surrogate, str):
            raise ValueError(
                f"`surrogate` is {surrogate!r}, but must be 'bayes', a qubo.Surrogate or None."
            )
        raise TypeError(f"`surrogate` must be a str, qubo.Surrogate or None, got {surrogate!r}.")

    @staticmethod
    def _check_level_weights(
        weights: Mapping[str | Level, float] | None,
    ) -> dict[Level, float] | None:
        if weights is None:
            return None
        if not isinstance(weights, Mapping):
            raise TypeError(f"`level_weights` must be a mapping, but got {weights!r}.")
        out: dict[Level, float] = {}
        for key, value in weights.items():
            try:
                level = Level(key)
            except ValueError:
                raise ValueError(
                    f"`level_weights` has key {key!r}, but keys must be among "
                    f"{[lv.value for lv in Level]}."
                ) from None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"`level_weights[{key!r}]` must be a float, but got {value!r}.")
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"`level_weights[{key!r}]` is {value}, but must be >= 0.")
            out[level] = float(value)
        if sum(out.values()) <= 0:
            raise ValueError(f"`level_weights` is {dict(weights)!r}, but must not sum to zero.")
        return out

    @staticmethod
    def _entropy(seed: int | None) -> int:
        if seed is None:
            return int(np.random.SeedSequence().entropy) % 2**63  # type: ignore[arg-type]
        return int(seed) % 2**63

    # ------------------------------------------------------------------ lifecycle
    def reseed_rng(self) -> None:
        self._seed = self._entropy(None)
        self._independent.reseed_rng()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_caches"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _rng(self, number: int) -> np.random.Generator:
        return np.random.default_rng([self._seed, number])

    def _cache(self, study: Study) -> StudyCache:
        storage, study_id = study._storage, study._study_id
        key = (id(storage), study_id)
        cache = self._caches.get(key)
        if cache is None or cache.storage is not storage:
            cache = StudyCache(storage, study_id, consider_pruned=self._consider_pruned)
            self._caches[key] = cache
        if not cache.space_final:
            cache.space = HierarchicalSearchSpace.from_study(study)
            # The first `space.suggest` records the space before any trial can finish.
            cache.space_final = cache.space is not None or cache.n_finished > 0
            if cache.space is not None:
                cache.space_distributions = dict(cache.space.distributions())
                cache.space_cardinality = cache.space.cardinality()
        return cache

    # ------------------------------------------------------------------ search space
    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        with self._lock:
            cache = self._cache(study)
            if cache.space_distributions is not None:
                return dict(cache.space_distributions)
            cache.update(trial.number, self._population_size)
            return dict(cache.intersection or {})

    def _late_proposal(self, study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """A whole child for a trial that started before the study recorded its
        hierarchical space (see ``_proposals.LateProposals``); ``None`` without one."""
        with self._lock:
            cache = self._cache(study)
            space = dict(cache.space_distributions or {})
        return self.sample_relative(study, trial, space) if space else None

    # ------------------------------------------------------------------ sampling
    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}
        with self._lock, self._threads.limit():
            cache = self._cache(study)
            space = cache.space
            hierarchical = space is not None and set(search_space) == set(
                cache.space_distributions or {}
            )
            signature: Hashable
            if hierarchical:
                assert space is not None
                key_fn, signature = architecture_key(space), id(space)
            else:
                key_fn = _variation.params_key_function(dict(search_space))
                signature = frozenset(search_space.items())
            if self._avoid_duplicates:
                cache.use_keys(signature, key_fn)
            cache.update(trial.number, self._population_size)
            rng = self._rng(trial.number)
            breeding = self._breeding(
                cache, space if hierarchical else None, search_space, key_fn, rng
            )
            origin, alternatives = self._child(cache, breeding, rng)
            avoid = breeding.avoid

            def candidates() -> Iterator[dict[str, Any]]:
                yield origin["params"]
                if avoid:
                    yield from alternatives

            params, skipped = _proposals.claim(
                study._storage,
                study._study_id,
                trial,
                ({k: v for k, v in p.items() if k in search_space} for p in candidates()),
                key_fn if avoid else (lambda p: None),
                cache.pending_ids,
                seen=cache.is_seen if avoid else None,
            )
            origin["params"] = params
            if skipped:
                origin["claim_skipped"] = skipped
            if self._avoid_duplicates:
                cache.mark_seen(trial.number, params)
        study._storage.set_trial_system_attr(trial._trial_id, _keys.EVOLUTION_ORIGIN, origin)
        self._late.record(trial._trial_id, params)
        return params

    def _breeding(
        self,
        cache: StudyCache,
        space: HierarchicalSearchSpace | None,
        search_space: dict[str, BaseDistribution],
        key_fn: KeyFn,
        rng: np.random.Generator,
    ) -> BreedingSpace[Any]:
        """Where this ask breeds: ``space`` (hierarchical) or else flat ``search_space``."""
        avoid, attempts = self._avoid_duplicates, _MAX_ATTEMPTS
        if space is not None:
            weights = self._level_weights
            return ArchitectureSpace(
                cache, space, rng, key_fn, avoid=avoid, attempts=attempts, level_weights=weights
            )
        scale = self._mutation_scale
        return ParamSpace(
            cache, search_space, rng, key_fn, avoid=avoid, attempts=attempts, scale=scale
        )

    def _tournament(
        self,
        population: list[Member],
        keys: list[tuple[float, ...]],
        rng: np.random.Generator,
        exclude: int | None = None,
    ) -> int:
        candidates = [i for i in range(len(population)) if i != exclude] or [exclude or 0]
        size = min(self._tournament_size, len(candidates))
        drawn = rng.choice(len(candidates), size=size, replace=False)
        return min((candidates[int(i)] for i in drawn), key=keys.__getitem__)

    def _parents(
        self, cache: StudyCache, rng: np.random.Generator
    ) -> tuple[Member, Member | None] | None:
        """Tournament winner(s), or ``None`` while the study is still in its random start."""
        if cache.n_finished < self._n_startup_trials:
            return None
        population = cache.population(self._population_size)
        if not population:
            return None
        keys = selection_keys(population, cache.directions)
        first = self._tournament(population, keys, rng)
        second = None
        if len(population) >= 2 and rng.random() < self._crossover_prob:
            second = population[self._tournament(population, keys, rng, exclude=first)]
        return population[first], second

    def _child(
        self, cache: StudyCache, breeding: BreedingSpace[Any], rng: np.random.Generator
    ) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
        """The child's origin record and, lazily, unseen alternatives in order of preference
        (for a claim that finds the child taken by another worker)."""
        origin = _random_origin()
        parents = self._parents(cache, rng)
        parent = None if parents is None else breeding.parent(parents[0])
        if parents is None or parent is None:
            origin["params"] = breeding.random()
            return origin, breeding.tail()
        first, second = parents
        if self._surrogate is not None and second is None:
            screened = self._screened(cache, first, breeding, rng)
            if screened is not None:
                origin.update(operation="screened", parent=first.number, params=screened[0])
                return origin, itertools.chain(screened[1:], breeding.after_screening())
        base = parent
        origin.update(operation="mutation", parent=first.number)
        if second is not None:
            crossed = breeding.crossover(parent, second)
            if crossed is not None:
                base = crossed
                origin.update(operation="crossover", second_parent=second.number)
        fresh = breeding.neighbours(parent)
        order = [fresh[int(i)] for i in rng.permutation(len(fresh))]
        for _ in range(breeding.mutation_attempts):
            params, level = breeding.mutate(base)
            if breeding.unseen(params):
                origin.update(level=level, params=params)
                return origin, itertools.chain(order, breeding.tail())
        if order:
            origin.update(operation="neighbour", params=order[0])
            return origin, itertools.chain(order[1:], breeding.tail())
        # No unseen child of the parents: an unseen candidate drawn exactly or at random.
        origin = _random_origin()
        tail = breeding.tail()
        origin["params"] = next(tail)
        return origin, tail

    def _screened(
        self,
        cache: StudyCache,
        winner: Member,
        breeding: BreedingSpace[Any],
        rng: np.random.Generator,
    ) -> list[dict[str, Any]] | None:
        """Unseen candidates around the winner and the incumbent, best surrogate draw first;
        ``None`` when there is nothing to screen."""
        assert self._surrogate is not None
        directions = cache.directions
        members = cache.window(_RECENT, _BEST, lambda ms: selection_keys(ms, directions))
        if len(members) < 2:
            return None
        keys = [k[:-1] for k in selection_keys(members, cache.directions)]  # age is no merit
        best = sorted(range(len(members)), key=keys.__getitem__)[:_POOL_PARENTS]
        pool: dict[Hashable, dict[str, Any]] = {}

        def add(params: dict[str, Any]) -> None:
            key = breeding.key(params)
            if key is not None and key not in pool and not breeding.seen(key):
                pool[key] = params

        parents = {winner.number: winner, **{members[i].number: members[i] for i in best}}
        for member in parents.values():
            for params in breeding.around(dict(member.params)):
                add(params)
        for _ in range(_POOL_MUTANTS):
            add(breeding.mutant(dict(winner.params)))
        for _ in range(_POOL_RANDOM):
            add(breeding.pool_random())
        candidates = list(pool.values())
        if len(candidates) > _POOL_MAX:
            candidates = [candidates[int(i)] for i in rng.permutation(len(candidates))[:_POOL_MAX]]
        if not candidates:
            return None
        constraint = constraint_target(
            [list(m.constraints.values()) if m.constraints else None for m in members]
        )
        # With a feasibility surrogate the objective one learns from every trial's merit
        # (constraints aside); without one, infeasible trials rank last through the keys.
        scores = normal_scores([k[2:] for k in keys] if constraint is not None else keys)
        return screen(
            self._surrogate,
            Features(breeding.distributions),
            [m.params for m in members],
            scores,
            candidates,
            rng,
            constraint,
            self._feasibility,
        )


def _random_origin() -> dict[str, Any]:
    """The origin record of a child drawn at random; breeding fills in its parents."""
    return {"operation": "random", "parent": None, "second_parent": None, "level": None}
