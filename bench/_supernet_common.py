"""What the supernet benchmarks share: the candidates and the stage fine-tuning recipe."""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import numpy as np


def sample_architectures(space: Any, n: int, seed: int) -> list[Any]:
    """``n`` distinct architectures drawn uniformly with ``seed``; the whole space, in
    enumeration order, when ``n`` is at least its size."""
    if n >= space.cardinality():
        return list(space.enumerate())
    rng = np.random.default_rng(seed)
    archs: list[Any] = []
    seen: set[Any] = set()
    while len(archs) < n:
        arch = space.sample(rng)
        if arch not in seen:
            seen.add(arch)
            archs.append(arch)
    return archs


def finetune(
    model: Any,
    data: Any,
    stages: Sequence[tuple[str, int, float]],
    *,
    seed: int,
    batch_size: int = 32,
    cosine: Sequence[str] = ("medium",),
) -> dict[str, tuple[float, float]]:
    """Fine-tune ``model`` (inherited weights) through ``stages`` of (name, epochs, lr) with
    Adam; a stage named in ``cosine`` anneals its lr to 0 with weight decay 1e-4 (the
    stand-alone recipe). Every candidate sees the same batch order for a given ``seed``
    (common random numbers). Returns ``{stage: (valid accuracy, valid log-loss)}``.
    """
    import torch

    from optuna_hpcnas.data import iterate_batches
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.supernet import train_step

    optimizer = torch.optim.Adam(model.parameters(), lr=stages[0][2])
    generator = torch.Generator().manual_seed(seed)
    per_epoch = math.ceil(len(data.train) / batch_size)
    out = {}
    for name, epochs, lr in stages:
        anneal = name in cosine
        for group in optimizer.param_groups:
            group["lr"] = lr
            group["weight_decay"] = 1e-4 if anneal else 0.0
        steps, step = epochs * per_epoch, 0
        for _ in range(epochs):
            model.train()
            for x, y in iterate_batches(data.train, batch_size, shuffle=True, generator=generator):
                if anneal:
                    for group in optimizer.param_groups:
                        group["lr"] = 0.5 * lr * (1.0 + math.cos(math.pi * step / steps))
                train_step(model, optimizer, x, y, [None], grad_clip=5.0)
                step += 1
        out[name] = evaluate(model, data.valid)
    return out
