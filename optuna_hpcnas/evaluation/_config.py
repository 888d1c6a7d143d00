"""``ObjectiveConfig``: what a trial returns and how its candidate is fine-tuned.

One dataclass for the Python API (``SupernetObjective(config=...)``) and the ``[objective]``
table of ``hpcnas run``: the two take the same fields, with the same defaults and checks.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

from optuna_hpcnas._validation import check_choice
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas.supernet import Precision

OBJECTIVES = ("accuracy", "loss", "flops", "params", "latency")
DIRECTIONS = {
    "accuracy": "maximize",
    "loss": "minimize",
    "flops": "minimize",
    "params": "minimize",
    "latency": "minimize",
}
# Hard limits (``trial.set_constraint``) and the cost each one bounds.
LIMITS = {"max_flops": "flops", "max_params": "params", "max_latency_s": "latency"}
LATENCY_SOURCES = ("measured", "predicted", "onnx-int8")
OPTIMIZERS = ("adam", "sgd")
PRECISIONS = tuple(p.value for p in Precision)


@dataclass(frozen=True)
class ObjectiveConfig:
    """Options of the evaluation of one trial (``ObjectiveConfig(**toml_table)``).

    Args:
        objectives: What a trial returns: ``("accuracy",)`` (scalarised with the weights
            below) or several of ``accuracy``, ``loss``, ``flops``, ``params``, ``latency``
            for a multi-objective study (``directions`` gives the matching directions).
        flops_weight: ``l1`` of ``accuracy + l1 * log(1 / FLOPs) + l2 * log(1 / latency)``.
        latency_weight: ``l2`` of the same.
        latency: ``"measured"`` (median of timed torch forwards of the subnet),
            ``"predicted"`` (per-layer lookup table) or ``"onnx-int8"`` (median batch-1
            onnxruntime latency of the subnet quantized to INT8, as it will be deployed; the
            per-layer predictor is then fitted on those measurements as the search goes, and
            needs the ``deploy`` extra) as the latency objective; all are recorded.
        max_flops: Hard limit through ``trial.set_constraint`` (``None``: none).
        max_params: Hard limit on parameters.
        max_latency_s: Hard limit on latency (seconds).
        batch_size: Fine-tuning batch size (one optimizer step per batch).
        optimizer: Fine-tuning optimizer, ``"sgd"`` (Nesterov; the learning rates of the
            default stages are meant for it) or ``"adam"``; the learning rate comes from the
            stage.
        momentum: SGD momentum of fine-tuning.
        weight_decay: L2 penalty of fine-tuning.
        max_batches_per_epoch: Cap on fine-tuning batches per epoch (``None``: the whole set).
        last_stage: Name of the last stage to run; default: every stage when the study has a
            ``StagedPruner`` (it stops trials early), else the second stage (or the only one).
        latency_repeats: Timed forwards per latency measurement.
        on_nan: ``"fail"`` (the trial fails) or ``"prune"`` on a non-finite loss.
        population_steps: Supernet training steps before each trial, with ``k`` paths drawn
            from the live population (the last ``population_size`` finished trials), so the
            shared weights keep learning where the search goes.
        population_size: Size of that population.
        skip_infeasible: Do not fine-tune a candidate that breaks a hard limit: it ends with
            its inherited score (and its constraint values), no epochs spent.
        stage_schedule: ``"cosine"`` (each stage anneals its ``lr`` to 0 over its batches, so a
            stage's score is read at a settled point; the default) or ``"constant"`` (each
            stage at its ``lr``). In ``bench/staged_pruning.py --seeds 0,1,2`` cosine stages
            kept the best of 30 candidates on 2 of 3 seeds, constant ones on 1, both saving
            82-84 % of the epochs.
    """

    objectives: tuple[str, ...] = ("accuracy",)
    flops_weight: float = 0.0
    latency_weight: float = 0.0
    latency: str = "measured"
    max_flops: float | None = None
    max_params: float | None = None
    max_latency_s: float | None = None
    batch_size: int = 64
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    max_batches_per_epoch: int | None = None
    last_stage: str | None = None
    latency_repeats: int = 10
    on_nan: str = "fail"
    population_steps: int = 0
    population_size: int = 20
    skip_infeasible: bool = True
    stage_schedule: str = "cosine"

    def __post_init__(self) -> None:
        objectives = (
            (self.objectives,) if isinstance(self.objectives, str) else tuple(self.objectives)
        )
        object.__setattr__(self, "objectives", objectives)
        if not objectives:
            raise ValueError("`objectives` is empty; give at least one.")
        for name in objectives:
            if name not in OBJECTIVES:
                raise ValueError(
                    f"`objectives` contains {name!r}, but must hold values of {list(OBJECTIVES)}."
                )
        if len(set(objectives)) != len(objectives):
            raise ValueError(f"`objectives` has duplicates: {list(objectives)}.")
        for name in ("flops_weight", "latency_weight", "weight_decay"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"`{name}` is {value!r}, but must be a finite number >= 0.")
        if (self.flops_weight or self.latency_weight) and objectives != ("accuracy",):
            raise ValueError(
                "`flops_weight`/`latency_weight` scalarise a single 'accuracy' objective; "
                f"with objectives {list(objectives)} use a multi-objective study instead."
            )
        check_choice("latency", self.latency, LATENCY_SOURCES)
        for name in LIMITS:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    f"`{name}` is {value!r}, but must be a finite number > 0 or None."
                )
        for name in ("batch_size", "latency_repeats", "population_size"):
            check_int(name, getattr(self, name), 1)
        check_int("population_steps", self.population_steps, 0)
        check_int("max_batches_per_epoch", self.max_batches_per_epoch, 1, allow_none=True)
        check_number("momentum", self.momentum, positive=False)
        if not 0 <= self.momentum < 1:
            raise ValueError(f"`momentum` is {self.momentum!r}, but must be in [0, 1).")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("on_nan", self.on_nan, ("fail", "prune"))
        check_choice("stage_schedule", self.stage_schedule, ("constant", "cosine"))
        if self.last_stage is not None and not isinstance(self.last_stage, str):
            raise TypeError(f"`last_stage` must be a stage name, but got {self.last_stage!r}.")
        if not isinstance(self.skip_infeasible, bool):
            raise TypeError(f"`skip_infeasible` must be a bool, but got {self.skip_infeasible!r}.")

    @property
    def directions(self) -> list[str]:
        """Study directions matching ``objectives``."""
        return [DIRECTIONS[name] for name in self.objectives]


@dataclass(frozen=True)
class ScratchTrainingConfig:
    """Options of ``train_from_scratch`` and ``train_model`` (a TOML table maps onto it as
    ``Cls(**table)``; ``[export]`` is this class).

    Adam with a cosine-decayed learning rate, no warm-up, through the supernet's
    ``train_step``.

    Args:
        grad_clip: Clip the gradient norm to this value (``0``: no clipping).
        precision: Forward precision, ``"fp32"``, ``"bf16"`` (CPU or GPU) or ``"fp16"`` (GPU
            only, with loss scaling); parameters and optimizer state stay fp32.
    """

    epochs: int = 5
    lr: float = 2e-2
    batch_size: int = 32
    weight_decay: float = 1e-4
    seed: int = 0
    latency_repeats: int = 20
    grad_clip: float = 0.0
    precision: str = "fp32"

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
        check_number("grad_clip", self.grad_clip, positive=False)
        if self.grad_clip < 0:
            raise ValueError(f"`grad_clip` is {self.grad_clip!r}, but must be >= 0.")
        check_choice("precision", self.precision, PRECISIONS)
