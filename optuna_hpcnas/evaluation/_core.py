"""The one evaluation core: how a trial's architecture is scored, whoever runs it.

``SupernetObjective`` (the Python API), ``hpcnas run`` in one process and every MPI evaluation
group call ``TrialEvaluator.evaluate``; they differ only in the two plug-ins they pass:

* a ``TrialLink``: the trial side. ``OptunaTrialLink`` wraps an ``optuna.Trial`` (report,
  prune, attributes, constraints); a group wraps it on its leader and gives the other ranks a
  link that receives the leader's decisions (``optuna_hpcnas.run``).
* an ``Engine``: who trains the candidate. ``LocalEngine`` is plain PyTorch in this process;
  ``optuna_hpcnas.distributed`` has the DeepSpeed data x pipeline engine over a group.

Per trial (on the leader unless said otherwise)::

    population steps of the supernet -> subnet with inherited weights, BatchNorm recalibrated
    -> FLOPs, parameters, latency, hard limits as constraints -> inherited score
    -> share (error, train?) with the group
    -> every rank: per round of the stage plan (``eval_every`` steps, each stage's end),
       fine-tune in the engine (cosine lr per stage) -> leader scores on the validation
       (holdout, or the folds' pooled predictions) -> decide (report, prune, early stop,
       time cap; a fault on any rank fails it)
    -> Outcome: complete (the value at its last step) / pruned / failed with a reason

Faults that belong to one candidate (a non-finite loss, ``MemoryError``, CUDA out of memory)
end that trial with a reason; every other exception propagates (a bug is not a trial result).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
import copy
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from enum import Enum
import functools
import gc
import logging
import math
import time
from typing import Any
from typing import Protocol
from typing import TYPE_CHECKING
from typing import TypeVar

import numpy as np
import optuna
import torch
from torch import nn

from optuna_hpcnas import _keys
from optuna_hpcnas.data import iterate_batches
from optuna_hpcnas.data import stream_batches
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation._config import LIMITS
from optuna_hpcnas.evaluation._config import lr_scale
from optuna_hpcnas.evaluation._config import ObjectiveConfig
from optuna_hpcnas.evaluation._config import resolve_batch_size
from optuna_hpcnas.evaluation._folds import Folds
from optuna_hpcnas.evaluation._folds import plan_validation
from optuna_hpcnas.evaluation._latency import LatencyPredictor
from optuna_hpcnas.evaluation._measure import count_flops
from optuna_hpcnas.evaluation._measure import count_parameters
from optuna_hpcnas.evaluation._measure import measure_latency
from optuna_hpcnas.evaluation._train import evaluate
from optuna_hpcnas.evaluation._train import NON_FINITE
from optuna_hpcnas.pruners import StagedPruner
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.supernet import cosine_lr
from optuna_hpcnas.supernet import recalibrate_batch_norm
from optuna_hpcnas.supernet import SupernetTrainer
from optuna_hpcnas.supernet import train_step

if TYPE_CHECKING:
    from optuna_hpcnas.supernet import StepResult

_logger = logging.getLogger(__name__)
T = TypeVar("T")
# Training samples (and the batch) BatchNorm's statistics are recomputed on before a validation.
PRECISE_BN_SAMPLES = 512
PRECISE_BN_BATCH = 256


class Decision(str, Enum):
    """What a trial does after a round (the same on every rank of a group)."""

    CONTINUE = "continue"
    PRUNE = "prune"
    STOP = "stop"  # early stopping: finished, with its last value
    FAIL = "fail"


@dataclass(frozen=True)
class TrialPlan:
    """How far one trial is trained and whether its rounds are reported to the pruner.

    Attributes:
        stages: The stage plan (the study's ``StagedPruner`` plan, or the objective's).
        total_steps: Optimisation steps to run at most (the end of the last stage run).
        report: Report every round (single-objective studies; Optuna prunes only those).
        maximize: Direction of the reported value.
        protected: A published model enqueued by name (``reference_model``) or a one-shot
            finalist: it goes through every stage whatever the pruner or the patience say
            (its stage values still count for the others), so its final value can be
            compared with the search's pick; the time cap ends it early but it completes,
            with its value where it stopped.
        inherited: One-shot mode: the trial is scored with the supernet's weights alone (no
            fine-tuning), unless it is a finalist or a published model.
        published: A published model enqueued by name (protected too): the search's timeout
            does not stop it (its own ``max_trial_seconds`` does), so the export compares
            the search's picks with the textbook models trained to the end of their plan.
    """

    stages: StagePlan
    total_steps: int
    report: bool
    maximize: bool
    protected: bool = False
    inherited: bool = False
    published: bool = False

    @classmethod
    def for_study(
        cls, study: optuna.Study, config: ObjectiveConfig, default: StagePlan
    ) -> TrialPlan:
        """The plan of a trial of ``study``: its pruner's stages when it is a
        ``StagedPruner`` (every stage), else ``default`` up to its second stage."""
        multi = len(study.directions) > 1
        staged = isinstance(study.pruner, StagedPruner)
        plan = study.pruner.plan if staged else default  # type: ignore[attr-defined]
        names = [s.name for s in plan.stages]
        if config.last_stage is not None:
            if config.last_stage not in names:
                raise ValueError(
                    f"`last_stage` is {config.last_stage!r}, but the stages are {names}."
                )
            last = names.index(config.last_stage)
        elif staged and not multi:
            last = len(names) - 1
        else:
            last = min(1, len(names) - 1)
        maximize = not multi and study.direction == optuna.study.StudyDirection.MAXIMIZE
        return cls(
            plan,
            plan.boundaries[last],
            report=not multi,
            maximize=maximize or multi,
            inherited=config.mode == "one-shot",
        )

    @property
    def rounds(self) -> tuple[int, ...]:
        """The steps after which the trial is validated (``StagePlan.report_steps``)."""
        return self.stages.report_steps(self.total_steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": self.stages.to_dict(),
            "total_steps": self.total_steps,
            "report": self.report,
            "maximize": self.maximize,
            "protected": self.protected,
            "inherited": self.inherited,
            "published": self.published,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialPlan:
        return cls(
            StagePlan(**data["stages"]),
            int(data["total_steps"]),
            bool(data["report"]),
            bool(data["maximize"]),
            bool(data.get("protected", False)),
            bool(data.get("inherited", False)),
            bool(data.get("published", False)),
        )

    def for_trial(self, user_attrs: Mapping[str, Any]) -> TrialPlan:
        """This plan for a trial with these user attributes: a published model or a
        one-shot finalist goes through every stage (protected, not inherited-only)."""
        published = _keys.OBJECTIVE_REFERENCE in user_attrs
        if published or _keys.OBJECTIVE_FINALIST_OF in user_attrs:
            return replace(self, protected=True, inherited=False, published=published)
        return self


@dataclass(frozen=True)
class Outcome:
    """The result of one evaluation: ``state`` is ``"complete"``, ``"pruned"`` or
    ``"failed"``; ``values`` are the trial's values (complete only)."""

    state: str
    values: tuple[float, ...] | None = None
    reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def told(self) -> tuple[Any, list[float] | None]:
        """The ``optuna.trial.TrialState`` and values to tell (values: complete only)."""
        from optuna.trial import TrialState

        if self.state == "complete":
            assert self.values is not None
            return TrialState.COMPLETE, list(self.values)
        return (TrialState.PRUNED if self.state == "pruned" else TrialState.FAIL), None


class TrialLink(Protocol):
    """The trial side of an evaluation. Every method is called on every rank of a group, in
    the same order; only the leader's link touches the ``optuna.Trial``."""

    number: int
    plan: TrialPlan

    @property
    def is_leader(self) -> bool: ...

    @property
    def solo(self) -> bool:
        """Whether the trial's group is this one rank (it may stop between any two steps)."""
        ...

    def record(self, attrs: Mapping[str, Any]) -> None:
        """User attributes of the trial (leader)."""
        ...

    def constrain(self, name: str, value: float) -> None:
        """``trial.set_constraint`` (leader)."""
        ...

    def population(self, size: int) -> list[Architecture]:
        """The last ``size`` finished architectures of the study (leader)."""
        ...

    def share(self, value: T) -> T:
        """Collective: the leader's ``value`` on every rank."""
        ...

    def decide(
        self, step: int, value: float | None, fault: str | None
    ) -> tuple[Decision, str | None]:
        """Collective: report ``value`` at ``step`` (leader) and return what to do, with the
        reason of a failure; a ``fault`` on any rank fails the trial."""
        ...


class OptunaTrialLink:
    """``TrialLink`` over an ``optuna.Trial`` in this process."""

    def __init__(self, trial: optuna.Trial, plan: TrialPlan) -> None:
        self.trial = trial
        self.number = trial.number
        self.plan = plan

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def solo(self) -> bool:
        return True

    def record(self, attrs: Mapping[str, Any]) -> None:
        for key, value in attrs.items():
            self.trial.set_user_attr(key, value)

    def constrain(self, name: str, value: float) -> None:
        self.trial.set_constraint(name, value)

    def population(self, size: int) -> list[Architecture]:
        from optuna_hpcnas._records import finished_architectures

        return finished_architectures(self.trial.study, size)

    def share(self, value: T) -> T:
        return value

    def decide(
        self, step: int, value: float | None, fault: str | None
    ) -> tuple[Decision, str | None]:
        return report_round(self.trial, self.plan, step, value, fault), fault


def report_round(
    trial: optuna.Trial, plan: TrialPlan, step: int, value: float | None, fault: str | None
) -> Decision:
    """Report the value at ``step`` to ``trial`` and read the pruner's verdict."""
    if fault is not None:
        return Decision.FAIL
    if not plan.report or value is None:
        return Decision.CONTINUE
    trial.report(value, step)
    if not trial.should_prune():
        return Decision.CONTINUE
    pruner = trial.study.pruner
    if isinstance(pruner, StagedPruner):
        # the values should_prune judged (no storage read on the verdict's path)
        cached = getattr(trial, "_cached_frozen_trial", None)
        if cached is None:
            early = StagedPruner.early_stopped(trial)
        else:
            early = pruner.stops_early(cached.intermediate_values, maximize=plan.maximize)
        if early:
            return Decision.STOP
    return Decision.PRUNE


def verdict_needed(pruner: object, values: Mapping[int, float], *, maximize: bool) -> bool:
    """Whether ``pruner``'s verdict on a trial with these intermediate values could be
    anything but "continue": never for a ``NopPruner``; a ``StagedPruner`` judges from the
    trial's own values (``StagedPruner.may_prune``); any other pruner is always asked."""
    from optuna.pruners import NopPruner

    if isinstance(pruner, NopPruner):
        return False
    if isinstance(pruner, StagedPruner):
        return pruner.may_prune(values, maximize=maximize)
    return True


@dataclass(frozen=True)
class FineTuning:
    """How an engine builds the candidate's optimizer (the learning rate comes per batch)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    precision: str
    grad_clip: float

    def build(self, params: Any) -> torch.optim.Optimizer:
        from optuna_hpcnas.supernet._training import torch_optimizer

        return torch_optimizer(
            self.optimizer,
            params,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )


class EngineSession(Protocol):
    """A candidate being fine-tuned by an engine."""

    def set_lr(self, lr: float) -> None: ...

    def step(self, x: torch.Tensor, y: torch.Tensor) -> StepResult:
        """One optimizer step on the global batch ``(x, y)`` (every rank passes the same)."""
        ...

    def synchronise(self) -> None:
        """Bring the trained weights into the leader's model before it is scored."""
        ...

    def close(self) -> None: ...


class Engine(Protocol):
    """Trains candidates; a plug-in of ``TrialEvaluator.evaluate``."""

    def open(
        self, model: nn.Module, arch: Architecture, fine_tuning: FineTuning
    ) -> EngineSession | None:
        """Start fine-tuning ``model`` (the leader's is calibrated; the others' is replaced
        by the leader's weights). ``None``: this rank takes no part in this candidate."""
        ...


class LocalEngine:
    """Plain PyTorch in this process: the candidate's own model and optimizer."""

    def open(self, model: nn.Module, arch: Architecture, fine_tuning: FineTuning) -> EngineSession:
        return _LocalSession(model, fine_tuning)


class _LocalSession:
    def __init__(self, model: nn.Module, fine_tuning: FineTuning) -> None:
        self._model = model.train()
        self._optimizer = fine_tuning.build(model.parameters())
        self._fine_tuning = fine_tuning
        self._device = next(model.parameters()).device

    def set_lr(self, lr: float) -> None:
        for group in self._optimizer.param_groups:
            group["lr"] = lr

    def step(self, x: torch.Tensor, y: torch.Tensor) -> StepResult:
        return train_step(
            self._model,
            self._optimizer,
            x.to(self._device),
            y.to(self._device),
            [None],
            precision=self._fine_tuning.precision,
            grad_clip=self._fine_tuning.grad_clip,
        )

    def synchronise(self) -> None:
        pass

    def close(self) -> None:
        self._optimizer.zero_grad(set_to_none=True)


class _CandidateFault(Exception):
    """A fault of the candidate (non-finite loss), carried to the next collective."""


# Why a trial stops for time (``TrialEvaluator._over_time``).
_CAP = "max_trial_seconds"
_TIMEOUT = "timeout"


class _TimeCapped(Exception):
    """A one-rank trial ran past ``max_trial_seconds`` in the middle of a round."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


@dataclass(frozen=True)
class _Prepared:
    """The leader's candidate before fine-tuning."""

    model: nn.Module
    metrics: dict[str, float]
    train: bool


# What torch's allocators say when an allocation fails: CUDA's caching allocator ("CUDA out
# of memory", also raised as torch.OutOfMemoryError), the CPU allocator ("DefaultCPUAllocator:
# can't allocate memory: you tried to allocate N bytes"), MPS and XPU ("out of memory").
_OUT_OF_MEMORY_MESSAGES = ("out of memory", "can't allocate memory", "failed to allocate")


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA/CPU out of memory, whichever way torch or Python raised it."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and any(m in message for m in _OUT_OF_MEMORY_MESSAGES)


def trial_seed(seed: int, number: int) -> int:
    """The seed of one trial's random streams (data order, dropout, timing inputs)."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class TrialEvaluator:
    """Scores architectures with weights inherited from a shared ``SuperNet``.

    Args:
        data: The task (train / valid / test).
        trainer: The supernet and its trainer (k-path warm-up, population steps, BatchNorm
            recalibration).
        config: Objective options.
        seed: Base seed; each trial's streams are seeded by ``(seed, trial number)``.

    Attributes:
        folds: Where candidates train and are scored (``plan_validation``: the holdout
            split, or cross-validation folds on small data).
        batch_size: The fine-tuning batch size (``config.batch_size`` resolved for the
            smallest training set of ``folds``).
        lr_scale: What the stages' learning rates are multiplied by (``lr_scale``: 1 unless
            the batch is ``"auto"``). The plan's steps are then steps of a batch of 64 too: a
            candidate trains ``1 / lr_scale`` optimisation steps per step of the plan (the
            same distance at the smaller rate), and reports by the plan's steps.
    """

    def __init__(
        self,
        data: TaskData,
        trainer: SupernetTrainer,
        config: ObjectiveConfig,
        *,
        seed: int = 0,
    ) -> None:
        self.data = data
        self.trainer = trainer
        self.config = config
        self.seed = seed
        # one-shot scores need a trained supernet, which cross-validation rules out
        validation = (
            "holdout"
            if config.mode == "one-shot" and config.validation == "auto"
            else config.validation
        )
        self.folds: Folds = plan_validation(
            data, validation=validation, folds=config.folds, seed=seed
        )
        self.batch_size = resolve_batch_size(config.batch_size, self.folds.smallest_training_set)
        self.lr_scale = lr_scale(config.batch_size, self.batch_size)
        _logger.info(
            "%s; batch size %d: stage learning rates x %.3g, %.3g optimisation steps per step "
            "of the plan",
            self.folds.describe(),
            self.batch_size,
            self.lr_scale,
            1.0 / self.lr_scale,
        )
        if self.folds.too_few_to_rank:
            _logger.warning(
                "Only %d samples score each candidate: one sample is %.0f accuracy points, so "
                "candidates a few samples apart are not told apart; ties rank by the "
                "log-loss, and the export trains the first published model that completed "
                "(if one was enqueued).",
                self.folds.validation_size,
                100 / max(self.folds.validation_size, 1),
            )
        self.predictor = LatencyPredictor(trainer.supernet, repeats=config.latency_repeats)
        self._flops: dict[str, float] = {}
        self._deployed: list[tuple[Architecture, float]] = []  # onnx-int8 measurements

    @property
    def supernet(self) -> Any:
        return self.trainer.supernet

    @property
    def fine_tuning(self) -> FineTuning:
        return FineTuning(
            optimizer=self.config.optimizer,
            lr=1e-3,  # replaced by the stage's rate before the first step
            momentum=self.config.momentum,
            weight_decay=self.config.weight_decay,
            precision=self.trainer.config.precision,
            grad_clip=self.trainer.config.grad_clip,
        )

    def predicted_flops(self, arch: Architecture, model: nn.Module | None = None) -> float:
        """FLOPs of ``arch``'s subnet (``model`` where it is built already), counted once per
        architecture: the cost-aware scheduler's estimate and the trial's recorded cost."""
        key = arch.to_json()
        if key not in self._flops:
            subnet = self.trainer.subnet(arch) if model is None else model
            self._flops[key] = float(count_flops(subnet, self.data.input_shape))
        return self._flops[key]

    def warm_up(self, *, epochs: int | None = None, max_batches: int | None = None) -> list[float]:
        """Train the shared weights with ``k`` paths per batch (``SupernetTrainer.fit``).

        Not under cross-validation: the shared weights would have learnt every fold's
        validation samples, and each candidate's score would count them. Candidates then
        start from the supernet's initial weights (the list of losses is empty)."""
        if self.folds.kind == "cross-validation":
            _logger.info(
                "No supernet warm-up under cross-validation (its weights would have seen every "
                "fold's validation samples): candidates start from the initial weights."
            )
            return []
        return self.trainer.fit(self.data.train, epochs=epochs, max_batches=max_batches)

    # ------------------------------------------------------------------ one trial
    def evaluate(
        self,
        arch: Architecture,
        link: TrialLink,
        engine: Engine | None = None,
        *,
        on_step: Callable[[], None] | None = None,
        search_ended: Callable[[], bool] | None = None,
    ) -> Outcome:
        """Score ``arch`` for the trial behind ``link`` (collective over a group);
        ``on_step`` runs after every fine-tuning step (signal checks, averaging).

        ``search_ended`` (the same on every rank of a group; asked on the leader only, at each
        validation) says the search's timeout has passed: the trial stops there as the time
        cap stops it (pruned, or completed with its value there when it is protected)."""
        engine = engine if engine is not None else LocalEngine()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(trial_seed(self.seed, link.number))
            prepared: _Prepared | str | None = None
            if link.is_leader:
                prepared = self._guard(lambda: self._prepare(arch, link))
            fault = prepared if isinstance(prepared, str) else None
            train = isinstance(prepared, _Prepared) and prepared.train
            fault, train = link.share((fault, train))
            if fault is not None:
                return self._failed(link, fault)
            if not train:
                if not isinstance(prepared, _Prepared):
                    return Outcome("complete")  # a follower: the leader holds the values
                costs = prepared.metrics
                return self._complete(link, self._values(None, costs), costs)
            model = prepared.model if isinstance(prepared, _Prepared) else None
            costs = prepared.metrics if isinstance(prepared, _Prepared) else {}
            return self._fine_tune(arch, link, engine, model, costs, on_step, search_ended)

    def _guard(self, work: Callable[[], T]) -> T | str:
        """Run ``work``; a fault of the candidate becomes its reason (a string)."""
        try:
            return work()
        except _CandidateFault as fault:
            return str(fault)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            reason = f"out of memory: {type(error).__name__}: {error}"
        # Outside the except block: the traceback (and the tensors it holds) is released.
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return reason

    def _prepare(self, arch: Architecture, link: TrialLink) -> _Prepared:
        """Population steps, the calibrated subnet, its costs and inherited score (leader)."""
        self._population_steps(link)
        # A candidate scored by inherited weights alone is recalibrated as the supernet's
        # fidelity bench scores it (``[training] bn_recalibration_batches``): more samples
        # ranked no better there and cost most of a score.
        inherited_only = self.config.mode == "one-shot" and link.plan.inherited
        precise = self.config.precise_batch_norm and not inherited_only
        model: nn.Module
        if precise:  # ``_validate`` recomputes the statistics anyway
            model = self.trainer.subnet(arch).eval()
        else:
            model = self.trainer.calibrated_subnet(arch, self.data.train)
        costs = self._costs(arch, model, link)
        costs.update(self._validate([model] * len(self.folds.splits), precise=precise))
        accuracy = costs["accuracy"]
        link.record({_keys.OBJECTIVE_VALIDATION_SAMPLES: self.folds.validation_size})
        link.record({_keys.OBJECTIVE_INHERITED_ACCURACY: accuracy})
        train = self._feasible(costs) or not self.config.skip_infeasible
        if self.config.mode == "one-shot":
            fidelity = "inherited" if link.plan.inherited else "trained"
            link.record({_keys.OBJECTIVE_FIDELITY: fidelity})
            train = train and not link.plan.inherited
        if not train:
            link.record({_keys.OBJECTIVE_ACCURACY: accuracy, _keys.OBJECTIVE_STEPS: 0})
        return _Prepared(model, costs, train)

    def _population_steps(self, link: TrialLink) -> None:
        steps = self.config.population_steps
        if steps:
            self.trainer.set_population(link.population(self.config.population_size))
            self.trainer.train_steps(self.data.train, steps)

    def _costs(self, arch: Architecture, model: nn.Module, link: TrialLink) -> dict[str, float]:
        """FLOPs, parameters and latency. A one-shot trial scored by inherited weights alone
        times its forwards only where latency counts (an objective, a weight or a limit):
        the timing would be most of its cost."""
        shape = self.data.input_shape
        predicted = self.predictor.predict(arch)
        records: dict[str, Any] = {}
        measured = predicted
        if self._latency_counts() or not link.plan.inherited:
            measured = measure_latency(model, shape, repeats=self.config.latency_repeats)
            records[_keys.OBJECTIVE_LATENCY] = measured
            if self.config.latency == "onnx-int8":
                measured = self._deployed_latency(arch, model)
                records[_keys.OBJECTIVE_ONNX_LATENCY] = measured
        costs = {
            "flops": self.predicted_flops(arch, model),
            "params": float(count_parameters(model)),
            "latency": predicted if self.config.latency == "predicted" else measured,
        }
        records.update(
            {
                _keys.OBJECTIVE_FLOPS: costs["flops"],
                _keys.OBJECTIVE_PARAMS: costs["params"],
                _keys.OBJECTIVE_PREDICTED_LATENCY: predicted,
            }
        )
        link.record(records)
        for limit_name, cost_name in LIMITS.items():
            limit = getattr(self.config, limit_name)
            if limit is not None:
                link.constrain(f"hpcnas.{limit_name}", costs[cost_name] / limit - 1.0)
        return costs

    def _latency_counts(self) -> bool:
        """Whether a trial's value or feasibility depends on its latency."""
        cfg = self.config
        return (
            "latency" in cfg.objectives
            or bool(cfg.latency_weight)
            or (cfg.max_latency_s is not None)
        )

    def _deployed_latency(self, arch: Architecture, model: nn.Module) -> float:
        """INT8 onnxruntime latency of the candidate (on a CPU copy); the per-layer predictor
        is refitted on every such measurement so far, so it predicts the deployed speed."""
        import copy

        from optuna_hpcnas.evaluation._onnx import onnx_latency

        cpu = copy.deepcopy(model).cpu().eval()
        seconds = onnx_latency(
            cpu,
            self.data.input_shape,
            int8=True,
            calibration=self.data.train,
            repeats=self.config.latency_repeats,
        )
        self._deployed.append((arch, seconds))
        self.predictor.fit(self._deployed)
        return seconds

    def _feasible(self, costs: Mapping[str, float]) -> bool:
        for limit_name, cost_name in LIMITS.items():
            limit = getattr(self.config, limit_name)
            if limit is not None and cost_name in costs and costs[cost_name] > limit:
                return False
        return True

    def _scalar(self, metrics: Mapping[str, float]) -> float:
        """The reported value: the first objective, scalarised when it is accuracy.

        Accuracy ties are broken by the log-loss: less than half a sample of accuracy,
        ``0.5 / n * (1 - exp(-loss))``, is taken off, so a lower loss ranks first among equal
        accuracies and never above a higher accuracy.
        """
        cfg = self.config
        first = cfg.objectives[0]
        value = metrics[first]
        if first == "accuracy" and "loss" in metrics and math.isfinite(metrics["loss"]):
            n = max(self.folds.validation_size, 1)
            value -= 0.5 / n * (1.0 - math.exp(-max(metrics["loss"], 0.0)))
        if cfg.objectives == ("accuracy",):
            if cfg.flops_weight:
                value += cfg.flops_weight * math.log(1.0 / max(metrics["flops"], 1.0))
            if cfg.latency_weight:
                value += cfg.latency_weight * math.log(1.0 / max(metrics["latency"], 1e-9))
        return float(value)

    def _values(self, value: float | None, metrics: Mapping[str, float]) -> tuple[float, ...]:
        if len(self.config.objectives) == 1:
            return (float(value if value is not None else self._scalar(metrics)),)
        return tuple(float(metrics[name]) for name in self.config.objectives)

    def _failed(self, link: TrialLink, reason: str) -> Outcome:
        link.record({_keys.OBJECTIVE_FAIL_REASON: reason})
        if link.is_leader:
            _logger.warning("Trial %d: %s", link.number, reason)
        if reason.startswith(NON_FINITE) and self.config.on_nan == "prune":
            return Outcome("pruned", reason=reason)
        return Outcome("failed", reason=reason)

    # ------------------------------------------------------------------ fine-tuning
    def _fine_tune(
        self,
        arch: Architecture,
        link: TrialLink,
        engine: Engine,
        model: nn.Module | None,
        costs: dict[str, float],
        on_step: Callable[[], None] | None,
        search_ended: Callable[[], bool] | None,
    ) -> Outcome:
        if model is None:  # not the leader: the engine replaces these weights by the leader's
            model = self.trainer.subnet(arch)
        models, sessions = self._open(arch, link, engine, model)
        plan = link.plan
        base = trial_seed(self.seed, link.number)
        streams = [
            stream_batches(
                train, self.batch_size, generator=torch.Generator().manual_seed(base + f)
            )
            for f, (train, _) in enumerate(self.folds.splits[: len(sessions)])
        ]
        metrics = dict(costs)
        stage_name = None
        cap = self.config.max_trial_seconds
        deadline = None if cap is None else time.perf_counter() + cap
        done = 0
        try:
            for step in plan.rounds:
                stage = plan.stages.stages[plan.stages.stage_index(step)]
                if stage.name != stage_name:
                    stage_name = stage.name
                    link.record({_keys.OBJECTIVE_STAGE: stage.name})
                work = functools.partial(
                    self._round, sessions, models, streams, done, step, link, on_step
                )
                try:
                    result = self._guard(functools.partial(work, deadline if link.solo else None))
                except _TimeCapped as capped:
                    if (pruned := self._stopped(link, capped.step, plan, _CAP)) is not None:
                        return pruned
                    # a protected trial: validated where the cap cut its round short
                    settle = functools.partial(self._settle, sessions, models, link, capped.step)
                    settled = self._guard(settle)
                    if isinstance(settled, str):
                        return self._failed(link, settled)
                    self._validated(link, capped.step, settled, metrics)
                    break
                done = step
                fault = result if isinstance(result, str) else None
                value = None
                if not isinstance(result, str):
                    value = self._validated(link, step, result, metrics)
                decision, reason = link.decide(step, value, fault)
                if decision == Decision.FAIL:
                    return self._failed(link, reason or "failed on another rank")
                if decision == Decision.PRUNE and not plan.protected:
                    return Outcome(
                        "pruned", reason=f"pruned at step {step} (stage {stage.name!r})"
                    )
                if decision == Decision.STOP and not plan.protected:
                    link.record({_keys.OBJECTIVE_EARLY_STOPPED: step})
                    break
                if (why := self._over_time(link, deadline, search_ended, step, plan)) is not None:
                    if (pruned := self._stopped(link, step, plan, why)) is not None:
                        return pruned
                    break
        finally:
            for session in sessions:
                if session is not None:
                    session.close()
        if not link.is_leader:
            return Outcome("complete")
        # the value at the last step (the end of the last stage, an early stop or the time
        # cap), never the best on the way: on small validation sets the best is a spike
        return self._complete(link, self._values(None, metrics), metrics)

    def _open(
        self, arch: Architecture, link: TrialLink, engine: Engine, model: nn.Module
    ) -> tuple[list[nn.Module], list[EngineSession | None]]:
        """One model and session per fold. Folds train on the leader in plain PyTorch (their
        data is small); a holdout trains in ``engine`` on every rank it takes."""
        if len(self.folds.splits) == 1:
            return [model], [engine.open(model, arch, self.fine_tuning)]
        if not link.is_leader:
            return [model], [None]
        models = [model] + [copy.deepcopy(model) for _ in self.folds.splits[1:]]
        local = LocalEngine()
        return models, [local.open(m, arch, self.fine_tuning) for m in models]

    def _over_time(
        self,
        link: TrialLink,
        deadline: float | None,
        search_ended: Callable[[], bool] | None,
        step: int,
        plan: TrialPlan,
    ) -> str | None:
        """Why the trial stops at ``step`` for time (``_CAP``: past its own deadline;
        ``_TIMEOUT``: the search's timeout passed, not for a published model), or ``None``.
        The leader's clock, shared: every rank of a group stops at the same round."""
        if (deadline is None and search_ended is None) or step >= plan.total_steps:
            return None
        why = None
        if link.is_leader:
            if deadline is not None and time.perf_counter() > deadline:
                why = _CAP
            elif search_ended is not None and not plan.published and search_ended():
                why = _TIMEOUT
        return link.share(why)

    def _settle(
        self,
        sessions: list[EngineSession | None],
        models: list[nn.Module],
        link: TrialLink,
        step: int,
    ) -> dict[str, float]:
        """The leader's validation metrics (pooled over the folds) at ``step``, the end of
        a round or where the time cap cut one short."""
        for session in sessions:
            if session is not None:
                session.synchronise()
        if not link.is_leader:
            return {}
        metrics = self._validate(models)
        if not math.isfinite(metrics["loss"]):
            raise _CandidateFault(f"{NON_FINITE} at step {step}")
        return metrics

    def _validated(
        self, link: TrialLink, step: int, result: Mapping[str, float], metrics: dict[str, float]
    ) -> float | None:
        """Record a validation at ``step`` (the leader's ``result``) into ``metrics`` and the
        trial's attributes; the trial's scalar value there (``None`` off the leader)."""
        if not link.is_leader:
            return None
        metrics.update(result)
        link.record({_keys.OBJECTIVE_STEPS: step, _keys.OBJECTIVE_ACCURACY: result["accuracy"]})
        return self._scalar(metrics)

    def _stopped(self, link: TrialLink, step: int, plan: TrialPlan, why: str) -> Outcome | None:
        """A trial stopped for time at ``step`` (``why``: ``max_trial_seconds`` or the
        search's timeout): pruned, as a trial that did not reach the end of its plan (its value
        would not compare with the others'), unless it is protected (a published model or a
        one-shot finalist, never pruned): then ``None``, and it completes with its value there,
        a candidate for export still (which retrains it with its own recipe)."""
        if why == _CAP:
            reason = f"time cap of {self.config.max_trial_seconds:.0f} s reached"
            link.record({_keys.OBJECTIVE_TIME_CAPPED: step})
        else:
            reason = "the search's timeout passed"
            link.record({_keys.OBJECTIVE_SEARCH_ENDED: step})
        reason += f" at step {step} of {plan.total_steps}"
        if link.is_leader:
            kept = "; kept with its value there (a published model or a finalist)"
            _logger.info("Trial %d: %s%s.", link.number, reason, kept if plan.protected else "")
        return None if plan.protected else Outcome("pruned", reason=reason)

    def _complete(
        self, link: TrialLink, values: tuple[float, ...], metrics: dict[str, float]
    ) -> Outcome:
        """The finished trial, or a failed one when a value is not finite (a study never
        holds a COMPLETE trial whose value cannot be compared)."""
        bad = [
            f"{name}={value!r}"
            for name, value in zip(self.config.objectives, values)
            if not math.isfinite(value)
        ]
        if bad:
            return self._failed(link, f"non-finite objective value ({', '.join(bad)})")
        return Outcome("complete", values, metrics=metrics)

    def _round(
        self,
        sessions: list[EngineSession | None],
        models: list[nn.Module],
        streams: list[Any],
        done: int,
        until: int,
        link: TrialLink,
        on_step: Callable[[], None] | None,
        deadline: float | None,
    ) -> dict[str, float]:
        """Steps ``done + 1 .. until`` of every fold's model, then the leader's validation
        metrics (pooled over the folds). Past ``deadline`` (a one-rank trial only), raise
        ``_TimeCapped``."""
        stages = link.plan.stages
        scale = 1.0 / self.lr_scale  # optimisation steps per step of the plan
        for taken in range(round(done * scale), round(until * scale)):
            position = taken / scale  # where in the plan this step is, in the plan's steps
            step = min(int(position) + 1, until)
            index = stages.stage_index(step)
            stage = stages.stages[index]
            lr = stage.lr * self.lr_scale
            if self.config.stage_schedule == "cosine":
                lr = cosine_lr(lr, position - stages.stage_start(index), stage.steps)
            for session, stream in zip(sessions, streams):
                x, y = next(stream)  # every rank draws the same batches
                if session is None:
                    continue
                session.set_lr(lr)
                if not session.step(x, y).finite:
                    raise _CandidateFault(f"{NON_FINITE} at step {step} (stage {stage.name!r})")
            if on_step is not None:
                on_step()
            if deadline is not None and time.perf_counter() > deadline:
                raise _TimeCapped(step)
        return self._settle(sessions, models, link, until)

    def _validate(self, models: list[nn.Module], *, precise: bool = True) -> dict[str, float]:
        """Accuracy and mean log-loss of each fold's model on its fold, pooled; with
        ``precise``, BatchNorm statistics first recomputed on the fold's training samples
        (``_precise_batch_norm``)."""
        correct = loss = 0.0
        n = 0
        for model, (train, valid) in zip(models, self.folds.splits):
            if precise:
                self._precise_batch_norm(model, train)
            size = len(valid)  # type: ignore[arg-type]
            accuracy, mean_loss = evaluate(model, valid)
            correct += accuracy * size
            loss += mean_loss * size
            n += size
        return {"accuracy": correct / max(n, 1), "loss": loss / max(n, 1)}

    def _precise_batch_norm(self, model: nn.Module, train: Any) -> None:
        """BatchNorm's running statistics recomputed on up to ``PRECISE_BN_SAMPLES`` training
        samples in large batches: trained on batches of 4, the momentum averages are noise,
        and the validation would score the noise (Wu & Johnson 2021, "Rethinking 'Batch' in
        BatchNorm": precise BN). Training is unchanged: it normalises with batch
        statistics."""
        if not self.config.precise_batch_norm:
            return
        generator = torch.Generator().manual_seed(self.seed)
        batches = iterate_batches(train, PRECISE_BN_BATCH, shuffle=True, generator=generator)
        limit = max(1, PRECISE_BN_SAMPLES // PRECISE_BN_BATCH)
        device = self.trainer.device
        chosen = ((x.to(device), y) for _, (x, y) in zip(range(limit), batches))
        recalibrate_batch_norm(model, chosen)
