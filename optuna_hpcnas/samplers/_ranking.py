"""Scale-free targets for the surrogates: normal scores of a feasibility-aware order.

Both samplers fit ``qubo``'s surrogates to the *order* of the finished trials, never to their
raw values, so that any strictly monotone transform of the objective (a log, a penalty of
5 or of 1e6 added to bad points) leaves what they propose unchanged. The order is
lexicographic: feasible trials first (by value), then infeasible ones by total constraint
violation; a trial without constraints in a constrained study counts as infeasible. Ties
share their mid-rank, so a block of equally penalised trials is one level of the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

_NORMAL = NormalDist()


def normal_scores(keys: Sequence[tuple[float, ...]]) -> np.ndarray:
    """Van der Waerden scores of ``keys`` (smaller key, smaller score; ties share one)."""
    n = len(keys)
    if n == 0:
        return np.zeros(0)
    order = sorted(range(n), key=keys.__getitem__)
    ranks = np.empty(n)
    i = 0
    while i < n:
        j = i
        while j + 1 < n and keys[order[j + 1]] == keys[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j)
        i = j + 1
    return np.array([_NORMAL.inv_cdf((r + 0.5) / n) for r in ranks])


def feasibility_keys(
    values: Sequence[float], constraints: Sequence[Sequence[float] | None]
) -> list[tuple[float, float, float]]:
    """``(infeasible, violation, value)`` per trial; ``constraints[i]`` is ``None`` when
    trial i reported none. Values are minimised (negate maximised ones first)."""
    constrained = any(c is not None and len(c) for c in constraints)
    out = []
    for value, cons in zip(values, constraints):
        if not constrained:
            out.append((0.0, 0.0, float(value)))
        elif cons is None or not len(cons):
            out.append((1.0, float("inf"), float(value)))
        else:
            violation = float(sum(max(0.0, float(c)) for c in cons))
            out.append((float(violation > 0), violation, float(value)))
    return out


def constraint_target(
    constraints: Sequence[Sequence[float] | None],
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """What the feasibility surrogate is fitted on: ``(rows, target, threshold)``.

    ``rows`` indexes the trials that reported constraints, ``target`` is their largest
    constraint value, standardised, and ``threshold`` is where 0 (the feasibility limit)
    lands on that scale: a prediction at or below it means feasible. ``None`` when no trial
    reported constraints or all agree (nothing to learn).
    """
    rows = [i for i, c in enumerate(constraints) if c is not None and len(c)]
    if len(rows) < 2:
        return None
    worst = np.array([max(float(v) for v in constraints[i] or ()) for i in rows])
    std = float(worst.std())
    if not std > 0 or bool(np.all(worst <= 0)):
        return None
    mean = float(worst.mean())
    return np.array(rows), (worst - mean) / std, -mean / std
