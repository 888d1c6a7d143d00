"""Shared pieces of the checkpoint benchmarks: digits data and a single-path SuperNet trainer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.supernet import SuperNet


class DigitsSupernetTrainer:
    """SPOS-style training of a real SuperNet on sklearn digits: one sampled path per step."""

    def __init__(self, space: HierarchicalSearchSpace, *, seed: int = 0, lr: float = 0.05) -> None:
        torch.manual_seed(seed)
        data = load_digits_task(seed=seed)
        self.x, self.y = data.train.tensors  # type: ignore[attr-defined]
        self.xv, self.yv = data.valid.tensors  # type: ignore[attr-defined]
        self.space = space
        self.net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10, seed=seed)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=lr, momentum=0.9)
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.step = 0

    def train_step(self, arch: Any | None = None, batch: int = 64) -> None:
        arch = arch if arch is not None else self.space.sample(self.rng)
        idx = torch.randint(0, len(self.x), (batch,), generator=self.gen)
        loss = torch.nn.functional.cross_entropy(self.net(self.x[idx], arch), self.y[idx])
        self.opt.zero_grad(set_to_none=True)  # unsampled operators keep no gradient
        loss.backward()
        self.opt.step()
        self.step += 1

    @torch.no_grad()
    def accuracy(self, arch: Any) -> float:
        self.net.eval()
        acc = float((self.net(self.xv, arch).argmax(-1) == self.yv).float().mean())
        self.net.train()
        return acc

    def torch_state(self) -> dict[str, Any]:
        """What a per-trial torch.save stores: model and optimizer state dicts."""
        return {"model": self.net.state_dict(), "optimizer": self.opt.state_dict()}


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)
