"""Where the paths of a supernet batch come from, beyond uniform sampling: the largest and
smallest path of the sandwich rule (BigNAS) and the growing space of a progressive warm-up.
``SupernetTrainer.sample_paths`` composes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import HierarchicalSearchSpace

if TYPE_CHECKING:
    from optuna_hpcnas.supernet._few_shot import FewShotSuperNet
    from optuna_hpcnas.supernet._supernet import SuperNet

# Architectures sampled to find the largest and the smallest path: the spaces are too large
# to enumerate, and the extremes of a few hundred draws are within a decision of the true
# ones on the presets.
EXTREME_POOL = 256


def extreme_architectures(
    supernet: SuperNet | FewShotSuperNet, rng: np.random.Generator, *, pool: int = EXTREME_POOL
) -> tuple[Architecture, Architecture]:
    """``(largest, smallest)`` by the parameters of the path, among ``pool`` sampled
    architectures (the whole space when it is no larger)."""
    space = supernet.space
    if space.cardinality() <= pool:
        archs = list(space.enumerate())
    else:
        archs = [space.sample(rng) for _ in range(pool)]
    sizes = [sum(p.numel() for p in supernet.subnet(a).parameters()) for a in archs]
    return archs[int(np.argmax(sizes))], archs[int(np.argmin(sizes))]


def progressive_path(
    space: HierarchicalSearchSpace, anchor: Architecture, rng: np.random.Generator, *, keep: float
) -> Architecture:
    """A path that keeps each decision of ``anchor`` with probability ``keep`` and draws the
    others (``keep = 1``: the anchor; ``keep = 0``: a uniform sample)."""
    params = space.to_params(anchor)
    fixed = {k: v for k, v in params.items() if rng.random() < keep}
    return space.sample(rng, fixed=fixed)
