"""Stand-alone training of one architecture: the reference the supernet is judged against."""

from __future__ import annotations

from dataclasses import dataclass
import math
import time
from typing import Any

import torch
from torch import nn
import torch.nn.functional as F

from optuna_hpcnas.data import iterate_batches
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation._measure import count_flops
from optuna_hpcnas.evaluation._measure import count_parameters
from optuna_hpcnas.evaluation._measure import measure_latency
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import HierarchicalSearchSpace


@dataclass(frozen=True)
class ScratchTrainingConfig:
    """Options of ``train_from_scratch`` (a TOML table maps onto it as ``Cls(**table)``).

    Adam with a cosine-decayed learning rate, no warm-up.
    """

    epochs: int = 5
    lr: float = 2e-2
    batch_size: int = 32
    weight_decay: float = 1e-4
    seed: int = 0
    latency_repeats: int = 20

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "seed", "latency_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"`{name}` must be an int, but got {value!r}.")
        if self.epochs < 0:
            raise ValueError(f"`epochs` is {self.epochs}, but must be >= 0.")
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` is {self.batch_size}, but must be >= 1.")
        if self.latency_repeats < 0:
            raise ValueError(f"`latency_repeats` is {self.latency_repeats}, but must be >= 0.")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"`lr` is {self.lr!r}, but must be a finite number > 0.")
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ValueError(f"`weight_decay` is {self.weight_decay!r}, but must be >= 0.")


def evaluate(model: nn.Module, dataset: Any, *, batch_size: int = 512) -> tuple[float, float]:
    """``(accuracy, mean log-loss)`` of ``model`` on ``dataset``, in eval mode."""
    was_training = model.training
    model.eval()
    correct, loss, n = 0, 0.0, 0
    try:
        with torch.no_grad():
            for x, y in iterate_batches(dataset, batch_size):
                logits = model(x).float()
                loss += float(F.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(1) == y).sum())
                n += len(y)
    finally:
        model.train(was_training)
    return correct / max(n, 1), loss / max(n, 1)


def train_from_scratch(
    space: HierarchicalSearchSpace,
    arch: Architecture,
    data: TaskData,
    *,
    epochs: int = 5,
    lr: float = 2e-2,
    batch_size: int = 32,
    weight_decay: float = 1e-4,
    seed: int = 0,
    latency_repeats: int = 20,
) -> dict[str, Any]:
    """Train ``arch`` alone from a fresh initialisation and measure it.

    Deterministic for a given ``seed`` on one thread. Returns ``valid_accuracy``,
    ``valid_loss``, ``test_accuracy``, ``test_loss``, ``flops`` (one sample), ``params``,
    ``latency_s`` (median forward of one sample, ``nan`` when ``latency_repeats`` is 0),
    ``train_seconds`` and ``epochs``.

    Example:
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> from optuna_hpcnas.data import load_digits_task
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> arch = next(iter(space.enumerate()))
        >>> result = train_from_scratch(space, arch, load_digits_task(), epochs=1)
        >>> 0.0 <= result["valid_accuracy"] <= 1.0
        True
    """
    from optuna_hpcnas.supernet import SuperNet

    config = ScratchTrainingConfig(
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        seed=seed,
        latency_repeats=latency_repeats,
    )
    if data.domain != space.domain:
        raise ValueError(f"The data is {data.domain!r}, but the space is {space.domain!r}.")
    supernet = SuperNet(
        space, input_shape=data.input_shape, num_classes=data.num_classes, seed=config.seed
    )
    data.check()
    model = supernet.subnet(arch).train()
    del supernet
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    steps = config.epochs * math.ceil(len(data.train) / config.batch_size)  # type: ignore[arg-type]
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(steps, 1))
    start = time.perf_counter()
    for _ in range(config.epochs):
        for x, y in iterate_batches(
            data.train, config.batch_size, shuffle=True, generator=generator
        ):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
    train_seconds = time.perf_counter() - start
    valid_accuracy, valid_loss = evaluate(model, data.valid)
    test_accuracy, test_loss = evaluate(model, data.test)
    latency = (
        measure_latency(model, data.input_shape, repeats=config.latency_repeats)
        if config.latency_repeats > 0
        else float("nan")
    )
    return {
        "valid_accuracy": valid_accuracy,
        "valid_loss": valid_loss,
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "flops": count_flops(model, data.input_shape),
        "params": count_parameters(model),
        "latency_s": latency,
        "train_seconds": train_seconds,
        "epochs": config.epochs,
    }
