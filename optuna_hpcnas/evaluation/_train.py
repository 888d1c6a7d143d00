"""Stand-alone training of one architecture: the reference the supernet is judged against."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel

from optuna_hpcnas.data import iterate_batches
from optuna_hpcnas.data import joined
from optuna_hpcnas.data import stream_batches
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation._config import ScratchTrainingConfig
from optuna_hpcnas.evaluation._config import TrainingSchedule
from optuna_hpcnas.evaluation._measure import count_flops
from optuna_hpcnas.evaluation._measure import count_parameters
from optuna_hpcnas.evaluation._measure import device_of
from optuna_hpcnas.evaluation._measure import measure_latency
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.supernet import cosine_lr
from optuna_hpcnas.supernet import Precision
from optuna_hpcnas.supernet import recalibrate_batch_norm
from optuna_hpcnas.supernet import train_step
from optuna_hpcnas.supernet._training import torch_optimizer

# The start of the message of every non-finite loss a candidate's training meets (the core's
# ``on_nan`` recognises its own by it).
NON_FINITE = "non-finite loss"
# Samples per forward when an averaged model's BatchNorm statistics are recomputed.
_STATISTICS_BATCH = 256


class NonFiniteLossError(FloatingPointError):
    """Stand-alone training (``train_model``) met a non-finite loss: nothing to measure."""


def evaluate(model: nn.Module, dataset: Any, *, batch_size: int = 512) -> tuple[float, float]:
    """``(accuracy, mean log-loss)`` of ``model`` on ``dataset``, in eval mode, on the
    model's device. The one validation of the package (search, export and deploy use it)."""
    was_training = model.training
    model.eval()
    device = device_of(model)
    correct, loss, n = 0, 0.0, 0
    try:
        with torch.no_grad():
            for x, y in iterate_batches(dataset, batch_size):
                x, y = x.to(device), y.to(device)
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
    steps: int = 500,
    lr: float = 1e-3,
    batch_size: int | str = "auto",
    weight_decay: float = 1e-4,
    seed: int = 0,
    latency_repeats: int = 20,
    holdout: bool = True,
) -> dict[str, Any]:
    """Train ``arch`` alone from a fresh initialisation and measure it.

    Deterministic for a given ``seed`` on one thread. Trains on the training split only by
    default (``holdout``), so its validation accuracy is a reference for the search's.
    Returns ``valid_accuracy``, ``valid_loss``, ``test_accuracy``, ``test_loss``, ``flops``
    (one sample), ``params``, ``latency_s`` (median forward of one sample, ``nan`` when
    ``latency_repeats`` is 0), ``train_seconds``, ``steps`` and ``batch_size``.

    Examples:
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> from optuna_hpcnas.data import load_digits_task
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> arch = next(iter(space.enumerate()))
        >>> result = train_from_scratch(space, arch, load_digits_task(), steps=5)
        >>> 0.0 <= result["valid_accuracy"] <= 1.0
        True
    """
    from optuna_hpcnas.supernet import SuperNet

    config = ScratchTrainingConfig(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        seed=seed,
        latency_repeats=latency_repeats,
        holdout=holdout,
    )
    if data.domain != space.domain:
        raise ValueError(f"The data is {data.domain!r}, but the space is {space.domain!r}.")
    supernet = SuperNet(
        space, input_shape=data.input_shape, num_classes=data.num_classes, seed=config.seed
    )
    data.check()
    model = supernet.subnet(arch).train()
    del supernet
    return train_model(model, data, config)


def training_set(data: TaskData, config: ScratchTrainingConfig) -> Any:
    """The split ``train_model`` trains on: the training split, plus the validation split
    unless ``config.holdout``."""
    return data.train if config.holdout else joined(data.train, data.valid)


def train_model(
    model: nn.Module,
    data: TaskData,
    config: ScratchTrainingConfig,
    *,
    on_step: Any = None,
) -> dict[str, Any]:
    """Train ``model`` with ``config``'s recipe (Adam, cosine-decayed learning rate, no
    warm-up, ``config.steps`` steps) from the weights it has, then measure it (the keys of
    ``train_from_scratch``). It trains on the training split, plus the validation split
    unless ``config.holdout``: ``hpcnas export`` trains the architecture it exports this way.
    ``on_step(step, loss)`` is called after every step (a training curve).

    Raises:
        NonFiniteLossError: A batch's loss was not finite (the message names the step).
    """
    train = training_set(data, config)
    samples = len(train)
    schedule = config.schedule(samples)
    start = time.perf_counter()
    _fit(model, train, config, schedule, on_step)
    train_seconds = time.perf_counter() - start
    model.eval()
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
        "steps": schedule.steps,
        "batch_size": schedule.batch_size,
        "trained_on": samples,
    }


def _fit(
    model: nn.Module,
    train: Any,
    config: ScratchTrainingConfig,
    schedule: TrainingSchedule,
    on_step: Any,
) -> None:
    """``schedule.steps`` steps of the supernet's ``train_step`` (one plain path, ``config``'s
    precision and clipping) on shuffled batches, at the step's ``cosine_lr``; on the model's
    device, torch's global RNG untouched. With ``config.average``, the rate holds from the
    averaged share's first step and ``model`` ends with the average of its weights over that
    share (``_take_average``)."""
    generator = torch.Generator().manual_seed(config.seed)
    device = device_of(model)
    precision = Precision(config.precision)
    if precision == Precision.FP16 and device.type != "cuda":
        raise ValueError("`precision` is 'fp16', which needs a GPU; use 'bf16' on a CPU.")
    scaler = torch.amp.GradScaler("cuda") if precision == Precision.FP16 else None
    model.train()
    lr, steps = schedule.lr, schedule.steps
    optimizer = torch_optimizer(
        "adam", model.parameters(), lr=lr, momentum=0.0, weight_decay=config.weight_decay
    )
    total = max(steps, 1)
    averaged_from = steps - round(steps * config.average)
    averaged = AveragedModel(model) if averaged_from < steps else None
    batches = stream_batches(train, schedule.batch_size, generator=generator)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # dropout and the like draw from it
        for step, (x, y) in zip(range(steps), batches):
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(lr, min(step, averaged_from), total)
            result = train_step(
                model, optimizer, x.to(device), y.to(device), [None],
                precision=precision, scaler=scaler, grad_clip=config.grad_clip,
            )  # fmt: skip
            if not result.finite:
                raise NonFiniteLossError(
                    f"{NON_FINITE} at step {step + 1} of {steps}: lower `lr` or set `grad_clip`"
                )
            if averaged is not None and step >= averaged_from:
                averaged.update_parameters(model)
            if on_step is not None:
                on_step(step + 1, result.loss)
    if averaged is not None:
        _take_average(model, averaged, train)


def _take_average(model: nn.Module, averaged: AveragedModel, train: Any) -> None:
    """Load the averaged weights into ``model`` and recompute its BatchNorm statistics on
    ``train`` (an average of weights has no running statistics of its own)."""
    model.load_state_dict(averaged.module.state_dict())
    device = device_of(model)
    batches = (
        (x.to(device), y)
        for x, y in iterate_batches(train, _STATISTICS_BATCH)
        if len(x) > 1  # a one-sample batch has no batch statistics
    )
    recalibrate_batch_norm(model, batches)
