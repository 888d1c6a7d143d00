"""``GroupEngine``: the evaluation core's engine over one evaluation group.

A plug-in of ``optuna_hpcnas.evaluation.TrialEvaluator.evaluate`` (it implements the
``Engine`` protocol; the round / stage / prune loop stays in the core). A candidate whose
layout is ``data_parallel = pipeline_stages = 1`` trains with plain PyTorch on the group
leader (unless ``[distributed] engine = "deepspeed"``); a larger one trains in a DeepSpeed
engine over the first ``dp x pp`` ranks of the group, which first receive the leader's
calibrated weights. Every optimizer step covers the core's whole batch: each data-parallel
replica takes its shard, cut into micro-batches of the candidate's ``micro_batch_size``
(DeepSpeed's gradient accumulation); DeepSpeed engines skip the last, incomplete batch of a
pass over the data (a pipeline needs equal micro-batch shapes).
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
import math
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas.distributed._engine import build_engine
from optuna_hpcnas.distributed._engine import TorchWorld

if TYPE_CHECKING:
    import torch
    from torch import nn

    from optuna_hpcnas.distributed._config import DistributedConfig
    from optuna_hpcnas.distributed._groups import EvaluationGroup
    from optuna_hpcnas.evaluation import EngineSession
    from optuna_hpcnas.evaluation import FineTuning
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.supernet import StepResult


class GroupEngine:
    """Engine of one evaluation group (every rank of the group builds one).

    Args:
        group: This rank's evaluation group.
        config: The ``[distributed]`` settings.
        device: ``"cpu"`` or ``"cuda"``.
        batch_size: The core's batch size (samples per optimizer step).
    """

    def __init__(
        self, group: EvaluationGroup, config: DistributedConfig, device: str, *, batch_size: int
    ) -> None:
        self.group = group
        self.config = config
        self.device = device
        self.batch_size = batch_size
        self.world = TorchWorld(group, config, device)

    def uses_deepspeed(self, arch: Architecture) -> bool:
        return arch.cluster.ranks > 1 or self.config.engine == "deepspeed"

    def open(
        self, model: nn.Module, arch: Architecture, fine_tuning: FineTuning
    ) -> EngineSession | None:
        from optuna_hpcnas.evaluation import LocalEngine

        if not self.uses_deepspeed(arch):
            return LocalEngine().open(model, arch, fine_tuning) if self.group.is_leader else None
        dp, pp = arch.cluster.data_parallel, arch.cluster.pipeline_stages
        self.world.close()  # the previous candidate's world, whatever its size
        if not self.world.ensure(dp * pp):
            return None
        layers = list(model.children())
        if dp * pp > 1:
            broadcast_layers(layers, [0] * len(layers))
        shard = max(1, self.batch_size // dp)
        micro = min(arch.cluster.micro_batch_size, shard)
        import torch

        engine = build_engine(
            layers,
            torch.nn.CrossEntropyLoss(),
            data_parallel=dp,
            pipeline_stages=pp,
            micro_batch_size=micro,
            config=self.config,
            lr=fine_tuning.lr,
            weight_decay=fine_tuning.weight_decay,
            optimizer=fine_tuning.optimizer,
            momentum=fine_tuning.momentum,
            device=self.device,
            group_rank=self.group.rank,
            precision=fine_tuning.precision,
            accumulation_steps=shard // micro,
        )
        return _DeepSpeedSession(
            self, engine, layers, replica=self.group.rank % dp, replicas=dp, micro=micro
        )

    def close(self) -> None:
        self.world.close()


class _DeepSpeedSession:
    def __init__(
        self,
        owner: GroupEngine,
        engine: Any,
        layers: list[nn.Module],
        *,
        replica: int,
        replicas: int,
        micro: int,
    ) -> None:
        self._owner = owner
        self._engine = engine
        self._layers = layers
        self._replica = replica
        self._replicas = replicas
        self._micro = micro
        self._steps = max(1, owner.batch_size // replicas) // micro  # accumulation steps

    def set_lr(self, lr: float) -> None:
        self._engine.set_lr(lr)

    def _micro_batches(self, x: torch.Tensor, y: torch.Tensor) -> list[Any]:
        """This replica's shard of the batch, cut into micro-batches (remainder dropped)."""
        xs, ys = x[self._replica :: self._replicas], y[self._replica :: self._replicas]
        m = self._micro
        return [(xs[i * m : (i + 1) * m], ys[i * m : (i + 1) * m]) for i in range(self._steps)]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> StepResult:
        from optuna_hpcnas.supernet import StepResult

        engine = self._engine
        if len(x) < self._owner.batch_size:  # equal micro-batch shapes on every step
            return StepResult(float("nan"), True, 0)
        micro = self._micro_batches(x, y)
        stream: Iterator[Any] = iter(micro)
        if engine.kind == "pipeline":
            losses = [engine.train_step(stream)]
        else:
            losses = [engine.train_step(stream) for _ in range(len(micro))]
        loss = sum(losses) / len(losses)
        return StepResult(loss, math.isfinite(loss), len(micro))

    def synchronise(self) -> None:
        engine = self._engine
        engine.copy_back(self._layers, self._owner.group.rank)
        if engine.kind == "pipeline":
            broadcast_layers(self._layers, engine.owners)

    def close(self) -> None:
        del self._engine
        # DeepSpeed creates new process groups per engine; ending the world frees them
        # (sockets would pile up over hundreds of trials). A new one takes milliseconds.
        self._owner.world.close()


def broadcast_layers(layers: Sequence[nn.Module], owners: Sequence[int]) -> None:
    """torch.distributed broadcast of each layer's state from its owner (one flat buffer per
    layer and dtype)."""
    import torch
    from torch._utils import _flatten_dense_tensors
    from torch._utils import _unflatten_dense_tensors
    import torch.distributed as dist

    for layer, owner in zip(layers, owners):
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in layer.state_dict().values():
            by_dtype.setdefault(t.dtype, []).append(t)
        for tensors in by_dtype.values():
            flat = _flatten_dense_tensors([t.detach() for t in tensors])
            dist.broadcast(flat, src=owner)
            with torch.no_grad():
                for t, new in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                    t.copy_(new)
