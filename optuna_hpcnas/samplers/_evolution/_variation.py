"""Random draws, mutation and crossover: on any Optuna search space, and on a
``HierarchicalSearchSpace`` (one decision at one level, conditional decisions kept valid)."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
import math
from typing import Any
from typing import TYPE_CHECKING

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution

if TYPE_CHECKING:
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace


# ---------------------------------------------------------------------- generic spaces
def _to_python(dist: BaseDistribution, internal: float) -> Any:
    value = dist.to_external_repr(internal)
    if isinstance(dist, IntDistribution):
        return int(value)
    if isinstance(dist, FloatDistribution):
        return float(value)
    return value


def _snap(dist: FloatDistribution | IntDistribution, x: float) -> float:
    """Clip ``x`` into the bounds and onto the step grid."""
    low, high = float(dist.low), float(dist.high)
    step = dist.step
    if step is not None:
        n = math.floor((high - low) / step + 1e-9)
        x = low + min(max(round((x - low) / step), 0), n) * step
    x = min(max(x, low), high)
    if isinstance(dist, IntDistribution):
        x = float(round(x))
    return x


def sample_value(dist: BaseDistribution, rng: np.random.Generator) -> Any:
    """A uniform draw (log-uniform on a log scale), as a Python value."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(rng.integers(len(dist.choices)))]
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        low, high = float(dist.low), float(dist.high)
        if dist.log:
            # Integers widen by half a unit so both ends are as likely as inner values.
            pad = 0.5 if isinstance(dist, IntDistribution) else 0.0
            lo, hi = math.log(max(low - pad, 1e-300)), math.log(high + pad)
            x = math.exp(rng.uniform(lo, hi))
        elif isinstance(dist, IntDistribution) or dist.step is not None:
            step = dist.step if dist.step is not None else 1
            n = math.floor((high - low) / step + 1e-9)
            x = low + int(rng.integers(n + 1)) * step
        else:
            x = rng.uniform(low, high)
        return _to_python(dist, _snap(dist, x))
    raise TypeError(f"Unsupported distribution {dist!r}.")  # pragma: no cover


def mutate_value(
    dist: BaseDistribution, value: Any, rng: np.random.Generator, scale: float
) -> Any:
    """Another value near ``value``: another category, or a Gaussian move of ``scale`` times
    the range (in log space for log distributions), clipped and snapped to the step."""
    if isinstance(dist, CategoricalDistribution):
        current = dist.to_internal_repr(value)
        others = [i for i in range(len(dist.choices)) if i != current]
        if not others:
            return value
        return dist.choices[others[int(rng.integers(len(others)))]]
    assert isinstance(dist, (FloatDistribution, IntDistribution))
    x = float(value)
    low, high = float(dist.low), float(dist.high)
    if dist.log:
        lo, hi = math.log(low), math.log(high)
        y = math.exp(math.log(max(x, low)) + rng.normal(0.0, scale * (hi - lo)))
    else:
        y = x + rng.normal(0.0, scale * (high - low))
    y = _snap(dist, y)
    if y == x and high > low:
        # Discrete moves can round back onto the parent: take one step instead.
        step = float(dist.step) if dist.step is not None else 1.0
        if isinstance(dist, IntDistribution) or dist.step is not None:
            up = x + step <= high and (rng.random() < 0.5 or x - step < low)
            direction = 1.0 if up else -1.0
            y = _snap(dist, x + direction * step)
    return _to_python(dist, y)


def mutate_params(
    space: Mapping[str, BaseDistribution],
    params: Mapping[str, Any],
    rng: np.random.Generator,
    scale: float,
) -> dict[str, Any]:
    """Change each parameter with probability 1/n (at least one); missing ones are drawn."""
    names = list(space)
    child: dict[str, Any] = {}
    flips = rng.random(len(names)) < 1.0 / max(len(names), 1)
    mutable = [i for i, n in enumerate(names) if not _is_fixed(space[n])]
    if mutable and not any(flips[i] for i in mutable):
        flips[mutable[int(rng.integers(len(mutable)))]] = True
    for flip, name in zip(flips, names):
        dist = space[name]
        if name not in params or not _contains(dist, params[name]):
            child[name] = sample_value(dist, rng)
        elif flip:
            child[name] = mutate_value(dist, params[name], rng, scale)
        else:
            child[name] = params[name]
    return child


def crossover_params(
    space: Mapping[str, BaseDistribution],
    first: Mapping[str, Any],
    second: Mapping[str, Any],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Uniform crossover: each parameter from either parent (a fresh draw if neither has it)."""
    child: dict[str, Any] = {}
    for name, dist in space.items():
        options = [p[name] for p in (first, second) if name in p and _contains(dist, p[name])]
        if not options:
            child[name] = sample_value(dist, rng)
        else:
            child[name] = options[int(rng.integers(len(options)))]
    return child


def _is_fixed(dist: BaseDistribution) -> bool:
    return dist.single()


def _contains(dist: BaseDistribution, value: Any) -> bool:
    try:
        return dist._contains(dist.to_internal_repr(value))
    except (ValueError, TypeError):
        return False


def params_key(space: Mapping[str, BaseDistribution], params: Mapping[str, Any]) -> Any:
    """A hashable identity of ``params`` over ``space`` (``None`` when incomplete)."""
    try:
        return tuple((name, space[name].to_internal_repr(params[name])) for name in sorted(space))
    except (KeyError, ValueError, TypeError):
        return None


def params_key_function(
    space: Mapping[str, BaseDistribution],
) -> Callable[[Mapping[str, Any]], Any]:
    """``params_key`` over a fixed ``space``, with categorical indices looked up in dicts
    (the screening pool keys hundreds of candidates per ask)."""
    names = sorted(space)
    lookups: dict[str, dict[Any, int]] = {}
    for name in names:
        dist = space[name]
        if isinstance(dist, CategoricalDistribution):
            table: dict[Any, int] = {}
            try:
                for i, c in enumerate(dist.choices):
                    table.setdefault(c, i)  # the first equal choice wins, as tuple.index
            except TypeError:  # unhashable choices: the generic path
                continue
            lookups[name] = table

    def key(params: Mapping[str, Any]) -> Any:
        out = []
        try:
            for name in names:
                value = params[name]
                found = lookups.get(name)
                index = found.get(value) if found is not None else None
                out.append((name, space[name].to_internal_repr(value) if index is None else index))
        except (KeyError, ValueError, TypeError):
            return None
        return tuple(out)

    return key


def mutate_some(
    space: Mapping[str, BaseDistribution],
    params: Mapping[str, Any],
    rng: np.random.Generator,
    scale: float,
    count: int,
) -> dict[str, Any]:
    """``params`` with ``count`` distinct mutable parameters moved by ``mutate_value``."""
    mutable = [n for n, d in space.items() if not _is_fixed(d) and n in params]
    child = dict(params)
    if not mutable:
        return child
    for i in rng.choice(len(mutable), size=min(count, len(mutable)), replace=False):
        name = mutable[int(i)]
        child[name] = mutate_value(space[name], params[name], rng, scale)
    return child


# ---------------------------------------------------------------------- hierarchical spaces
def _all_values(space: HierarchicalSearchSpace, params: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(params)
    for d in space.decisions:
        if d.is_constant:
            values[d.name] = d.choices[0]
    return values


def _completions(
    space: HierarchicalSearchSpace, given: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    """Every valid params dict that keeps the applicable values of ``given`` and enumerates
    the choices of decisions that start to apply."""
    decisions = space.decisions

    def walk(i: int, values: dict[str, Any]) -> Iterator[dict[str, Any]]:
        while i < len(decisions):
            d = decisions[i]
            active = d.parent is None or (
                d.active_when is not None and values.get(d.parent) in d.active_when
            )
            if active and d.name not in values:
                for choice in d.choices:
                    yield from walk(i + 1, {**values, d.name: choice})
                return
            if not active:
                values = {k: v for k, v in values.items() if k != d.name}
            i += 1
        yield {k: v for k, v in values.items() if not space.decision(k).is_constant}

    yield from walk(0, _all_values(space, given))


def neighbours(space: HierarchicalSearchSpace, arch: Architecture) -> list[dict[str, Any]]:
    """Params of every feasible architecture one decision away from ``arch`` (decisions that
    start to apply take each of their values)."""
    params = space.to_params(arch)
    out: list[dict[str, Any]] = []
    for d in space.decisions:
        if d.is_constant or d.name not in params:
            continue
        for choice in d.choices:
            if choice == params[d.name]:
                continue
            for child in _completions(space, {**params, d.name: choice}):
                if space.max_ranks is None or space.is_feasible(space.from_params(child)):
                    out.append(child)
    return out


def crossover_architectures(
    space: HierarchicalSearchSpace,
    first: Architecture,
    second: Architecture,
    rng: np.random.Generator,
) -> Architecture:
    """Uniform crossover over decisions in suggestion order; a decision that applies takes the
    value of a parent where it applies too (a fresh draw if neither), so the child is valid."""
    a, b = space.to_params(first), space.to_params(second)
    for _ in range(100):
        values = _all_values(space, {})
        for d in space.decisions:
            active = d.parent is None or (
                d.active_when is not None and values.get(d.parent) in d.active_when
            )
            if not active:
                values.pop(d.name, None)
                continue
            if d.is_constant:
                continue
            options = [p[d.name] for p in (a, b) if d.name in p]
            pool = options if options else list(d.choices)
            values[d.name] = pool[int(rng.integers(len(pool)))]
        child = space.from_params(
            {k: v for k, v in values.items() if not space.decision(k).is_constant}
        )
        if space.is_feasible(child):
            return child
    return first


def param_neighbours(
    space: Mapping[str, BaseDistribution],
    params: Mapping[str, Any],
    rng: np.random.Generator,
    scale: float,
    moves: int = 2,
) -> list[dict[str, Any]]:
    """One-parameter changes of ``params``: every other category of a categorical parameter,
    ``moves`` Gaussian moves (``mutate_value``) of a numerical one."""
    if any(name not in params or not _contains(d, params[name]) for name, d in space.items()):
        return []
    out: list[dict[str, Any]] = []
    for name, dist in space.items():
        if _is_fixed(dist):
            continue
        if isinstance(dist, CategoricalDistribution):
            values = [c for c in dist.choices if c != params[name]]
        else:
            values = [mutate_value(dist, params[name], rng, scale) for _ in range(moves)]
        out += [{**params, name: v} for v in values]
    return out
