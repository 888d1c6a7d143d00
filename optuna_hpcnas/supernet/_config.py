"""``SupernetTrainingConfig`` and its enums: supernet training options, without torch (the
``[training]`` table of a run configuration is this class)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from optuna_hpcnas._validation import check_bool
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas._validation import check_seed
from optuna_hpcnas._validation import check_str


class Precision(str, Enum):
    """Forward precision; parameters and optimizer state are always fp32."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class PathSampling(str, Enum):
    """Where the ``k`` paths of a batch come from."""

    UNIFORM = "uniform"
    FAIR = "fair"
    POPULATION = "population"


@dataclass(frozen=True)
class SupernetTrainingConfig:
    """Options of supernet training (``SupernetTrainingConfig(**toml_table)``).

    Args:
        paths_per_batch: ``k`` architectures sampled per batch, gradients accumulated.
        sampling: ``"uniform"`` over the space; ``"fair"``: uniform, except that the ``k``
            paths of a batch cycle through every operator of every cell in a random order,
            so each operator gets the same number of updates (FairNAS's strict fairness when
            ``k`` is the number of operators); or ``"population"``: from the architectures
            given with ``SupernetTrainer.set_population`` (uniform until one is given).
        optimizer: ``"adam"`` (AdamW-style decoupled decay off: plain Adam with L2) or
            ``"sgd"`` (Nesterov momentum); the learning rate decays on a cosine over ``epochs``.
        lr: Learning rate.
        momentum: SGD momentum (``sgd`` only).
        weight_decay: L2 penalty.
        batch_size: Samples per batch.
        epochs: Epochs of ``SupernetTrainer.fit``.
        precision: ``"fp32"``, ``"bf16"`` (CPU or GPU) or ``"fp16"`` (GPU only, loss scaling).
        grad_clip: Clip the gradient norm to this value (``0``: no clipping).
        bn_recalibration_batches: Training batches used to recompute a subnet's BatchNorm
            statistics before it is scored.
        seed: Seed of path sampling and data order.
        sandwich: The sandwich rule (BigNAS): every batch trains the largest and the
            smallest path of the space (by parameters, among 256 sampled architectures) plus
            ``paths_per_batch - 2`` sampled ones (``paths_per_batch`` must be >= 2).
        distillation: In-place distillation with ``sandwich``: the other paths of a batch
            learn ``(1 - a) * cross-entropy + a * KL(largest's soft targets || path)``,
            with ``a`` this weight (``0``: off).
        progressive_epochs: Progressive warm-up: during the first ``progressive_epochs``
            epochs a path keeps each decision of the largest path with probability
            ``1 - epoch / progressive_epochs`` and draws the others, so the space grows from
            the largest path alone to the whole space (``0``: off).
        few_shot: Few-shot supernet: after ``few_shot_epochs`` epochs of one-shot warm-up
            the supernet is split on one decision into one sub-supernet per choice, each
            owning the operators of its branch and trained only on its paths. ``""``: off;
            ``"auto"``: the decision whose choices' gradients on the shared weights disagree
            most (``supernet.decision_disagreement``); or a decision name
            (``"node.stem"``, ``"node.cell0.op"``, ``"node.topology"``, ``"node.head"``).
        few_shot_epochs: One-shot epochs before the split.
        few_shot_max_parts: ``"auto"`` considers only decisions with at most this many
            choices.
    """

    paths_per_batch: int = 10
    sampling: str = "uniform"
    optimizer: str = "adam"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 3e-4
    batch_size: int = 64
    epochs: int = 10
    precision: str = "fp32"
    grad_clip: float = 5.0
    bn_recalibration_batches: int = 4
    seed: int = 0
    sandwich: bool = False
    distillation: float = 0.0
    progressive_epochs: int = 0
    few_shot: str = ""
    few_shot_epochs: int = 2
    few_shot_max_parts: int = 8

    def __post_init__(self) -> None:
        for name in ("paths_per_batch", "batch_size"):
            check_int(name, getattr(self, name), 1)
        for name in (
            "epochs",
            "bn_recalibration_batches",
            "progressive_epochs",
            "few_shot_epochs",
        ):
            check_int(name, getattr(self, name), 0)
        check_int("few_shot_max_parts", self.few_shot_max_parts, 2)
        check_seed("seed", self.seed)
        check_number("lr", self.lr)
        for name in ("momentum", "weight_decay", "grad_clip", "distillation"):
            check_number(name, getattr(self, name), positive=False, minimum=0)
        check_bool("sandwich", self.sandwich)
        if self.sandwich and self.paths_per_batch < 2:
            raise ValueError(
                f"`paths_per_batch` is {self.paths_per_batch}, but the sandwich rule needs >= 2 "
                "(the largest and the smallest path)."
            )
        if self.distillation > 1:
            raise ValueError(f"`distillation` is {self.distillation}, but must be <= 1.")
        if self.distillation > 0 and not self.sandwich:
            raise ValueError(
                f"`distillation` is {self.distillation}, but in-place distillation learns from "
                "the largest path: set `sandwich = true` too."
            )
        check_str("few_shot", self.few_shot)
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"`optimizer` is {self.optimizer!r}, but must be 'adam' or 'sgd'.")
        if self.momentum >= 1:
            raise ValueError(f"`momentum` is {self.momentum}, but must be < 1.")
        try:
            Precision(self.precision)
        except ValueError:
            raise ValueError(
                f"`precision` is {self.precision!r}, but must be one of "
                f"{[p.value for p in Precision]}."
            ) from None
        try:
            PathSampling(self.sampling)
        except ValueError:
            raise ValueError(
                f"`sampling` is {self.sampling!r}, but must be one of "
                f"{[s.value for s in PathSampling]}."
            ) from None
