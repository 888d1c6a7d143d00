"""Cost of a network on this device: FLOPs, parameters and measured latency."""

from __future__ import annotations

from collections.abc import Sequence
import statistics
import time

import torch
from torch import nn


def count_flops(model: nn.Module, input_shape: Sequence[int], *, batch_size: int = 1) -> int:
    """FLOPs of one forward pass (``torch.utils.flop_counter.FlopCounterMode``; a multiply-add
    counts 2), for ``batch_size`` samples of ``input_shape``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        x = torch.zeros(batch_size, *input_shape, device=device_of(model))
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(x)
        return int(counter.get_total_flops())
    finally:
        model.train(was_training)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def measure_latency(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    batch_size: int = 1,
    repeats: int = 20,
    warmup: int = 3,
) -> float:
    """Median wall time (seconds) of a forward pass in eval mode on this device."""
    if repeats < 1:
        raise ValueError(f"`repeats` is {repeats}, but must be >= 1.")
    was_training = model.training
    model.eval()
    try:
        device = device_of(model)
        x = torch.randn(batch_size, *input_shape, device=device)
        times = []
        with torch.no_grad():
            for i in range(warmup + repeats):
                start = time.perf_counter()
                model(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
        return float(statistics.median(times))
    finally:
        model.train(was_training)


def device_of(model: nn.Module) -> torch.device:
    """The device of the first parameter (CPU for a module without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
