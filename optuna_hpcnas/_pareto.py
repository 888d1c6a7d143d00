"""Trials best first, for one objective or several (non-dominated sorting). Optuna has no
public routine that sorts a list of trials into fronts, hence this one."""

from __future__ import annotations

from collections.abc import Sequence

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial


def _signs(directions: Sequence[StudyDirection]) -> list[float]:
    return [-1.0 if d == StudyDirection.MAXIMIZE else 1.0 for d in directions]


def _dominates(a: Sequence[float], b: Sequence[float], signs: Sequence[float]) -> bool:
    return all(s * x <= s * y for x, y, s in zip(a, b, signs)) and any(
        s * x < s * y for x, y, s in zip(a, b, signs)
    )


def fronts(
    trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]
) -> list[list[FrozenTrial]]:
    """Complete trials in non-dominated fronts, the best first; each front ordered by its
    first objective (then trial number). One objective: one trial a front."""
    signs = _signs(directions)
    rest = sorted(trials, key=lambda t: (signs[0] * t.values[0], t.number))
    if len(directions) == 1:
        return [[t] for t in rest]
    out: list[list[FrozenTrial]] = []
    while rest:
        front = [t for t in rest if not any(_dominates(o.values, t.values, signs) for o in rest)]
        out.append(front)
        rest = [t for t in rest if t not in front]
    return out


def ranked(
    trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]
) -> list[FrozenTrial]:
    """The trials best first, front by front."""
    return [t for front in fronts(trials, directions) for t in front]
