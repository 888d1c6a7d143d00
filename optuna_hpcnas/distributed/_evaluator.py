"""What an evaluation group trains and scores: ``GroupEvaluator`` and the supernet one.

Per trial the leader first trains the shared supernet on the candidate's path for a few
steps (single-path one-shot; these are the weights averaged between groups), then the group
fine-tunes the candidate's layers, inherited from the supernet, in its engine (plain PyTorch,
DeepSpeed data parallel, or DeepSpeed pipeline x data parallel), and the leader scores them.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import Protocol
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from optuna_hpcnas.data import TaskData
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace


class GroupEvaluator(Protocol):
    """The model side of ``run_search``; every rank of a group builds one (same seed)."""

    loss_fn: Callable[..., torch.Tensor]

    def shared_tensors(self) -> list[torch.Tensor]:
        """The weights averaged between groups (the leader's replica is authoritative)."""
        ...

    def supernet_step(self, arch: Architecture, *, steps: int, batch_size: int, seed: int) -> None:
        """Train the shared weights on ``arch``'s path (leader only)."""
        ...

    def layers(self, arch: Architecture) -> list[nn.Module]:
        """The candidate's layers in execution order (one tensor in, one out), inheriting
        the shared weights."""
        ...

    def train_batches(
        self, *, batch_size: int, replica: int, num_replicas: int, seed: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """An endless stream of training micro-batches of one data-parallel replica."""
        ...

    def validate(self, layers: Sequence[nn.Module], metrics: Sequence[str]) -> dict[str, float]:
        """The requested metrics of the trained layers (leader only)."""
        ...

    def predicted_cost(self, arch: Architecture) -> float:
        """A cost estimate (FLOPs) used by the cost-aware scheduler."""
        ...


class SupernetEvaluator:
    """``GroupEvaluator`` over ``optuna_hpcnas.SuperNet`` and a ``TaskData``.

    Args:
        space: The search space.
        task: Train / validation data.
        seed: Seed of the supernet weights and of the data order.
        lr: Learning rate of the supernet's SGD (the candidate's engine has its own).
        device: ``"cpu"`` or ``"cuda"``.
    """

    def __init__(
        self,
        space: HierarchicalSearchSpace,
        task: TaskData,
        *,
        seed: int = 0,
        lr: float = 0.05,
        device: str = "cpu",
    ) -> None:
        import torch

        from optuna_hpcnas.supernet import SuperNet

        self.space = space
        self.task = task
        self.device = device
        self.supernet = SuperNet(
            space, input_shape=task.input_shape, num_classes=task.num_classes, seed=seed
        ).to(device)
        self._optimizer = torch.optim.SGD(self.supernet.parameters(), lr=lr, momentum=0.9)
        self.loss_fn: Callable[..., torch.Tensor] = torch.nn.CrossEntropyLoss()
        self._train_x, self._train_y = _tensors(task.train)
        self._cost_cache: dict[str, float] = {}

    def shared_tensors(self) -> list[torch.Tensor]:
        tensors = [p.data for p in self.supernet.parameters()]
        tensors += [b for b in self.supernet.buffers() if b.is_floating_point()]
        return tensors

    def supernet_step(self, arch: Architecture, *, steps: int, batch_size: int, seed: int) -> None:
        if steps <= 0:
            return
        batches = self.train_batches(batch_size=batch_size, replica=0, num_replicas=1, seed=seed)
        self.supernet.train()
        for _ in range(steps):
            x, y = next(batches)
            self._optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.supernet(x.to(self.device), arch), y.to(self.device))
            loss.backward()
            self._optimizer.step()

    def layers(self, arch: Architecture) -> list[nn.Module]:
        self.supernet.train()
        return [layer.to(self.device) for layer in self.supernet.layers(arch)]

    def train_batches(
        self, *, batch_size: int, replica: int, num_replicas: int, seed: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        n = len(self._train_x)
        gen = torch.Generator().manual_seed(seed)
        while True:
            # one shuffled pass, cut into num_replicas disjoint shards
            order = torch.randperm(n, generator=gen)[replica::num_replicas]
            for start in range(0, len(order) - batch_size + 1, batch_size):
                idx = order[start : start + batch_size]
                yield self._train_x[idx], self._train_y[idx]

    def validate(self, layers: Sequence[nn.Module], metrics: Sequence[str]) -> dict[str, float]:
        import copy

        import torch
        from torch import nn

        from optuna_hpcnas.data import iterate_batches
        from optuna_hpcnas.evaluation import count_flops
        from optuna_hpcnas.evaluation import count_parameters
        from optuna_hpcnas.evaluation import measure_latency

        model = nn.Sequential(*layers)
        was_training = model.training
        model.eval()
        correct, total_loss, n = 0, 0.0, 0
        with torch.no_grad():
            for x, y in iterate_batches(self.task.valid, 512):
                x, y = x.to(self.device), y.to(self.device)
                logits = model(x).float()
                total_loss += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(1) == y).sum())
                n += len(y)
        model.train(was_training)
        out = {"accuracy": correct / max(n, 1), "loss": total_loss / max(n, 1)}
        if "flops" in metrics:
            cpu_model = model if self.device == "cpu" else copy.deepcopy(model).cpu()
            out["flops"] = float(count_flops(cpu_model, self.task.input_shape))
        if "params" in metrics:
            out["params"] = float(count_parameters(model))
        if "latency" in metrics:
            out["latency"] = measure_latency(model, self.task.input_shape)
        return out

    def predicted_cost(self, arch: Architecture) -> float:
        from torch import nn

        from optuna_hpcnas.evaluation import count_flops

        key = arch.to_json()
        if key not in self._cost_cache:
            model = nn.Sequential(*(layer.cpu() for layer in self.supernet.layers(arch)))
            self._cost_cache[key] = float(count_flops(model, self.task.input_shape))
        return self._cost_cache[key]


def _tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import TensorDataset

    from optuna_hpcnas.data import iterate_batches

    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        x, y = dataset.tensors
        return x.float(), y.long()
    import torch

    xs, ys = zip(*iterate_batches(dataset, 1024))
    return torch.cat(xs).float(), torch.cat(ys).long()


def default_evaluator(
    config: Any, space: HierarchicalSearchSpace, device: str
) -> SupernetEvaluator:
    """The evaluator a ``RunConfig`` describes (``[data]`` and ``[training]``)."""
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.data import make_sequence_task

    v = config.data.validation_fraction
    if config.data.name == "digits":
        task = load_digits_task(seed=config.data.seed, fractions=(1 - 2 * v, v, v))
    else:
        task = make_sequence_task(seed=config.data.seed)
    return SupernetEvaluator(
        space, task, seed=config.training.seed, lr=config.training.supernet_lr, device=device
    )
