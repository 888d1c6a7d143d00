"""Ranking of the population for tournament selection (smaller key wins).

Every member gets a key ``(infeasible, violation, fitness, -stage, -age)``:

* ``infeasible``/``violation``: Deb's rule. A member is feasible when all its constraint
  values (``trial.set_constraint``) are <= 0. Feasible members beat infeasible ones; among
  infeasible ones the smaller sum of positive constraint values wins. When any member carries
  constraints, a member without them is infeasible with an infinite violation.
* ``fitness`` (single objective): the mid-rank quantile, in [0, 1] with 0 the best, of the
  member's value among the reference values of its stage. A complete trial's stage is the
  end: its reference values are the objective values of the complete members. A pruned
  trial's stage is the last step it reported (``trial.report``): its reference values are the
  intermediate values at that same step of every member that reported it, itself included.
  A pruned trial that reported nothing gets fitness 1 (the worst).
* ``fitness`` (several objectives): the Pareto rank of the complete, feasible members
  (Optuna's non-dominated sorting, 0 the first front), then the crowding distance within the
  front (larger wins). Pruned trials have no objective values and rank after every complete one.
* ``stage``: complete members first, then the further a pruned trial got, the better (ties).
* ``age``: on a full tie the newer member wins.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
import math
from typing import TYPE_CHECKING

import numpy as np
from optuna.study import StudyDirection

from optuna_hpcnas import _records

if TYPE_CHECKING:
    from optuna_hpcnas.samplers._evolution._cache import Member

Key = tuple[float, ...]


def _violations(population: Sequence[Member]) -> list[float]:
    if not any(m.constraints for m in population):
        return [0.0] * len(population)
    return [
        sum(max(0.0, c) for c in m.constraints.values()) if m.constraints else math.inf
        for m in population
    ]


def _quantile(value: float, reference: Sequence[float]) -> float:
    """Mid-rank of ``value`` among sorted ``reference`` (which includes it), scaled to [0, 1]."""
    if len(reference) <= 1:
        return 0.5
    below = bisect.bisect_left(reference, value)
    ties = bisect.bisect_right(reference, value) - below - 1
    return (below + 0.5 * ties) / (len(reference) - 1)


def _single_objective_fitness(
    population: Sequence[Member], sign: float
) -> list[tuple[float, float]]:
    complete = sorted(sign * m.values[0] for m in population if m.complete and m.values)
    by_step: dict[int, list[float]] = {}
    out: list[tuple[float, float]] = []
    for m in population:
        if m.complete and m.values:
            out.append((_quantile(sign * m.values[0], complete), -math.inf))
        elif m.intermediate:
            step = max(m.intermediate)
            if step not in by_step:
                by_step[step] = sorted(
                    sign * o.intermediate[step] for o in population if step in o.intermediate
                )
            out.append((_quantile(sign * m.intermediate[step], by_step[step]), -float(step)))
        else:
            out.append((1.0, math.inf))
    return out


def crowding_distances(losses: np.ndarray) -> np.ndarray:
    """NSGA-II crowding distance of each row within its own set (boundaries are infinite).

    Kept rather than Optuna's private ``_calc_crowding_distance``: that one gives duplicated
    members and one- or two-member fronts 0 where this gives the boundaries infinity, so
    switching would change which parent a tournament picks.
    """
    n, m = losses.shape
    distance = np.zeros(n)
    if n <= 2:
        distance[:] = math.inf
        return distance
    finite = np.nan_to_num(losses, posinf=1e300, neginf=-1e300)
    for j in range(m):
        order = np.argsort(finite[:, j], kind="stable")
        col = finite[order, j]
        span = col[-1] - col[0]
        distance[order[0]] = distance[order[-1]] = math.inf
        if span <= 0 or not math.isfinite(span):
            continue
        distance[order[1:-1]] += (col[2:] - col[:-2]) / span
    return distance


def _multi_objective_fitness(
    population: Sequence[Member], signs: np.ndarray, feasible: Sequence[bool]
) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = [(math.inf, math.inf)] * len(population)
    for group in (True, False):
        idx = [
            i
            for i, m in enumerate(population)
            if m.complete and m.values is not None and feasible[i] == group
        ]
        if not idx:
            continue
        losses = np.array([population[i].values for i in idx], dtype=float) * signs
        ranks = _records.non_domination_ranks(losses)
        crowd = np.zeros(len(idx))
        for r in np.unique(ranks):
            front = np.flatnonzero(ranks == r)
            crowd[front] = crowding_distances(losses[front])
        for k, i in enumerate(idx):
            out[i] = (float(ranks[k]), -float(crowd[k]))
    return out


def selection_keys(
    population: Sequence[Member], directions: Sequence[StudyDirection]
) -> list[Key]:
    """One key per member; the tournament picks the smallest."""
    violations = _violations(population)
    feasible = [v <= 0.0 for v in violations]
    if len(directions) == 1:
        sign = 1.0 if directions[0] == StudyDirection.MINIMIZE else -1.0
        scored = _single_objective_fitness(population, sign)
        return [
            (float(not feasible[i]), violations[i], fit, stage, -float(i))
            for i, (fit, stage) in enumerate(scored)
        ]
    signs = np.array([1.0 if d == StudyDirection.MINIMIZE else -1.0 for d in directions])
    scored = _multi_objective_fitness(population, signs, feasible)
    return [
        (
            float(not feasible[i]),
            violations[i],
            rank,
            crowd,
            -math.inf if population[i].complete else math.inf,
            -float(i),
        )
        for i, (rank, crowd) in enumerate(scored)
    ]
