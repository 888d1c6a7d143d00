"""The two kinds of search space ``EvolutionarySampler`` breeds in, behind one interface.

The sampler's child routine (tournament, surrogate screening, crossover, mutation and the
fallbacks that avoid a seen candidate) is written once against ``BreedingSpace``, as
Optuna's NSGA-II hands child generation to a strategy object. A subclass says how one ask
draws, keys, crosses, mutates and lists the neighbours of candidates (params dicts): on a
``HierarchicalSearchSpace`` (``ArchitectureSpace``) or on flat Optuna distributions
(``ParamSpace``). Variation itself lives in ``_variation.py``.
"""

from __future__ import annotations

from abc import ABC
from abc import abstractmethod
from collections.abc import Hashable
from collections.abc import Iterator
from collections.abc import Mapping
from functools import cached_property
import itertools
from typing import Any
from typing import Generic
from typing import TYPE_CHECKING
from typing import TypeVar

import numpy as np

from optuna_hpcnas.samplers._evolution import _variation
from optuna_hpcnas.search_space import Level

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from optuna_hpcnas.samplers._evolution._cache import KeyFn
    from optuna_hpcnas.samplers._evolution._cache import Member
    from optuna_hpcnas.samplers._evolution._cache import StudyCache
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

# Spaces up to this size are enumerated (once) to draw among unseen architectures exactly.
_ENUMERABLE = 20_000

_Parent = TypeVar("_Parent")


def architecture_key(space: HierarchicalSearchSpace) -> KeyFn:
    """The key of a candidate of ``space``: its active, non-constant parameters identify an
    architecture exactly as its one-hot encoding does (``space.encode``), at a fraction of the
    cost."""
    names = frozenset(space.distributions())

    def key(params: dict[str, Any]) -> Hashable | None:
        # A set of (name, value) pairs: no sort, and the screening keys hundreds a call.
        return frozenset((k, v) for k, v in params.items() if k in names)

    return key


class BreedingSpace(ABC, Generic[_Parent]):
    """One ask's candidates in one search space; ``_Parent`` is the form a parent is varied
    in.

    Args:
        cache: The study's cache (the seen candidates).
        rng: The trial's random stream.
        key: Key of a candidate (``None``: not keyed).
        avoid: Whether seen candidates are avoided.
        attempts: Mutations tried for an unseen child.
        draws: Random draws tried for an unseen candidate.
    """

    distributions: Mapping[str, BaseDistribution]

    def __init__(
        self,
        cache: StudyCache,
        rng: np.random.Generator,
        key: KeyFn,
        *,
        avoid: bool,
        attempts: int,
        draws: int,
    ) -> None:
        self.key = key
        self.avoid = avoid
        self._cache = cache
        self._rng = rng
        self._attempts = attempts
        self._draws = draws

    @property
    def mutation_attempts(self) -> int:
        return self._attempts

    def seen(self, key: Hashable | None) -> bool:
        return self.avoid and self._cache.is_seen(key)

    def unseen(self, params: dict[str, Any]) -> bool:
        return not self.seen(self.key(params))

    def random(self) -> dict[str, Any]:
        """The first unseen of up to ``draws`` random candidates, else the last."""
        params = self._draw()
        for _ in range(self._draws - 1):
            if self.unseen(params):
                break
            params = self._draw()
        return params

    def tail(self) -> Iterator[dict[str, Any]]:
        """The end of a child's alternatives: endless random candidates, so that a claim
        finds a free one while any is left however many the other workers hold."""
        while True:
            yield self.random()

    def after_screening(self) -> Iterator[dict[str, Any]]:
        """The alternatives after the screened candidates."""
        return self.tail()

    def pool_random(self) -> dict[str, Any]:
        """A random candidate for the screening pool."""
        return self.random()

    def neighbours(self, parent: _Parent) -> list[dict[str, Any]]:
        """The unseen candidates one exact step from ``parent`` (none where not listed)."""
        return []

    @abstractmethod
    def _draw(self) -> dict[str, Any]:
        """One random candidate."""

    @abstractmethod
    def parent(self, member: Member) -> _Parent | None:
        """``member`` as a parent (``None`` if it is not a candidate of this space)."""

    @abstractmethod
    def crossover(self, parent: _Parent, second: Member) -> _Parent | None:
        """A crossover of ``parent`` and ``second`` (``None`` if ``second`` is no parent)."""

    @abstractmethod
    def mutate(self, parent: _Parent) -> tuple[dict[str, Any], str | None]:
        """A mutation of ``parent`` and the level it changed (``None``: no level)."""

    @abstractmethod
    def around(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """One-step neighbours of ``params`` for the screening pool."""

    @abstractmethod
    def mutant(self, params: dict[str, Any]) -> dict[str, Any]:
        """A two-step mutation of ``params`` for the screening pool."""


class ArchitectureSpace(BreedingSpace["Architecture"]):
    """A ``HierarchicalSearchSpace``: a mutation changes one decision at one level through
    ``space.mutate``, so conditional parameters stay valid; small spaces are enumerated to
    draw among the unseen architectures exactly."""

    def __init__(
        self,
        cache: StudyCache,
        space: HierarchicalSearchSpace,
        rng: np.random.Generator,
        key: KeyFn,
        *,
        avoid: bool,
        attempts: int,
        level_weights: Mapping[Level, float] | None,
    ) -> None:
        # Once every architecture was seen, avoiding duplicates only costs time.
        avoid = avoid and cache.num_seen < cache.space_cardinality
        super().__init__(cache, rng, key, avoid=avoid, attempts=attempts, draws=attempts + 1)
        self.distributions = dict(cache.space_distributions or {})
        self._space = space
        self._level_weights = level_weights

    @property
    def mutation_attempts(self) -> int:
        # Most of a nearly exhausted space is seen: go to the exact neighbour list sooner.
        crowded = 2 * self._cache.num_seen > self._cache.space_cardinality
        return 1 if crowded else self._attempts

    @cached_property
    def _left(self) -> list[dict[str, Any]]:
        """Every architecture unseen at the first read (small spaces, avoiding duplicates)."""
        if not (self.avoid and self._cache.space_cardinality <= _ENUMERABLE):
            return []
        space, key = self._space, self.key
        return self._cache.unseen(
            lambda: [(key(p), p) for p in map(space.to_params, space.enumerate())]
        )

    def tail(self) -> Iterator[dict[str, Any]]:
        if not self._left:
            yield from super().tail()
            return
        for i in self._rng.permutation(len(self._left)):
            yield dict(self._left[int(i)])

    def pool_random(self) -> dict[str, Any]:
        if not self._left:
            return self.random()
        return dict(self._left[int(self._rng.integers(len(self._left)))])

    def neighbours(self, parent: Architecture) -> list[dict[str, Any]]:
        if not self.avoid:
            return []
        return [p for p in _variation.neighbours(self._space, parent) if self.unseen(p)]

    def _draw(self) -> dict[str, Any]:
        return self._space.to_params(self._space.sample(self._rng))

    def parent(self, member: Member) -> Architecture | None:
        return self._architecture(member.params)

    def crossover(self, parent: Architecture, second: Member) -> Architecture | None:
        other = self._architecture(second.params)
        if other is None:
            return None
        return _variation.crossover_architectures(self._space, parent, other, self._rng)

    def mutate(self, parent: Architecture) -> tuple[dict[str, Any], str | None]:
        space, rng = self._space, self._rng
        params = space.to_params(parent)
        if self._level_weights is not None:
            levels = sorted(
                {
                    space.decision(name).level
                    for name in params
                    if len(space.decision(name).choices) > 1
                },
                key=list(Level).index,
            )
            weights = np.array([self._level_weights.get(lv, 0.0) for lv in levels])
            if weights.sum() > 0:
                level = levels[int(rng.choice(len(levels), p=weights / weights.sum()))]
                try:
                    child = space.mutate(parent, rng, level=level)
                    return space.to_params(child), level.value
                except ValueError:
                    pass  # e.g. no feasible cluster layout at that level
        after = space.to_params(space.mutate(parent, rng))
        changed = [n for n in params if n in after and params[n] != after[n]]
        return after, space.decision(changed[0]).level.value if changed else None

    def around(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        # Neighbour lists are exact and reused (architectures never change).
        key = self.key(params)
        lists = self._cache.neighbour_lists
        if key not in lists:
            arch = self._architecture(params)
            lists[key] = [] if arch is None else _variation.neighbours(self._space, arch)
        return lists[key]

    def mutant(self, params: dict[str, Any]) -> dict[str, Any]:
        first_step = self.around(params)
        if not first_step:
            return params
        step = first_step[int(self._rng.integers(len(first_step)))]
        second_step = self.around(step)
        return second_step[int(self._rng.integers(len(second_step)))] if second_step else step

    def _architecture(self, params: Mapping[str, Any]) -> Architecture | None:
        names = set(self._space.distributions())
        try:
            return self._space.from_params({k: v for k, v in params.items() if k in names})
        except ValueError:
            return None


class ParamSpace(BreedingSpace[dict[str, Any]]):
    """Flat Optuna distributions: each parameter changes with probability ``1/n`` (at least
    one), numerical ones by a Gaussian move of ``scale`` times their range."""

    def __init__(
        self,
        cache: StudyCache,
        distributions: Mapping[str, BaseDistribution],
        rng: np.random.Generator,
        key: KeyFn,
        *,
        avoid: bool,
        attempts: int,
        scale: float,
    ) -> None:
        super().__init__(cache, rng, key, avoid=avoid, attempts=attempts, draws=attempts)
        self.distributions = distributions
        self._scale = scale

    def after_screening(self) -> Iterator[dict[str, Any]]:
        # Four random draws end the screened candidates; a claim that finds every one taken
        # keeps the first.
        return itertools.islice(self.tail(), 4)

    def _draw(self) -> dict[str, Any]:
        return {n: _variation.sample_value(d, self._rng) for n, d in self.distributions.items()}

    def parent(self, member: Member) -> dict[str, Any]:
        return member.params

    def crossover(self, parent: dict[str, Any], second: Member) -> dict[str, Any]:
        return _variation.crossover_params(self.distributions, parent, second.params, self._rng)

    def mutate(self, parent: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        return _variation.mutate_params(self.distributions, parent, self._rng, self._scale), None

    def around(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return _variation.param_neighbours(self.distributions, params, self._rng, self._scale)

    def mutant(self, params: dict[str, Any]) -> dict[str, Any]:
        return _variation.mutate_some(self.distributions, params, self._rng, self._scale, 2)
