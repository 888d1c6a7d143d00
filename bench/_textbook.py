"""The textbook time-series classifiers, written as their papers give them (bench only).

Wang, Yan & Oates 2017 ("Time series classification from scratch with deep neural networks:
a strong baseline"), as re-implemented by Fawaz et al. 2019 ("Deep learning for time series
classification: a review"):

* FCN: three Conv1d blocks (128 filters of 8, 256 of 5, 128 of 3; BatchNorm, ReLU, same
  padding), global average pooling, a linear classifier;
* ResNet: three residual blocks (64, 128, 128 filters), each three Conv1d of 8, 5 and 3 with
  BatchNorm, a 1x1 convolution (with BatchNorm) on the shortcut where the width changes;
  global average pooling, a linear classifier.

The literature's recipe (``fit``): Adam at 1e-3, batches of ``min(N / 10, 16)`` of the whole
training set, the learning rate halved after 50 epochs without a lower training loss (down to
1e-4), 2,000 epochs (FCN) or 1,500 (ResNet), the model kept at its lowest training loss; here
stopped early when a wall-clock budget runs out.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import torch
from torch import nn
import torch.nn.functional as F


def _block(c_in: int, c_out: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(c_in, c_out, kernel, padding="same"), nn.BatchNorm1d(c_out), nn.ReLU()
    )


class FCN(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _block(channels, 128, 8), _block(128, 256, 5), _block(256, 128, 3)
        )
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, L, C)
        return self.head(self.body(x.transpose(1, 2)).mean(dim=2))


class _Residual(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _block(c_in, c_out, 8),
            _block(c_out, c_out, 5),
            nn.Conv1d(c_out, c_out, 3, padding="same"),
            nn.BatchNorm1d(c_out),
        )
        self.shortcut = (
            nn.Sequential(nn.Conv1d(c_in, c_out, 1), nn.BatchNorm1d(c_out))
            if c_in != c_out
            else nn.BatchNorm1d(c_out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_Residual(channels, 64), _Residual(64, 128), _Residual(128, 128))
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.transpose(1, 2)).mean(dim=2))


MODELS = {"fcn": (FCN, 2000), "resnet": (ResNet, 1500)}


def fit(
    name: str,
    x: torch.Tensor,
    y: torch.Tensor,
    classes: int,
    *,
    seconds: float,
    seed: int,
) -> tuple[nn.Module, dict[str, Any]]:
    """``name`` trained with the literature's recipe on ``(x, y)`` for at most ``seconds``;
    the model at its lowest training loss and what the training did."""
    build, epochs = MODELS[name]
    torch.manual_seed(seed)
    model = build(x.shape[2], classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, factor=0.5, patience=50, min_lr=1e-4
    )
    batch = max(2, min(len(x) // 10, 16))
    generator = torch.Generator().manual_seed(seed)
    best_loss, best_state, steps, done = math.inf, None, 0, 0
    started = time.perf_counter()
    for epoch in range(1, epochs + 1):
        done = epoch
        model.train()
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            if len(idx) < 2:  # BatchNorm
                continue
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            steps += 1
        epoch_loss = total / len(x)
        plateau.step(epoch_loss)
        if epoch_loss < best_loss:
            best_loss, best_state = epoch_loss, copy.deepcopy(model.state_dict())
        if time.perf_counter() - started > seconds:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    info = {"epochs": done, "steps": steps, "batch": batch, "train_loss": best_loss}
    return model.eval(), info


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(
        int((model(x[i : i + 512]).argmax(1) == y[i : i + 512]).sum())
        for i in range(0, len(x), 512)
    )
    return correct / len(x)
