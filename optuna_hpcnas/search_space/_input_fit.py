"""A search space fitted to the samples it will search on.

A preset is written for a family of data (``signal-1d``: 1-D signals of any length and
channel count), but some of its choices cannot be built, or cost far too much, for a given
sample shape: the flatten stem turns a ``(L, F)`` signal into ``L * F`` channels, the flatten
head keeps one weight block per position, attention and recurrence over thousands of positions
dominate a search. ``fit_to_input`` removes what the shape rules out and says why, once, so
that the supernet, the sampler and every enqueued model see the same, buildable space. It
sits between the space and the evaluation core (``SupernetObjective`` applies it), and
imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import math

from optuna_hpcnas.search_space._space import HierarchicalSearchSpace

# Longer signals are averaged down (window = stride = ``pooling_factor``) before the stem, so
# no cell, attention and recurrence included, runs over more positions than this.
MAX_POSITIONS = 512
# The flatten stem makes ``L * F`` channels, and the supernet sizes every shared operator to its
# widest state: beyond this many times the widest cell, the stem alone widens the whole net.
FLATTEN_STEM_FACTOR = 1
# The flatten head holds ``positions * channels`` weights per class and per reachable length.
MAX_FLATTEN_HEAD_FEATURES = 16_384


def pooling_factor(length: int) -> int:
    """The averaging window (and stride) a sequence of ``length`` positions gets before its
    stem: 1 up to ``MAX_POSITIONS``."""
    return max(1, math.ceil(int(length) / MAX_POSITIONS))


def stem_positions(length: int) -> int:
    """Positions of a sequence after the stem's pooling (``ceil(length / factor)``)."""
    return math.ceil(int(length) / pooling_factor(length))


@dataclass(frozen=True)
class InputFit:
    """A space fitted to a sample shape.

    Attributes:
        space: The space without the choices the shape rules out (the same object when none).
        notes: One sentence per change, for the log.
    """

    space: HierarchicalSearchSpace
    notes: tuple[str, ...]


def fit_to_input(space: HierarchicalSearchSpace, input_shape: Sequence[int]) -> InputFit:
    """``space`` less the stems and heads that a sample of ``input_shape`` rules out.

    Images are left as they are. For sequences ``(L, F)``: the flatten stem goes when
    ``L * F`` exceeds the widest cell (``FLATTEN_STEM_FACTOR``); the flatten head goes
    when its per-class weight block would exceed ``MAX_FLATTEN_HEAD_FEATURES``; a space
    left with no stem or head gets the domain's plain one (``"none"``, ``"mean"``).
    Signals longer than ``MAX_POSITIONS`` are pooled by the supernet's stem (noted here).

    Examples:
        >>> fit = fit_to_input(HierarchicalSearchSpace.preset("signal-1d"), (100, 6))
        >>> fit.space.stems
        ('none', 'embed')
        >>> fit.notes[0][:40]
        "Left out the 'flatten' stem: a (100, 6) "
    """
    if space.domain != "sequence":
        return InputFit(space, ())
    length, features = (int(s) for s in input_shape)
    definition = space.to_dict()
    notes: list[str] = []
    widest = max(space.widths)
    positions = stem_positions(length)
    if pooling_factor(length) > 1:
        notes.append(
            f"Signals of {length} positions are averaged over windows of "
            f"{pooling_factor(length)} before the stem ({positions} positions), so no cell "
            f"runs over more than {MAX_POSITIONS}."
        )
    stems = list(space.stems) if "stems" in definition else []
    if "flatten" in stems and positions * features > FLATTEN_STEM_FACTOR * widest:
        stems.remove("flatten")
        notes.append(
            f"Left out the 'flatten' stem: a {tuple(input_shape)} sample makes "
            f"{positions * features} features, more than the widest cell ({widest}) that every "
            "shared operator would be widened to."
        )
    if "stems" in definition and not stems:
        stems = ["none"]
        notes.append("The space had no other stem: using 'none' (the raw signal).")
    channels = max([widest, features] + [positions * features for s in stems if s == "flatten"])
    longest = max([1] + [positions for s in stems or ["embed"] if s != "flatten"])
    heads = list(space.heads) if "heads" in definition else []
    if "flatten" in heads and longest * channels > MAX_FLATTEN_HEAD_FEATURES:
        heads.remove("flatten")
        notes.append(
            f"Left out the 'flatten' head: {longest} positions x {channels} channels is more "
            f"than {MAX_FLATTEN_HEAD_FEATURES} weights per class; the 'mean' head pools them."
        )
        if not heads:
            heads = ["mean"]
    changed = {}
    if "stems" in definition and tuple(stems) != tuple(definition["stems"]):
        changed["stems"] = stems
    if "heads" in definition and tuple(heads) != tuple(definition["heads"]):
        changed["heads"] = heads
    if not changed:
        return InputFit(space, tuple(notes))
    definition.update(changed)
    return InputFit(
        HierarchicalSearchSpace.from_dict(definition, registry=space.registry), tuple(notes)
    )
