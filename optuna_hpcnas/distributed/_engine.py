"""One DeepSpeed training engine per candidate and group (data parallel, or ``PipelineModule``
stages x data parallel); a candidate on one rank trains in the evaluation core's own
``LocalEngine`` instead (``GroupEngine`` chooses).

The torch.distributed world of an engine is the set of ranks the candidate uses (the first
``dp x pp`` ranks of its group), not the MPI world: several groups then run independent
DeepSpeed engines side by side, and a group re-forms its world (in milliseconds, on a fresh
port from the leader) when a candidate needs a different number of ranks. The rendezvous comes
from MPI, never from DeepSpeed's discovery (which takes the first address of ``hostname -I``).

Why the plain path for dp = pp = 1: a DeepSpeed ZeRO-1 engine ran a small supernet at 0.61x
the throughput of plain PyTorch on one H200 (and ``bench/distributed_engines.py`` measures
the CPU figure); it brings nothing to a single rank.

DeepSpeed's first ``init_distributed`` compiles a shared-memory all-reduce op with g++ (about
50 s) that only its inference all-reduce uses. ``skip_shm_op`` (the default) marks it
unavailable before DeepSpeed probes its ops, which also skips the op probe's compiler
subprocesses; ``shm_op = "build"`` keeps DeepSpeed's default (build once, cached in
``~/.cache/torch_extensions``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
import copy
import datetime
import logging
import os
import socket
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from optuna_hpcnas.distributed._config import DistributedConfig
    from optuna_hpcnas.distributed._groups import EvaluationGroup

_logger = logging.getLogger(__name__)

Batch = tuple["torch.Tensor", "torch.Tensor"]


def skip_shm_op() -> None:
    """Tell DeepSpeed its shared-memory comm op is unavailable, so it neither compiles it
    (about 50 s on first use) nor probes every op with compiler subprocesses. Call before
    ``deepspeed.init_distributed``; training collectives do not use the op."""
    import deepspeed.ops

    compatible = deepspeed.ops.__dict__.get("__compatible_ops__")
    if compatible is None:
        deepspeed.ops.__dict__["__compatible_ops__"] = {"deepspeed_shm_comm": False}
    else:
        compatible["deepspeed_shm_comm"] = False


_DS_GROUP_GLOBALS = {
    "_EXPERT_PARALLEL_GROUP": dict,
    "_EXPERT_PARALLEL_GROUP_RANKS": dict,
    "_EXPERT_DATA_PARALLEL_GROUP": dict,
    "_EXPERT_DATA_PARALLEL_GROUP_RANKS": dict,
    "_ALL_TO_ALL_GROUP": dict,
    "_WORLD_GROUP": None,
    "_ZERO_PARAM_INTRA_PARALLEL_GROUP": None,
    "mpu": None,
    "mesh_device": None,
    "_TENSOR_MODEL_PARALLEL_GROUP": None,
    "_MODEL_PARALLEL_GROUP": None,
    "_DATA_PARALLEL_GROUP": None,
    "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE": None,
    "_MPU_TENSOR_MODEL_PARALLEL_RANK": None,
}


def reset_deepspeed_groups() -> None:
    """Forget the process groups DeepSpeed cached for the previous engine.

    ``deepspeed.utils.groups`` keeps module-level handles (the pipeline grid as ``mpu``, the
    data-parallel and world groups) that a later engine would reuse, although they belong to
    another engine's layout or to a torch world that no longer exists.
    """
    from deepspeed.utils import groups

    for name, initial in _DS_GROUP_GLOBALS.items():
        if hasattr(groups, name):
            setattr(groups, name, initial() if initial is dict else None)


def rendezvous_env(
    *, rank: int, world_size: int, local_rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The ``env://`` variables torch.distributed and DeepSpeed read (a pure function)."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    if master_addr in ("127.0.0.1", "localhost"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


class TorchWorld:
    """The torch.distributed world of one group's current engine (collective over the group).

    Args:
        group: The rank's evaluation group.
        config: The ``[distributed]`` settings (address, port, timeout, backend).
        device: ``"cpu"`` or ``"cuda"``.
    """

    def __init__(self, group: EvaluationGroup, config: DistributedConfig, device: str) -> None:
        self._group = group
        self._config = config
        self._device = device
        self._members = 0
        self.generation = 0

    @property
    def backend(self) -> str:
        if self._config.backend != "auto":
            return self._config.backend
        return "nccl" if self._device == "cuda" else "gloo"

    def _address(self) -> str:
        if self._config.master_addr:
            return self._config.master_addr
        if self._group.single_node:
            return "127.0.0.1"
        return socket.gethostbyname(socket.gethostname())

    def ensure(self, members: int) -> bool:
        """Collective over the group: make the first ``members`` ranks one torch world.

        Returns whether this rank is a member. No-op when the world already has that size.
        """
        if members == self._members:
            return self._group.rank < members
        import torch.distributed as dist

        if self._members and self._group.rank < self._members and dist.is_initialized():
            dist.destroy_process_group()
        self._members = 0
        addr = port = None
        if self._group.is_leader:
            addr = self._address()
            if self._config.master_port:
                port = self._config.master_port + self.generation
            else:
                port = _free_port("127.0.0.1" if self._group.single_node else "0.0.0.0")
        addr, port = self._group.comm.bcast((addr, port), root=0)
        self.generation += 1
        if self._group.rank >= members:
            self._members = members
            return False
        if self._config.shm_op == "skip":
            skip_shm_op()
        import deepspeed

        os.environ.update(
            rendezvous_env(
                rank=self._group.rank,
                world_size=members,
                local_rank=self._group.context.local_rank,
                master_addr=str(addr),
                master_port=int(port),
            )
        )
        deepspeed.init_distributed(
            dist_backend=self.backend,
            auto_mpi_discovery=False,
            verbose=False,
            timeout=datetime.timedelta(seconds=self._config.collective_timeout_s),
            dist_init_required=True,
        )
        self._members = members
        return True

    def close(self) -> None:
        """Leave the torch world, if this rank is in one (every member must call it before
        the next ``ensure``; not collective otherwise)."""
        import torch.distributed as dist

        if self._members and self._group.rank < self._members and dist.is_initialized():
            dist.destroy_process_group()
        self._members = 0


class _Autocast:
    """Wraps a layer so its forward runs under ``torch.autocast(dtype)`` and returns fp32:
    parameters, gradients and optimizer state stay fp32 (the engine is an fp32 engine),
    which also avoids DeepSpeed's bf16 mode failing on BatchNorm."""

    @staticmethod
    def wrap(layer: nn.Module, device: str, dtype: torch.dtype) -> nn.Module:
        from torch import nn

        class Autocast(nn.Module):
            def __init__(self, inner: nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x: Any) -> Any:
                import torch

                with torch.autocast(device_type=device, dtype=dtype):
                    out = self.inner(x)
                return out.float() if torch.is_floating_point(out) else out

        return Autocast(layer)


class TrainEngine:
    """A DeepSpeed engine over copies of one candidate's layers on the ranks of its torch
    world: data parallel (``kind == "data"``) or ``PipelineModule`` stages (``"pipeline"``).

    Build it with ``build_engine``. ``train_step`` runs one optimizer step and returns the
    loss; ``copy_back`` writes the trained weights into the original layers on the ranks
    that hold them (``owner_of`` tells which group rank holds each layer). A candidate on one
    rank trains in the evaluation core's own ``LocalEngine`` instead.
    """

    def __init__(
        self,
        *,
        kind: str,
        module: Any,
        copies: list[nn.Module],
        loss_fn: Callable[..., torch.Tensor],
        owners: list[int],
        local_layers: range,
        micro_batches: int,
        device: str,
    ) -> None:
        self.kind = kind
        self._module = module
        self._copies = copies
        self._loss_fn = loss_fn
        self._owners = owners
        self._local = local_layers
        self.micro_batches = micro_batches
        self._device = device

    @property
    def owners(self) -> list[int]:
        """Group rank holding the trained copy of each layer (the first replica's)."""
        return list(self._owners)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every parameter group (a stage of a staged plan)."""
        for group in self._module.optimizer.param_groups:
            group["lr"] = lr

    def train_step(self, batches: Iterator[Batch]) -> float:
        """One micro-batch (data parallel: an optimizer step every ``micro_batches`` calls)
        or, for a pipeline, ``micro_batches`` of them and a step."""
        if self.kind == "pipeline":
            return float(self._module.train_batch(data_iter=batches))
        x, y = next(batches)
        x, y = x.to(self._device), y.to(self._device)
        out = self._module(x)
        loss = self._loss_fn(out, y)
        self._module.backward(loss)
        self._module.step()
        return float(loss.detach())

    def copy_back(self, originals: Sequence[nn.Module], group_rank: int) -> list[int]:
        """Copy trained weights into ``originals`` for the layers this rank owns; returns
        their indices."""
        import torch

        done = []
        gathered: Any = None
        if self.kind == "data" and self._zero3:
            import deepspeed

            gathered = deepspeed.zero.GatheredParameters(list(self._module.module.parameters()))
            gathered.__enter__()
        try:
            with torch.no_grad():
                for i in self._local:
                    if self._owners[i] != group_rank:
                        continue
                    src = self._copies[i]
                    dst = originals[i]
                    for a, b in zip(dst.state_dict().values(), src.state_dict().values()):
                        if isinstance(a, torch.Tensor):
                            a.copy_(b.reshape(a.shape).to(a.dtype))
                    done.append(i)
        finally:
            if gathered is not None:
                gathered.__exit__(None, None, None)
        return done

    _zero3 = False


def _optimizer(
    name: str, params: list[Any], lr: float, weight_decay: float, momentum: float
) -> torch.optim.Optimizer:
    """A torch optimizer (DeepSpeed's config ``"Adam"`` would compile ``fused_adam``)."""
    from optuna_hpcnas.supernet._training import torch_optimizer

    return torch_optimizer(name, params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def _autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    import torch

    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"`precision` is {precision!r}, but must be 'fp32', 'bf16' or 'fp16'.")
    if precision == "fp16" and device != "cuda":
        raise ValueError("`precision` is 'fp16', which needs a GPU; use 'bf16' or 'fp32' on CPU.")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def build_engine(
    layers: Sequence[nn.Module],
    loss_fn: Callable[..., torch.Tensor],
    *,
    data_parallel: int,
    pipeline_stages: int,
    micro_batch_size: int,
    config: DistributedConfig,
    lr: float,
    weight_decay: float = 0.0,
    optimizer: str = "adam",
    momentum: float = 0.9,
    device: str = "cpu",
    group_rank: int = 0,
    precision: str = "fp32",
    accumulation_steps: int | None = None,
) -> TrainEngine:
    """A DeepSpeed engine over copies of ``layers`` (the originals are left untouched until
    ``copy_back``). The torch world (``TorchWorld.ensure``) must already hold exactly
    ``data_parallel * pipeline_stages`` ranks.

    ``accumulation_steps`` micro-batches of ``micro_batch_size`` make one optimizer step
    (DeepSpeed's ``gradient_accumulation_steps``; default: 2 x stages for a pipeline, 1
    otherwise).
    """
    import deepspeed
    import torch

    autocast = _autocast_dtype(precision, device)
    n = len(layers)
    copies = [copy.deepcopy(layer).to(device) for layer in layers]

    reset_deepspeed_groups()
    run_layers: list[nn.Module] = list(copies)
    if autocast is not None:
        # fp32 engine + autocast inside forward (DeepSpeed's own bf16 mode breaks BatchNorm)
        run_layers = [_Autocast.wrap(layer, device, autocast) for layer in copies]
    zero = config.zero_stage
    if pipeline_stages > 1:
        micro = accumulation_steps or 2 * pipeline_stages
        module, owners, local = _pipeline(
            run_layers, loss_fn, pipeline_stages, data_parallel, zero_stage=zero
        )
        kind = "pipeline"
    else:
        module = torch.nn.Sequential(*run_layers)
        micro = accumulation_steps or 1
        owners = [0] * n
        local = range(n)
        kind = "data"
    params = [p for p in module.parameters() if p.requires_grad]
    opt = _optimizer(optimizer, params, lr, weight_decay, momentum)
    ds_config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": micro,
        "zero_optimization": {"stage": zero},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=opt, config=ds_config)
    result = TrainEngine(
        kind=kind,
        module=engine,
        copies=copies,
        loss_fn=loss_fn,
        owners=owners,
        local_layers=local,
        micro_batches=micro,
        device=device,
    )
    result._zero3 = zero == 3
    return result


def _pipeline(
    layers: list[nn.Module],
    loss_fn: Callable[..., torch.Tensor],
    stages: int,
    data_parallel: int,
    *,
    zero_stage: int,
) -> tuple[Any, list[int], range]:
    """A ``PipelineModule`` over ``layers``, the group rank owning each layer's first
    replica, and the layers on this rank."""
    if zero_stage > 1:
        raise ValueError(
            f"`zero_stage` is {zero_stage}, but pipelines support ZeRO 0 or 1 only "
            "(DeepSpeed refuses ZeRO 2/3 with pipeline parallelism)."
        )
    if stages > len(layers):
        raise ValueError(
            f"The candidate asks for {stages} pipeline stages but has {len(layers)} layers."
        )
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    topo = PipeDataParallelTopology(num_pp=stages, num_dp=data_parallel)
    module = PipelineModule(
        layers=layers,
        topology=topo,
        loss_fn=loss_fn,
        partition_method="uniform",
        activation_checkpoint_interval=0,
    )
    parts = list(module.parts)
    owners = []
    for i in range(len(layers)):
        stage = max(s for s in range(stages) if parts[s] <= i)
        owners.append(topo.get_rank(pipe=stage, data=0))
    return module, owners, range(module._local_start, module._local_stop)
