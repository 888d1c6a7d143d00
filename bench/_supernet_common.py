"""What the supernet benchmarks share: the candidates, the supernet and the stage fine-tuning
recipe."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def steps_per_pass(data: Any, batch_size: int) -> int:
    """Optimisation steps of one pass over ``data``'s training split at ``batch_size``
    (an old budget of E epochs is E times this many steps)."""
    return math.ceil(len(data.train) / batch_size)


def parse_value(text: str) -> Any:
    """A ``--set field=value`` value: an int, a float, a bool or the text itself."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


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


def train_supernet(
    space: Any,
    data: Any,
    *,
    epochs: int,
    paths: int,
    seed: int,
    sampling: str = "fair",
    batch_size: int = 32,
    **options: Any,
) -> Any:
    """The benchmarks' supernet: Adam lr 1e-2, batch 32, ``paths`` paths per batch, any other
    ``SupernetTrainingConfig`` field in ``options`` (the remedies); returns the trained
    ``SupernetTrainer``."""
    from optuna_hpcnas.supernet import SuperNet
    from optuna_hpcnas.supernet import SupernetTrainer
    from optuna_hpcnas.supernet import SupernetTrainingConfig

    net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
    trainer = SupernetTrainer(
        net,
        SupernetTrainingConfig(
            paths_per_batch=paths,
            sampling=sampling,
            epochs=epochs,
            batch_size=batch_size,
            lr=0.01,
            weight_decay=0.0,
            seed=seed,
            **options,
        ),
    )
    trainer.fit(data.train)
    return trainer


class FineTuning:
    """Stage-by-stage fine-tuning of one candidate (inherited weights) with Adam.

    One optimizer and one endless stream of shuffled batches live across the stages, so a
    promoted candidate continues where its last stage ended (mid-pass when a stage's steps
    are not whole passes). Every candidate sees the same batch order for a given ``seed``
    (common random numbers).
    """

    def __init__(self, model: Any, data: Any, *, seed: int, batch_size: int = 32) -> None:
        import torch

        self.model = model
        self.data = data
        self.batch_size = batch_size
        from optuna_hpcnas.data import stream_batches

        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(seed)
        self.batches = stream_batches(data.train, batch_size, generator=generator)

    def stage(self, steps: int, lr: float, *, anneal: bool) -> tuple[float, float]:
        """``steps`` optimisation steps at ``lr``; ``anneal``: the lr falls to 0 on a cosine
        with weight decay 1e-4 (the stand-alone recipe). Returns (valid accuracy, valid
        log-loss)."""
        from optuna_hpcnas.evaluation import evaluate
        from optuna_hpcnas.supernet import train_step

        for group in self.optimizer.param_groups:
            group["lr"] = lr
            group["weight_decay"] = 1e-4 if anneal else 0.0
        self.model.train()
        for step, (x, y) in zip(range(steps), self.batches):
            if anneal:
                for group in self.optimizer.param_groups:
                    group["lr"] = 0.5 * lr * (1.0 + math.cos(math.pi * step / max(steps, 1)))
            train_step(self.model, self.optimizer, x, y, [None], grad_clip=5.0)
        return evaluate(self.model, self.data.valid)
