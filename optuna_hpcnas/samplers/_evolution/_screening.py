"""Surrogate-screened local search: the child is the candidate a surrogate draw ranks best.

After the tournament, EvolutionarySampler gathers the unseen one-decision neighbours of the
tournament winner and of the incumbent (White et al.'s local search neighbourhood), a few
two-decision mutations and random points, and scores them with one Thompson draw of
``qubo.BayesianQuadratic`` fitted to the normal scores of the finished trials' order
(``samplers/_ranking.py``: scale-free and feasibility-aware). That is BANANAS' "many
mutations, evaluate the one the surrogate likes" with the project's own surrogate.

Parameters become features here: a one-hot group per categorical parameter (an inactive
conditional parameter leaves its group empty), one value in [0, 1] per numerical parameter
(log scale where the distribution is), so the quadratic surrogate sees every pairwise
interaction.
"""

from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution

from qubo import Surrogate


class Features:
    """Fixed feature layout of one search space."""

    def __init__(self, space: Mapping[str, BaseDistribution]) -> None:
        self._names = sorted(n for n, d in space.items() if not d.single())
        self._space = dict(space)
        # Categorical values by column (dict lookups: encoding runs over every candidate).
        self._columns: dict[str, dict[Any, int]] = {}
        self._numeric: dict[str, tuple[int, float, float, bool]] = {}
        width = 0
        for name in self._names:
            dist = space[name]
            if isinstance(dist, CategoricalDistribution):
                try:
                    self._columns[name] = {c: width + i for i, c in enumerate(dist.choices)}
                except TypeError:  # unhashable choices: no feature
                    continue
                width += len(dist.choices)
            elif isinstance(dist, (FloatDistribution, IntDistribution)):
                low, high = float(dist.low), float(dist.high)
                if dist.log:
                    low, high = math.log(low), math.log(high)
                self._numeric[name] = (width, low, high, bool(dist.log))
                width += 1
        self.width = width

    def encode(self, params: Mapping[str, Any]) -> np.ndarray:
        x = np.zeros(self.width)
        for name, value in params.items():
            columns = self._columns.get(name)
            if columns is not None:
                try:
                    column = columns.get(value)
                except TypeError:
                    column = None
                if column is not None:  # a value outside the space carries no information
                    x[column] = 1.0
                continue
            numeric = self._numeric.get(name)
            if numeric is not None:
                at, low, high, log = numeric
                v = float(value)
                if log:
                    v = math.log(max(v, 1e-300))
                x[at] = min(max((v - low) / (high - low), 0.0), 1.0) if high > low else 0.0
        return x


def screen(
    surrogate: Surrogate,
    features: Features,
    observed: list[Mapping[str, Any]],
    scores: np.ndarray,
    candidates: list[dict[str, Any]],
    rng: np.random.Generator,
    constraint: tuple[np.ndarray, np.ndarray, float] | None = None,
    feasibility: Surrogate | None = None,
) -> list[dict[str, Any]]:
    """``candidates`` sorted by one surrogate draw fitted to ``(observed, scores)`` (lower
    scores are better); the surrogate's own ``draw`` supplies the exploration.

    With ``constraint`` (``samplers/_ranking.constraint_target`` over ``observed``), a second
    surrogate (``feasibility``, by default ``surrogate`` again) predicts the worst constraint
    value: candidates predicted
    feasible come first (by objective), then the others by predicted violation. This is
    Thompson sampling for constrained optimisation with the project's one surrogate.
    """
    x = np.array([features.encode(p) for p in observed])
    cand = np.array([features.encode(p) for p in candidates])
    energy = surrogate.draw(x, scores, rng).energy(cand)
    order = np.argsort(energy, kind="stable")
    if constraint is not None:
        rows, target, threshold = constraint
        model = feasibility if feasibility is not None else surrogate
        predicted = model.draw(x[rows], target, rng).energy(cand)
        ok = predicted <= threshold
        order = np.concatenate(
            [
                order[ok[order]],
                np.flatnonzero(~ok)[np.argsort(predicted[~ok], kind="stable")],
            ]
        )
    return [candidates[int(i)] for i in order]
