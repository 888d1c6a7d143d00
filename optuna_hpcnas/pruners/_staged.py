"""``StagedPruner``: quick / medium / full evaluation stages with promotion between them.

A trial reports one value per training epoch (``step`` = epochs done so far, from 1). Stage
``s`` ends at the cumulative epoch count of stages ``0 .. s``; there the trial's best value so
far is written to its system attributes and compared with the values every other trial of the
study recorded at the same stage, exactly as Optuna's ``SuccessiveHalvingPruner`` compares
rungs: the storage decides, so parallel workers agree without talking. Independently, a trial
that has not improved for ``patience`` epochs is stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
import math
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from optuna_hpcnas import _keys


@dataclass(frozen=True)
class Stage:
    """One evaluation stage.

    Args:
        name: Stage name (unique in a plan), e.g. ``"quick"``.
        epochs: Training epochs spent in this stage.
        lr: Learning rate of the fine-tuning in this stage.
        promote: Share of the trials that reach the end of this stage and go on to the next
            (ignored for the last stage).
    """

    name: str
    epochs: int
    lr: float
    promote: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Stage `name` must be a non-empty string, but got {self.name!r}.")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int):
            raise TypeError(f"Stage `epochs` must be an int, but got {self.epochs!r}.")
        if self.epochs < 1:
            raise ValueError(f"Stage `epochs` is {self.epochs}, but must be >= 1.")
        if not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Stage `lr` is {self.lr!r}, but must be a finite number > 0.")
        if not isinstance(self.promote, (int, float)) or not 0 < self.promote <= 1:
            raise ValueError(f"Stage `promote` is {self.promote!r}, but must be in (0, 1].")


def _default_stages() -> tuple[Stage, ...]:
    # The source articles: quick 1 epoch lr 1e-3, medium 5 epochs lr 1e-2, full 50 epochs lr 1e-1.
    return (
        Stage("quick", 1, 1e-3, promote=1 / 3),
        Stage("medium", 5, 1e-2, promote=1 / 3),
        Stage("full", 50, 1e-1, promote=1.0),
    )


@dataclass(frozen=True)
class StagePlan:
    """The stages of a staged evaluation, plus early stopping (``StagePlan(**toml_table)``).

    Args:
        stages: ``Stage`` objects or mappings with their fields, in order.
        patience: Stop a trial after this many epochs without improvement (``0``: never).
        scale: Multiplies every stage's epochs (rounded up, at least 1): small data sets
            need fewer epochs than the articles' ones.
        min_delta: Smallest change that counts as an improvement.

    Example:
        >>> plan = StagePlan(scale=0.2)
        >>> [(s.name, s.epochs) for s in plan.stages]
        [('quick', 1), ('medium', 1), ('full', 10)]
        >>> plan.boundaries
        (1, 2, 12)
    """

    stages: tuple[Stage, ...] = field(default_factory=_default_stages)
    patience: int = 3
    scale: float = 1.0
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.stages, (str, bytes)) or not isinstance(self.stages, Sequence):
            raise TypeError(f"`stages` must be a sequence of stages, but got {self.stages!r}.")
        stages = tuple(s if isinstance(s, Stage) else Stage(**dict(s)) for s in self.stages)
        if not stages:
            raise ValueError("`stages` is empty; give at least one stage.")
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"`stages` has duplicate names: {names}.")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int):
            raise TypeError(f"`patience` must be an int, but got {self.patience!r}.")
        if self.patience < 0:
            raise ValueError(f"`patience` is {self.patience}, but must be >= 0.")
        if not isinstance(self.scale, (int, float)) or not (
            math.isfinite(self.scale) and self.scale > 0
        ):
            raise ValueError(f"`scale` is {self.scale!r}, but must be a finite number > 0.")
        if not isinstance(self.min_delta, (int, float)) or self.min_delta < 0:
            raise ValueError(f"`min_delta` is {self.min_delta!r}, but must be >= 0.")
        if self.scale != 1.0:
            stages = tuple(
                Stage(s.name, max(1, math.ceil(s.epochs * self.scale - 1e-9)), s.lr, s.promote)
                for s in stages
            )
            object.__setattr__(self, "scale", 1.0)
        object.__setattr__(self, "stages", stages)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """Cumulative epochs at the end of each stage."""
        out, total = [], 0
        for s in self.stages:
            total += s.epochs
            out.append(total)
        return tuple(out)

    @property
    def total_epochs(self) -> int:
        return self.boundaries[-1]

    def stage_index(self, epoch: int) -> int:
        """Index of the stage epoch ``epoch`` (from 1) belongs to."""
        for i, end in enumerate(self.boundaries):
            if epoch <= end:
                return i
        return len(self.stages) - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": [vars(s).copy() for s in self.stages],
            "patience": self.patience,
            "min_delta": self.min_delta,
        }


class StagedPruner(BasePruner):
    """Staged evaluation as an Optuna pruner (single-objective studies).

    Args:
        plan: The stages; the quick / medium / full plan of the source articles by default.
        patience: Overrides ``plan.patience`` when given.

    Report the validation metric once per epoch with ``trial.report(value, epoch)``, epochs
    counted from 1. ``should_prune()`` is true for a trial that ends a stage outside the
    promoted share of that stage, or that has not improved for ``patience`` epochs. The second
    case is early stopping, not a verdict: ``StagedPruner.early_stopped(trial)`` tells them
    apart, and an objective may finish such a trial with its best value (``SupernetObjective``
    does). The stage a trial reached is in its system attributes
    (``StagedPruner.stage_reached(trial)``), the reason of a stop under
    ``optuna_hpcnas._keys.PRUNER_REASON``.

    Example:
        >>> import optuna
        >>> pruner = StagedPruner(StagePlan(scale=0.1))
        >>> study = optuna.create_study(direction="maximize", pruner=pruner)
        >>> def objective(trial):
        ...     x = trial.suggest_float("x", 0, 1)
        ...     for epoch in range(1, pruner.plan.total_epochs + 1):
        ...         trial.report(x * epoch, epoch)
        ...         if trial.should_prune():
        ...             raise optuna.TrialPruned()
        ...     return x * epoch
        >>> study.optimize(objective, n_trials=5)
    """

    def __init__(
        self, plan: StagePlan | Mapping[str, Any] | None = None, *, patience: int | None = None
    ) -> None:
        if plan is None:
            plan = StagePlan()
        elif isinstance(plan, Mapping):
            plan = StagePlan(**plan)
        elif not isinstance(plan, StagePlan):
            raise TypeError(f"`plan` must be a StagePlan, but got {type(plan).__name__}.")
        if patience is not None:
            plan = StagePlan(plan.stages, patience=patience, min_delta=plan.min_delta)
        self._plan = plan

    @property
    def plan(self) -> StagePlan:
        return self._plan

    @staticmethod
    def stage_reached(trial: FrozenTrial) -> str | None:
        """Name of the last stage ``trial`` entered (``None`` before its first report)."""
        value = trial.system_attrs.get(_keys.PRUNER_STAGE_REACHED)
        return None if value is None else str(value)

    @staticmethod
    def early_stopped(trial: FrozenTrial | optuna.Trial) -> bool:
        """Whether the last stop of ``trial`` was a patience stop (early stopping)."""
        if isinstance(trial, optuna.Trial):
            attrs = trial.storage.get_trial_system_attrs(trial._trial_id)
        else:
            attrs = trial.system_attrs
        return _keys.PRUNER_EARLY_STOPPED in attrs

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if len(study.directions) > 1:
            raise RuntimeError("StagedPruner supports single-objective studies only.")
        step = trial.last_step
        if step is None:
            return False
        values = trial.intermediate_values
        maximize = study.direction == StudyDirection.MAXIMIZE
        plan = self._plan
        stage = plan.stage_index(step)
        name = plan.stages[stage].name
        # the writes of one verdict go in one transaction (RDB storages): a runner waits for it
        writes: dict[str, Any] = {}
        if trial.system_attrs.get(_keys.PRUNER_STAGE_REACHED) != name:
            writes[_keys.PRUNER_STAGE_REACHED] = name

        finite = [(s, v) for s, v in values.items() if math.isfinite(v)]
        stop = self._possible_stop(finite, step, maximize)
        pruned = False
        if stop == "no finite value":
            writes[_keys.PRUNER_REASON] = "no finite value"
            pruned = True
        elif stop == "patience":
            reason = f"no improvement for {plan.patience} epochs (stage {name!r}, epoch {step})"
            writes[_keys.PRUNER_REASON] = reason
            writes[_keys.PRUNER_EARLY_STOPPED] = step
            pruned = True
        elif stop == "stage boundary":
            best = max(v for _, v in finite) if maximize else min(v for _, v in finite)
            key = _keys.PRUNER_STAGE_VALUE + name
            if key not in trial.system_attrs:
                writes[key] = best
            # written before the others are read: of two trials ending the stage at once,
            # the later reader sees the other
            self._write(study, trial, writes)
            writes = {}
            competing = [
                (float(t.system_attrs[key]), t.number)
                for t in study.get_trials(deepcopy=False)
                if key in t.system_attrs and t._trial_id != trial._trial_id
            ]
            entry = (best, trial.number)
            competing.append(entry)
            if not _promotable(entry, competing, plan.stages[stage].promote, maximize):
                reason = f"not promoted after stage {name!r} (epoch {step})"
                writes[_keys.PRUNER_REASON] = reason
                pruned = True
        self._write(study, trial, writes)
        return pruned

    @staticmethod
    def _write(study: optuna.Study, trial: FrozenTrial, attrs: Mapping[str, Any]) -> None:
        from optuna_hpcnas._records import set_trial_system_attrs

        if attrs:
            set_trial_system_attrs(study._storage, trial._trial_id, attrs)

    def stops_early(self, intermediate_values: Mapping[int, float], *, maximize: bool) -> bool:
        """Whether a ``True`` from :meth:`prune` on these values is a patience stop (what
        :meth:`early_stopped` reads back from the storage, judged without a storage read)."""
        if not intermediate_values:
            return False
        step = max(intermediate_values)
        finite = [(s, v) for s, v in intermediate_values.items() if math.isfinite(v)]
        return self._possible_stop(finite, step, maximize) == "patience"

    def may_prune(self, intermediate_values: Mapping[int, float], *, maximize: bool) -> bool:
        """Whether :meth:`prune` could return ``True`` for a trial with these intermediate
        values, judged from the trial's own values only (``False``: it surely continues).

        The runner reports such epochs without waiting for the storage.
        """
        if not intermediate_values:
            return False
        step = max(intermediate_values)
        finite = [(s, v) for s, v in intermediate_values.items() if math.isfinite(v)]
        return self._possible_stop(finite, step, maximize) is not None

    def _possible_stop(
        self, finite: list[tuple[int, float]], step: int, maximize: bool
    ) -> str | None:
        """Which of :meth:`prune`'s stops applies at ``step``, from the trial's own finite
        values: ``"no finite value"``, ``"patience"``, ``"stage boundary"`` (a promotion
        decision, which needs the other trials) or ``None`` (it continues)."""
        plan = self._plan
        if not finite:
            return "no finite value"
        if plan.patience and self._stalled(finite, step, maximize):
            return "patience"
        if step in plan.boundaries and plan.stage_index(step) < len(plan.stages) - 1:
            return "stage boundary"
        return None

    def _stalled(self, finite: list[tuple[int, float]], step: int, maximize: bool) -> bool:
        patience, delta = self._plan.patience, self._plan.min_delta
        before = [v for s, v in finite if s <= step - patience]
        recent = [v for s, v in finite if s > step - patience]
        if not before or not recent:
            return False
        if maximize:
            return max(recent) <= max(before) + delta
        return min(recent) >= min(before) - delta


def _promotable(
    entry: tuple[float, int], competing: list[tuple[float, int]], share: float, maximize: bool
) -> bool:
    """Whether ``entry`` (value, trial number) is within the best ``share`` of ``competing``
    (SuccessiveHalving's rule: while fewer than ``1 / share`` trials competed, only the best so
    far goes on). Equal values rank by trial number, the earlier first, so a stage never
    promotes more than its share when many trials tie (accuracy on a small validation set).
    """
    keep = max(int(math.floor(len(competing) * share + 1e-9)), 1)
    ordered = sorted(competing, key=lambda e: (-e[0] if maximize else e[0], e[1]))
    return entry in ordered[:keep]
