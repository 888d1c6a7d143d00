"""``ObjectiveConfig``: what a trial returns and how its candidate is fine-tuned.

One dataclass for the Python API (``SupernetObjective(config=...)``) and the ``[objective]``
table of ``hpcnas run``: the two take the same fields, with the same defaults and checks.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

from optuna_hpcnas._validation import check_bool
from optuna_hpcnas._validation import check_choice
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas._validation import check_seed
from optuna_hpcnas._validation import check_str
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
VALIDATIONS = ("auto", "holdout", "cross-validation")
MODES = ("multi-fidelity", "one-shot")
AUTO = "auto"
# The time-series literature trains on batches of min(N / 10, 16) (Wang et al. 2017, Fawaz et
# al. 2019); larger sets go up to 64, which keeps two CPU cores busy.
AUTO_BATCH_RANGE = (4, 64)


def resolve_batch_size(
    batch_size: int | str, samples: int, *, largest: int = AUTO_BATCH_RANGE[1]
) -> int:
    """The batch size a recipe trains ``samples`` examples with: ``"auto"`` is a tenth of
    them within ``AUTO_BATCH_RANGE``, its top lowered to ``largest`` if that is smaller; a
    given size is kept. Never more than the samples, and at least 2 when there are 2
    (BatchNorm needs two values per channel).

    Examples:
        >>> [resolve_batch_size("auto", n) for n in (3, 40, 160, 3200)]
        [3, 4, 16, 64]
        >>> resolve_batch_size("auto", 3200, largest=16)
        16
    """
    low, high = AUTO_BATCH_RANGE[0], min(AUTO_BATCH_RANGE[1], largest)
    size = min(max(samples // 10, low), high) if batch_size == AUTO else int(batch_size)
    return max(min(size, samples), min(2, samples))


def lr_scale(batch_size: int | str, resolved: int) -> float:
    """The factor an ``"auto"`` batch scales learning rates by: ``sqrt(resolved / 64)``.

    Learning rates and step budgets of a recipe whose batch follows the data are stated for
    batches of 64 (the top of ``AUTO_BATCH_RANGE``, what large data sets get). Rates are
    scaled with the square root of the batch, the rule for Adam (Malladi et al. 2022, "On
    the SDEs and scaling rules for adaptive gradient algorithms"): 4e-3 at 64 is 1e-3 at 4;
    and budgets by the inverse, so that a smaller rate travels the same distance (2,000
    steps at 64 are 8,000 at 4, cheap steps on a small set). A batch size given as a number
    keeps its rates and budgets as written.

    Examples:
        >>> lr_scale("auto", 64), lr_scale("auto", 4), lr_scale(32, 32)
        (1.0, 0.25, 1.0)
    """
    if batch_size != AUTO:
        return 1.0
    return math.sqrt(resolved / AUTO_BATCH_RANGE[1])


def _check_batch_size(name: str, value: object) -> None:
    if value == AUTO:
        return
    if isinstance(value, str):
        raise ValueError(f"`{name}` is {value!r}, but must be an int >= 2 or 'auto'.")
    check_int(name, value, 2)


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
            needs the ``deploy`` extra) as the latency objective; all are recorded (a
            one-shot trial scored by inherited weights alone times its forwards only where
            latency is an objective, a weight or a limit: the predicted one is recorded).
        max_flops: Hard limit through ``trial.set_constraint`` (``None``: none).
        max_params: Hard limit on parameters.
        max_latency_s: Hard limit on latency (seconds).
        batch_size: Fine-tuning batch size (one optimizer step per batch), or ``"auto"``: a
            tenth of the training samples, 4 to 64 (``resolve_batch_size``); the stages'
            learning rates are then those of a batch of 64, scaled by ``lr_scale``.
        optimizer: Fine-tuning optimizer, ``"sgd"`` (Nesterov; the learning rates of the
            default stages are meant for it) or ``"adam"``; the learning rate comes from the
            stage.
        momentum: SGD momentum of fine-tuning.
        weight_decay: L2 penalty of fine-tuning.
        last_stage: Name of the last stage to run; default: every stage when the study has a
            ``StagedPruner`` (it stops trials early), else the second stage (or the only one).
        latency_repeats: Timed forwards per latency measurement.
        on_nan: ``"fail"`` (the trial fails) or ``"prune"`` on a non-finite loss.
        population_steps: Supernet training steps before each trial, with ``k`` paths drawn
            from the live population (the last ``population_size`` finished trials), so the
            shared weights keep learning where the search goes.
        population_size: Size of that population.
        skip_infeasible: Do not fine-tune a candidate that breaks a hard limit: it ends with
            its inherited score (and its constraint values), no steps spent.
        stage_schedule: ``"cosine"`` (each stage anneals its ``lr`` to 0 over its batches, so a
            stage's score is read at a settled point; the default) or ``"constant"`` (each
            stage at its ``lr``).
        validation: How a candidate is scored: ``"holdout"`` (the validation split),
            ``"cross-validation"`` (``folds`` stratified folds of train + validation, one model
            per fold trained side by side, their predictions pooled) or ``"auto"``:
            cross-validation when the validation split has fewer than 50 samples or fewer than
            5 of some class, else holdout. A trial's value is its value at its last step (the
            end of its last stage, or where early stopping or the time cap ended it), never
            the best on the way; accuracy ties are broken by the log-loss.
        folds: Folds of cross-validation.
        max_trial_seconds: Wall-clock seconds one candidate may train; past them it is
            pruned where it is (``None``: no cap). Published models enqueued by name
            (``reference_model``) and one-shot finalists stop there too but complete, with
            their validation value at that step (they are never pruned).
        precise_batch_norm: Recompute BatchNorm's statistics on up to 512 training samples
            of the fold before every validation (trained on batches of 4, the running
            averages are noise). A one-shot candidate scored by inherited weights alone is
            recalibrated on the supernet's ``bn_recalibration_batches`` instead.
        mode: ``"multi-fidelity"``: every candidate is fine-tuned stage by stage (the
            pruner stops the weak); ``"one-shot"``: a candidate is scored by the supernet's
            weights alone (BatchNorm recalibrated, then validated; no fine-tuning), except
            the finalists (``enqueue_finalists``) and the published models enqueued by name,
            which go through the stages. For spaces whose subnets are slices of one another
            (``signal-elastic``, ``digits-elastic``) trained with the sandwich rule.
        finalists: One-shot mode under ``hpcnas run``: the last ``finalists`` trials of the
            budget (``[study] n_trials``) are the best inherited candidates not trained yet,
            trained through the stages (the Python API queues them with
            ``enqueue_finalists``).
        finalists_share: One-shot mode under ``hpcnas run`` with a ``timeout``: from this
            share of the timeout before its end, every trial is a finalist until
            ``finalists`` have started.
    """

    objectives: tuple[str, ...] = ("accuracy",)
    flops_weight: float = 0.0
    latency_weight: float = 0.0
    latency: str = "measured"
    max_flops: float | None = None
    max_params: float | None = None
    max_latency_s: float | None = None
    batch_size: int | str = AUTO
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    last_stage: str | None = None
    latency_repeats: int = 10
    on_nan: str = "fail"
    population_steps: int = 0
    population_size: int = 20
    skip_infeasible: bool = True
    stage_schedule: str = "cosine"
    validation: str = AUTO
    folds: int = 5
    max_trial_seconds: float | None = None
    precise_batch_norm: bool = True
    mode: str = "multi-fidelity"
    finalists: int = 8
    finalists_share: float = 0.25

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
            check_number(name, getattr(self, name), positive=False, minimum=0)
        if (self.flops_weight or self.latency_weight) and objectives != ("accuracy",):
            raise ValueError(
                "`flops_weight`/`latency_weight` scalarise a single 'accuracy' objective; "
                f"with objectives {list(objectives)} use a multi-objective study instead."
            )
        check_choice("latency", self.latency, LATENCY_SOURCES)
        for name in LIMITS:
            check_number(name, getattr(self, name), allow_none=True)
        _check_batch_size("batch_size", self.batch_size)
        for name in ("latency_repeats", "population_size"):
            check_int(name, getattr(self, name), 1)
        check_int("population_steps", self.population_steps, 0)
        check_choice("validation", self.validation, VALIDATIONS)
        check_choice("mode", self.mode, MODES)
        check_int("finalists", self.finalists, 0)
        check_number("finalists_share", self.finalists_share, positive=False)
        if not 0 <= self.finalists_share < 1:
            raise ValueError(
                f"`finalists_share` is {self.finalists_share!r}, but must be in [0, 1)."
            )
        if self.mode == "one-shot" and self.validation == "cross-validation":
            raise ValueError(
                "`mode` is 'one-shot', which scores candidates with the supernet's weights, "
                "but `validation` is 'cross-validation', under which no supernet is trained "
                "(its weights would see every fold); use 'holdout' or 'auto'."
            )
        check_int("folds", self.folds, 2, maximum=20)
        check_number("max_trial_seconds", self.max_trial_seconds, allow_none=True)
        check_bool("precise_batch_norm", self.precise_batch_norm)
        check_number("momentum", self.momentum, positive=False)
        if not 0 <= self.momentum < 1:
            raise ValueError(f"`momentum` is {self.momentum!r}, but must be in [0, 1).")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("on_nan", self.on_nan, ("fail", "prune"))
        check_choice("stage_schedule", self.stage_schedule, ("constant", "cosine"))
        check_str("last_stage", self.last_stage, what="a stage name", allow_none=True)
        check_bool("skip_infeasible", self.skip_infeasible)

    @property
    def directions(self) -> list[str]:
        """Study directions matching ``objectives``."""
        return [DIRECTIONS[name] for name in self.objectives]


@dataclass(frozen=True)
class TrainingSchedule:
    """What a recipe trains a data set with (``ScratchTrainingConfig.schedule``): its batch,
    the ``lr_scale`` of that batch, and the steps and starting rate scaled by it."""

    batch_size: int
    scale: float
    steps: int
    lr: float


@dataclass(frozen=True)
class ScratchTrainingConfig:
    """Options of ``train_from_scratch`` and ``train_model`` (a TOML table maps onto it as
    ``Cls(**table)``; ``[export]`` is this class).

    Adam with a cosine-decayed learning rate, no warm-up, through the supernet's
    ``train_step``, for a budget of optimisation steps (never epochs: the same recipe must
    train 40 series and 40,000).

    Args:
        steps: Optimisation steps (with ``batch_size = "auto"``, steps of a batch of 64:
            divided by ``lr_scale`` for a smaller batch).
        lr: Adam's learning rate at the start of the cosine (with ``batch_size = "auto"``,
            the rate of a batch of 64, scaled by ``lr_scale``).
        batch_size: Samples per step, or ``"auto"`` (``resolve_batch_size``).
        max_batch_size: The largest batch ``"auto"`` may choose (``AUTO_BATCH_RANGE``'s 64
            unless lower). The signal starters export at 16, the time-series literature's
            batch: a final training generalises better on smaller batches. The rule above
            then halves the rate and doubles the steps, half the examples of the budget at
            64; the starters double their steps to keep the examples (and the wall-clock).
        weight_decay: L2 penalty.
        seed: Seed of the initial weights, the data order and dropout.
        latency_repeats: Timed forwards of the latency measurement (``0``: none).
        grad_clip: Clip the gradient norm to this value (``0``: no clipping).
        precision: Forward precision, ``"fp32"``, ``"bf16"`` (CPU or GPU) or ``"fp16"`` (GPU
            only, with loss scaling); parameters and optimizer state stay fp32.
        holdout: Train on the training split only (``True``) or on training and validation
            together (``False``, the export: the search has already used the validation
            split to choose the architecture).
        average: The last share of the steps whose weights are averaged (stochastic weight
            averaging, Izmailov et al. 2018, with ``torch.optim.swa_utils``): the learning
            rate holds at its cosine value where the share begins, the weights after every
            step of it are averaged, and BatchNorm statistics are recomputed on the training
            set for the average. ``0``: the last weights, as trained.
    """

    steps: int = 2000
    lr: float = 4e-3
    batch_size: int | str = AUTO
    max_batch_size: int = AUTO_BATCH_RANGE[1]
    weight_decay: float = 1e-4
    seed: int = 0
    latency_repeats: int = 20
    grad_clip: float = 0.0
    precision: str = "fp32"
    holdout: bool = False
    average: float = 0.0

    def __post_init__(self) -> None:
        check_int("steps", self.steps, 0)
        check_seed("seed", self.seed)
        check_int("latency_repeats", self.latency_repeats, 0)
        _check_batch_size("batch_size", self.batch_size)
        check_int("max_batch_size", self.max_batch_size, 2)
        check_number("lr", self.lr)
        check_number("weight_decay", self.weight_decay, positive=False, minimum=0)
        check_number("grad_clip", self.grad_clip, positive=False, minimum=0)
        check_choice("precision", self.precision, PRECISIONS)
        check_bool("holdout", self.holdout)
        check_number("average", self.average, positive=False, minimum=0, maximum=0.9)

    def schedule(self, samples: int) -> TrainingSchedule:
        """The batch, steps and starting rate this recipe trains ``samples`` examples with."""
        batch = resolve_batch_size(self.batch_size, samples, largest=self.max_batch_size)
        scale = lr_scale(self.batch_size, batch)
        return TrainingSchedule(batch, scale, round(self.steps / scale), self.lr * scale)
