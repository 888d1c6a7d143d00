"""Single-path one-shot training of a ``SuperNet``.

Every batch samples ``k`` architectures (paths), runs the batch through each and accumulates
the gradients before one optimizer step, so the shared weights learn to serve many paths while
the memory stays that of one path (each path's graph is freed by its ``backward``).

Mixed precision: bf16 autocast on CPU or GPU; fp16 autocast with a ``GradScaler`` on GPU only.
Parameters, gradients and optimizer state stay fp32 (autocast casts copies for the forward).

``train_step`` is one step on a given model / optimizer / batch, separate from the loop, so the
distributed evaluator can run it under its own engine. ``SupernetTrainer.state_dict()`` holds
only tensors and plain Python values (no pickled objects) for the checkpoint code.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
import contextlib
import copy
from dataclasses import dataclass
import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from optuna_hpcnas.data import iterate_batches
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.supernet._config import PathSampling
from optuna_hpcnas.supernet._config import Precision
from optuna_hpcnas.supernet._config import SupernetTrainingConfig
from optuna_hpcnas.supernet._few_shot import decision_disagreement
from optuna_hpcnas.supernet._few_shot import FewShotSuperNet
from optuna_hpcnas.supernet._few_shot import split_candidates
from optuna_hpcnas.supernet._paths import extreme_architectures
from optuna_hpcnas.supernet._paths import progressive_path
from optuna_hpcnas.supernet._supernet import SuperNet

_logger = logging.getLogger(__name__)

PathSampler = Callable[[np.random.Generator, int], Sequence[Architecture]]


def autocast_context(
    precision: Precision | str, device: torch.device | str
) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of ``precision`` on ``device`` (a no-op for fp32)."""
    precision = Precision(precision)
    device_type = torch.device(device).type
    if precision == Precision.FP32:
        return contextlib.nullcontext()
    if precision == Precision.FP16 and device_type != "cuda":
        raise ValueError("fp16 runs on a GPU only (with a loss scaler); use bf16 on a CPU.")
    dtype = torch.bfloat16 if precision == Precision.BF16 else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


def cosine_lr(lr: float, done: float, total: float) -> float:
    """The learning rate after ``done`` of ``total`` steps (or epochs, fractions allowed) of
    a half-cosine decay from ``lr`` to 0, without warm-up; ``lr`` at ``done = 0``, ``lr / 2``
    halfway, 0 from ``done = total`` on. The one schedule of the supernet warm-up, the
    fine-tuning stages and stand-alone training.
    """
    if not total > 0:
        raise ValueError(f"`total` is {total!r}, but must be > 0.")
    return 0.5 * lr * (1 + math.cos(math.pi * min(done / total, 1.0)))


@dataclass(frozen=True)
class StepResult:
    """Outcome of one ``train_step``: mean loss of the paths, and whether it was finite."""

    loss: float
    finite: bool
    paths: int


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    archs: Sequence[Architecture | None],
    *,
    precision: Precision | str = Precision.FP32,
    scaler: torch.amp.GradScaler | None = None,
    grad_clip: float = 0.0,
    distillation: float = 0.0,
) -> StepResult:
    """One optimizer step with gradients accumulated over ``archs`` on the batch ``(x, y)``.

    ``model(x, arch)`` is called per path (``model(x)`` for a ``None`` path, e.g. a plain
    subnet). A non-finite loss skips the update (the gradients are dropped) and is reported
    in the result, so the caller decides whether to fail the trial. ``distillation = a > 0``:
    the first path is the teacher (in-place distillation); every later path learns
    ``(1 - a) * cross-entropy + a * KL(teacher's soft targets || path)``.
    """
    if not archs:
        raise ValueError("`archs` is empty; give at least one path.")
    optimizer.zero_grad(set_to_none=True)
    k = len(archs)
    total = 0.0
    finite = True
    autocast = autocast_context(precision, x.device)
    soft_targets: torch.Tensor | None = None
    for arch in archs:
        with autocast:
            logits = model(x) if arch is None else model(x, arch)
            loss = F.cross_entropy(logits.float(), y)
            if soft_targets is not None:
                kl = F.kl_div(
                    F.log_softmax(logits.float(), dim=1), soft_targets, reduction="batchmean"
                )
                loss = (1 - distillation) * loss + distillation * kl
            elif distillation > 0:
                soft_targets = F.softmax(logits.detach().float(), dim=1)
            loss = loss / k
        value = float(loss.detach())  # the one host sync of the path (logged and checked)
        if not math.isfinite(value):
            finite = False
            total = float("nan")
            break
        total += value * k
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return StepResult(float("nan"), False, k)
    if scaler is not None:
        scaler.unscale_(optimizer)
    if grad_clip > 0:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return StepResult(total / k, True, k)


def recalibrate_batch_norm(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    forward: Callable[[torch.Tensor], Any] | None = None,
) -> int:
    """Recompute the BatchNorm running statistics of ``model`` as the plain average over
    ``batches`` (train-mode forwards, no gradients). Returns the number of batches used.

    Shared BatchNorm statistics are a mixture over all paths; a subnet is scored with its own.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return 0
    saved = [m.momentum for m in norms]
    was_training = model.training
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average
    model.train()
    used = 0
    try:
        with torch.no_grad():
            for x, _ in batches:
                (forward or model)(x)
                used += 1
    finally:
        model.train(was_training)
        for m, momentum in zip(norms, saved):
            m.momentum = momentum
    return used


def torch_optimizer(
    name: str, params: Iterable[Any], *, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """``"adam"`` (Adam with L2) or ``"sgd"`` (Nesterov when ``momentum > 0``): the one
    optimizer factory of the supernet, the fine-tuning core and the engines (a torch
    optimizer also keeps DeepSpeed from compiling ``fused_adam``)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name != "sgd":
        raise ValueError(f"`optimizer` is {name!r}, but must be 'adam' or 'sgd'.")
    return torch.optim.SGD(
        params, lr=lr, momentum=momentum, nesterov=momentum > 0, weight_decay=weight_decay
    )


def make_optimizer(
    params: Iterable[nn.Parameter], config: SupernetTrainingConfig
) -> torch.optim.Optimizer:
    """The fp32 optimizer of ``config`` (its state stays fp32 under autocast)."""
    return torch_optimizer(
        config.optimizer,
        params,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )


class SupernetTrainer:
    """The training loop of a ``SuperNet`` (single-path one-shot, ``k`` paths per batch).

    Args:
        supernet: The network to train (moved to ``device``).
        config: Training options.
        device: ``"cpu"`` or a CUDA device.

    Examples:
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> from optuna_hpcnas.data import load_digits_task
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> data = load_digits_task()
        >>> net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
        >>> trainer = SupernetTrainer(net, SupernetTrainingConfig(paths_per_batch=2, epochs=1))
        >>> history = trainer.fit(data.train, max_batches=3)
        >>> len(history)
        1
    """

    def __init__(
        self,
        supernet: SuperNet | FewShotSuperNet,
        config: SupernetTrainingConfig | None = None,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        if not isinstance(supernet, (SuperNet, FewShotSuperNet)):
            raise TypeError(f"`supernet` must be a SuperNet, but got {type(supernet).__name__}.")
        self.config = config if config is not None else SupernetTrainingConfig()
        if not isinstance(self.config, SupernetTrainingConfig):
            raise TypeError(f"`config` must be a SupernetTrainingConfig, but got {config!r}.")
        self.device = torch.device(device)
        self.precision = Precision(self.config.precision)
        if self.precision == Precision.FP16 and self.device.type != "cuda":
            raise ValueError("`precision` is 'fp16', which needs a GPU; use 'bf16' on a CPU.")
        self.supernet = supernet.to(self.device)
        self.space = supernet.space
        self.optimizer = make_optimizer(supernet.parameters(), self.config)
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == Precision.FP16 else None
        self._rng = np.random.default_rng(self.config.seed)
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._population: list[Architecture] = []
        self._extremes: tuple[Architecture, Architecture] | None = None
        # Which decision each choice disagrees on, when ``few_shot = "auto"`` measured it.
        self.disagreement: dict[str, float] = {}
        few_shot = self.config.few_shot
        if few_shot and few_shot != "auto":
            candidates = split_candidates(self.space, max_parts=1 << 30)
            if few_shot not in candidates:
                raise ValueError(
                    f"`few_shot` is {few_shot!r}, but must be '', 'auto' or one of {candidates}."
                )
        self.steps = 0
        self.epochs_done = 0
        self.skipped_steps = 0

    # ------------------------------------------------------------------ paths
    def set_population(self, archs: Iterable[Architecture]) -> None:
        """The live population that ``sampling="population"`` draws paths from."""
        self._population = list(archs)

    @property
    def extremes(self) -> tuple[Architecture, Architecture]:
        """``(largest, smallest)`` path of the space (``extreme_architectures``), found once
        with a generator of its own so that the path stream does not depend on it."""
        if self._extremes is None:
            rng = np.random.default_rng([self.config.seed, 1])
            self._extremes = extreme_architectures(self.supernet, rng)
        return self._extremes

    def sample_paths(self, k: int | None = None) -> list[Architecture]:
        """The paths of one batch: ``[largest, smallest, k - 2 others]`` under the sandwich
        rule, else ``k`` from ``sampling`` (near the largest path during a progressive
        warm-up)."""
        k = self.config.paths_per_batch if k is None else k
        sandwich = self.config.sandwich and k >= 2
        others = k - 2 if sandwich else k
        grown = self.epochs_done / max(self.config.progressive_epochs, 1)
        if self.config.progressive_epochs and grown < 1:
            largest = self.extremes[0]
            paths = [
                progressive_path(self.space, largest, self._rng, keep=1 - grown)
                for _ in range(others)
            ]
        else:
            paths = self._sampled_paths(others)
        return [*self.extremes, *paths] if sandwich else paths

    def _sampled_paths(self, k: int) -> list[Architecture]:
        if k == 0:
            return []
        sampling = PathSampling(self.config.sampling)
        if sampling == PathSampling.POPULATION and self._population:
            idx = self._rng.integers(len(self._population), size=k)
            return [self._population[int(i)] for i in idx]
        if sampling == PathSampling.FAIR:
            return self._fair_paths(k)
        return [self.space.sample(self._rng) for _ in range(k)]

    def _fair_paths(self, k: int) -> list[Architecture]:
        space = self.space
        names = {d.name for d in space.decisions}
        paths = []
        orders = {}
        for i in range(space.num_cells):
            name = f"node.cell{i}.op"
            if name in names and not space.decision(name).is_constant:
                choices = space.decision(name).choices
                orders[i] = [choices[int(j)] for j in self._rng.permutation(len(choices))]
        for j in range(k):
            params = space.to_params(space.sample(self._rng))
            for i, order in orders.items():
                prefix, op = f"node.cell{i}.", order[j % len(order)]
                if params[prefix + "op"] == op:
                    continue
                for key in [key for key in params if key.startswith(prefix)]:
                    del params[key]
                params[prefix + "op"] = op
                for d in space.decisions:
                    if (
                        d.name.startswith(prefix)
                        and d.parent == prefix + "op"
                        and not d.is_constant
                        and d.active_when is not None
                        and op in d.active_when
                    ):
                        params[d.name] = d.choices[int(self._rng.integers(len(d.choices)))]
            paths.append(space.from_params(params))
        return paths

    # ------------------------------------------------------------------ loop
    def _lr_at(self, epoch: float) -> float:
        return cosine_lr(self.config.lr, epoch, max(self.config.epochs, 1))

    def train_epoch(self, dataset: Any, *, max_batches: int | None = None) -> float:
        """One epoch over ``dataset`` (cosine-decayed learning rate); the mean path loss.
        The epoch after ``few_shot_epochs`` starts by splitting the supernet."""
        if (
            self.config.few_shot
            and not isinstance(self.supernet, FewShotSuperNet)
            and self.epochs_done >= self.config.few_shot_epochs
        ):
            self.split(dataset)
        self.supernet.train()
        losses = []
        batches = list(
            iterate_batches(
                dataset, self.config.batch_size, shuffle=True, generator=self._generator
            )
        )
        if max_batches is not None:
            batches = batches[:max_batches]
        for b, (x, y) in enumerate(batches):
            for group in self.optimizer.param_groups:
                group["lr"] = self._lr_at(self.epochs_done + b / max(len(batches), 1))
            result = self.step(x, y)
            if result.finite:
                losses.append(result.loss)
        self.epochs_done += 1
        return float(np.mean(losses)) if losses else float("nan")

    def step(self, x: torch.Tensor, y: torch.Tensor) -> StepResult:
        """One optimizer step of the shared weights on ``(x, y)`` with ``k`` sampled paths
        (at the optimizer's current learning rate); a non-finite loss skips the update."""
        result = train_step(
            self.supernet,
            self.optimizer,
            x.to(self.device),
            y.to(self.device),
            self.sample_paths(),
            precision=self.precision,
            scaler=self.scaler,
            grad_clip=self.config.grad_clip,
            distillation=self.config.distillation if self.config.sandwich else 0.0,
        )
        self.steps += 1
        if not result.finite:
            self.skipped_steps += 1
            _logger.warning("Non-finite supernet loss at step %d; update skipped.", self.steps)
        return result

    def train_steps(self, dataset: Any, steps: int) -> None:
        """``steps`` more steps on shuffled batches of ``dataset`` (the population steps of a
        trial: the shared weights keep learning where the search goes)."""
        self.supernet.train()
        batches = iterate_batches(
            dataset, self.config.batch_size, shuffle=True, generator=self._generator
        )
        for _, (x, y) in zip(range(steps), batches):
            self.step(x, y)

    def fit(
        self, dataset: Any, *, epochs: int | None = None, max_batches: int | None = None
    ) -> list[float]:
        """``epochs`` (default ``config.epochs``) epochs; the mean loss of each."""
        n = self.config.epochs if epochs is None else epochs
        history = []
        for _ in range(n):
            history.append(self.train_epoch(dataset, max_batches=max_batches))
            _logger.info("supernet epoch %d: loss %.4f", self.epochs_done, history[-1])
        return history

    def split(self, dataset: Any) -> str:
        """Split the supernet into a ``FewShotSuperNet`` on the configured decision (for
        ``"auto"``, the one of highest ``decision_disagreement`` on two batches of
        ``dataset``); the optimizer starts afresh over the parts. Returns the decision."""
        decision = self.config.few_shot
        if decision == "auto":
            generator = torch.Generator().manual_seed(self.config.seed + 1)
            batches = iterate_batches(
                dataset, self.config.batch_size, shuffle=True, generator=generator
            )
            self.disagreement = decision_disagreement(
                self.supernet,  # type: ignore[arg-type]
                [(x.to(self.device), y.to(self.device)) for _, (x, y) in zip(range(2), batches)],
                np.random.default_rng([self.config.seed, 2]),
                decisions=split_candidates(self.space, self.config.few_shot_max_parts),
            )
            decision = max(self.disagreement, key=self.disagreement.__getitem__)
            _logger.info(
                "few-shot split on %s (gradient disagreement %s)",
                decision,
                ", ".join(f"{k} {v:.3f}" for k, v in self.disagreement.items()),
            )
        self.split_on(decision)
        return decision

    def split_on(self, decision: str) -> None:
        """Split the supernet on ``decision`` (a restored few-shot checkpoint is split the
        same way before its weights are loaded)."""
        if not isinstance(self.supernet, SuperNet):
            raise ValueError(f"The supernet is already split on {self.supernet.decision!r}.")
        self.supernet = FewShotSuperNet.split(self.supernet, decision).to(self.device)
        self.optimizer = make_optimizer(self.supernet.parameters(), self.config)

    # ------------------------------------------------------------------ scoring
    def subnet(self, arch: Architecture) -> nn.Module:
        """``supernet.subnet(arch)`` on the trainer's device, its shared weights as trained."""
        return self.supernet.subnet(arch).to(self.device)

    def calibrated_subnet(self, arch: Architecture, dataset: Any) -> nn.Module:
        """``subnet(arch)`` with BatchNorm statistics recomputed on ``dataset``."""
        sub = self.subnet(arch)
        generator = torch.Generator().manual_seed(self.config.seed)
        batches = iterate_batches(
            dataset, self.config.batch_size, shuffle=True, generator=generator
        )
        limited = (b for _, b in zip(range(self.config.bn_recalibration_batches), batches))
        recalibrate_batch_norm(sub, ((x.to(self.device), y) for x, y in limited))
        return sub.eval()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """A snapshot of the weights, optimizer state and RNG states, as tensors and plain
        values (no pickled objects): later training does not change it.
        """
        bit = self._rng.bit_generator.state
        return {
            "supernet": {k: v.detach().clone() for k, v in self.supernet.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "rng": {
                "numpy": {
                    "bit_generator": bit["bit_generator"],
                    "state": int(bit["state"]["state"]),
                    "inc": int(bit["state"]["inc"]),
                    "has_uint32": int(bit["has_uint32"]),
                    "uinteger": int(bit["uinteger"]),
                },
                "torch": self._generator.get_state(),
            },
            "steps": self.steps,
            "epochs_done": self.epochs_done,
            "skipped_steps": self.skipped_steps,
            "population": [a.to_json() for a in self._population],
            "few_shot": self.supernet.decision
            if isinstance(self.supernet, FewShotSuperNet)
            else "",
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("few_shot") and not isinstance(self.supernet, FewShotSuperNet):
            self.split_on(str(state["few_shot"]))
        self.supernet.load_state_dict(state["supernet"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]["numpy"]
        self._rng.bit_generator.state = {
            "bit_generator": rng["bit_generator"],
            "state": {"state": int(rng["state"]), "inc": int(rng["inc"])},
            "has_uint32": int(rng["has_uint32"]),
            "uinteger": int(rng["uinteger"]),
        }
        self._generator.set_state(state["rng"]["torch"])
        self.steps = int(state["steps"])
        self.epochs_done = int(state["epochs_done"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self._population = [Architecture.from_json(a) for a in state.get("population", [])]
