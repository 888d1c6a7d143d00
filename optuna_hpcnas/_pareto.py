"""Trials best first, for one objective or several: the non-dominated fronts of
``_records.non_domination_ranks`` (Optuna's fast non-dominated sort), each ordered by its
first objective."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from optuna_hpcnas import _records


def fronts(
    trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]
) -> list[list[FrozenTrial]]:
    """Complete trials in non-dominated fronts, the best first; each front ordered by its
    first objective (then trial number). One objective: one trial a front."""
    signs = np.array([-1.0 if d == StudyDirection.MAXIMIZE else 1.0 for d in directions])
    ordered = sorted(trials, key=lambda t: (signs[0] * t.values[0], t.number))
    if len(directions) == 1:
        return [[t] for t in ordered]
    if not ordered:
        return []
    losses = np.array([t.values for t in ordered], dtype=float) * signs
    ranks = _records.non_domination_ranks(losses)
    return [[t for t, r in zip(ordered, ranks) if r == rank] for rank in np.unique(ranks)]


def ranked(
    trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]
) -> list[FrozenTrial]:
    """The trials best first, front by front."""
    return [t for front in fronts(trials, directions) for t in front]
