"""``StagedPruner``: quick / medium / full evaluation stages with promotion between them.

Budgets are optimisation steps, never epochs: an epoch is 1 step on 40 series and 100 on
6,400, so a recipe in epochs gives some candidates nothing to learn from. A trial reports its
validation value every ``eval_every`` steps and at the end of every stage (``step`` = the
optimisation steps done so far). Stage ``s`` ends at the cumulative steps of stages
``0 .. s``; there the trial's value at that step is written to its system attributes and
compared with the values every other trial of the study recorded at the same stage, as
Optuna's ``SuccessiveHalvingPruner`` compares rungs: the storage decides, so parallel workers
agree without talking. Independently, a trial that has not improved for ``patience`` steps is
stopped.
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
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number

_EPOCHS_MOVED = (
    "budgets are optimisation steps: write `steps` instead of `epochs` (steps = epochs x "
    "batches per epoch; 100-600 steps per stage suit most small data sets)"
)


@dataclass(frozen=True)
class Stage:
    """One evaluation stage.

    Args:
        name: Stage name (unique in a plan), e.g. ``"quick"``.
        steps: Optimisation steps spent in this stage.
        lr: Learning rate of the fine-tuning in this stage.
        promote: Share of the trials that reach the end of this stage and go on to the next
            (ignored for the last stage).
    """

    name: str
    steps: int
    lr: float
    promote: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Stage `name` must be a non-empty string, but got {self.name!r}.")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int):
            raise TypeError(f"Stage `steps` must be an int, but got {self.steps!r}.")
        if self.steps < 1:
            raise ValueError(f"Stage `steps` is {self.steps}, but must be >= 1.")
        if not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Stage `lr` is {self.lr!r}, but must be a finite number > 0.")
        if not isinstance(self.promote, (int, float)) or not 0 < self.promote <= 1:
            raise ValueError(f"Stage `promote` is {self.promote!r}, but must be in (0, 1].")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> Stage:
        """A stage from a TOML table (``{name, steps, lr, promote}``)."""
        if "epochs" in table:
            raise ValueError(f"Stage {table.get('name', '')!r}: {_EPOCHS_MOVED}.")
        return cls(**dict(table))


def _default_stages() -> tuple[Stage, ...]:
    # The source articles' quick (lr 1e-3) / medium (1e-2) / full (1e-1) stages, in steps.
    return (
        Stage("quick", 100, 1e-3, promote=1 / 3),
        Stage("medium", 400, 1e-2, promote=1 / 3),
        Stage("full", 2000, 1e-1, promote=1.0),
    )


@dataclass(frozen=True)
class StagePlan:
    """The stages of a staged evaluation, plus early stopping (``StagePlan(**toml_table)``).

    Args:
        stages: ``Stage`` objects or mappings with their fields, in order.
        patience: Stop a trial after this many steps without improvement (``0``: never).
        eval_every: Steps between two validations inside a stage (every stage also ends with
            one); ``None``: half the shortest stage.
        scale: Multiplies every stage's steps, the patience and ``eval_every`` (rounded up, at
            least 1): a quick way to shorten a whole plan.
        min_delta: Smallest change that counts as an improvement.

    Examples:
        >>> plan = StagePlan(scale=0.1)
        >>> [(s.name, s.steps) for s in plan.stages]
        [('quick', 10), ('medium', 40), ('full', 200)]
        >>> plan.boundaries
        (10, 50, 250)
        >>> plan.report_steps(50)
        (5, 10, 15, 20, 25, 30, 35, 40, 45, 50)
    """

    stages: tuple[Stage, ...] = field(default_factory=_default_stages)
    patience: int = 0
    eval_every: int | None = None
    scale: float = 1.0
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.stages, (str, bytes)) or not isinstance(self.stages, Sequence):
            raise TypeError(f"`stages` must be a sequence of stages, but got {self.stages!r}.")
        stages = tuple(s if isinstance(s, Stage) else Stage.from_mapping(s) for s in self.stages)
        if not stages:
            raise ValueError("`stages` is empty; give at least one stage.")
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"`stages` has duplicate names: {names}.")
        check_int("patience", self.patience, 0)
        check_int("eval_every", self.eval_every, 1, allow_none=True)
        check_number("scale", self.scale)
        check_number("min_delta", self.min_delta, positive=False, minimum=0)
        every = self.eval_every or max(1, min(s.steps for s in stages) // 2)
        patience = self.patience
        if self.scale != 1.0:
            stages = tuple(
                Stage(s.name, _scaled(s.steps, self.scale), s.lr, s.promote) for s in stages
            )
            every = _scaled(every, self.scale)
            patience = _scaled(patience, self.scale) if patience else 0
            object.__setattr__(self, "scale", 1.0)
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "eval_every", every)
        object.__setattr__(self, "patience", patience)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """Cumulative steps at the end of each stage."""
        out, total = [], 0
        for s in self.stages:
            total += s.steps
            out.append(total)
        return tuple(out)

    @property
    def total_steps(self) -> int:
        return self.boundaries[-1]

    def stage_index(self, step: int) -> int:
        """Index of the stage step ``step`` (from 1) belongs to."""
        for i, end in enumerate(self.boundaries):
            if step <= end:
                return i
        return len(self.stages) - 1

    def stage_start(self, index: int) -> int:
        """Steps done before stage ``index`` starts."""
        return self.boundaries[index - 1] if index > 0 else 0

    def report_steps(self, until: int) -> tuple[int, ...]:
        """The steps after which a trial trained to ``until`` steps is validated: every
        ``eval_every`` steps from the start of each stage, and each stage's end."""
        every = int(self.eval_every or 1)
        out: list[int] = []
        for index, end in enumerate(self.boundaries):
            start = self.stage_start(index)
            out.extend(range(start + every, min(end, until), every))
            if end <= until:
                out.append(end)
            if end >= until:
                if out[-1:] != [until]:
                    out.append(until)
                break
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": [vars(s).copy() for s in self.stages],
            "patience": self.patience,
            "eval_every": self.eval_every,
            "min_delta": self.min_delta,
        }


def _scaled(steps: int, scale: float) -> int:
    return max(1, math.ceil(steps * scale - 1e-9))


class StagedPruner(BasePruner):
    """Staged evaluation as an Optuna pruner (single-objective studies).

    Args:
        plan: The stages; the quick / medium / full plan of the source articles by default.
        patience: Overrides ``plan.patience`` when given.
        min_top_fidelity: Where a stage's own ranking of the best trials is weak, it cuts
            only the bottom half instead of keeping its ``promote`` share. The stage's
            fidelity within the top is measured on the study itself: the Kendall tau between
            the values at the stage's end and the final values of the trials that finished
            the last stage (the stage's best, as it promoted them). Below
            ``min_top_fidelity`` (e.g. ``0.3``), with at least ``fidelity_trials`` such
            trials, a trial outside the promoted share goes on when it is in the better half
            of the stage; the tau read is recorded in the trial's system attribute
            ``hpcnas:pruner:top_fidelity:<stage>``. ``None`` (the default): the promoted
            share alone decides.
        fidelity_trials: Trials that finished the last stage before the fidelity is read.

    Report the validation metric with ``trial.report(value, step)``, ``step`` the
    optimisation steps done, at least at the end of every stage (``plan.report_steps``).
    ``should_prune()`` is true for a trial whose value at the end of a stage is outside the
    promoted share of that stage, or that has not improved for ``patience`` steps. The second
    case is early stopping, not a verdict: ``StagedPruner.early_stopped(trial)`` tells them
    apart, and an objective may finish such a trial with its last value
    (``SupernetObjective`` does). The stage a trial reached is in its system attributes
    (``StagedPruner.stage_reached(trial)``), the reason of a stop under
    ``optuna_hpcnas._keys.PRUNER_REASON``.

    Examples:
        >>> import optuna
        >>> pruner = StagedPruner(StagePlan(scale=0.01))
        >>> study = optuna.create_study(direction="maximize", pruner=pruner)
        >>> def objective(trial):
        ...     x = trial.suggest_float("x", 0, 1)
        ...     for step in pruner.plan.report_steps(pruner.plan.total_steps):
        ...         trial.report(x * step, step)
        ...         if trial.should_prune():
        ...             raise optuna.TrialPruned()
        ...     return x * step
        >>> study.optimize(objective, n_trials=5)
    """

    def __init__(
        self,
        plan: StagePlan | Mapping[str, Any] | None = None,
        *,
        patience: int | None = None,
        min_top_fidelity: float | None = None,
        fidelity_trials: int = 10,
    ) -> None:
        check_number(  # a Kendall tau
            "min_top_fidelity",
            min_top_fidelity,
            positive=False,
            minimum=-1.0,
            maximum=1.0,
            allow_none=True,
        )
        check_int("fidelity_trials", fidelity_trials, 3)
        self._min_top_fidelity = min_top_fidelity
        self._fidelity_trials = fidelity_trials
        if plan is None:
            plan = StagePlan()
        elif isinstance(plan, Mapping):
            plan = StagePlan(**plan)
        elif not isinstance(plan, StagePlan):
            raise TypeError(f"`plan` must be a StagePlan, but got {type(plan).__name__}.")
        if patience is not None:
            plan = StagePlan(
                plan.stages,
                patience=patience,
                eval_every=plan.eval_every,
                min_delta=plan.min_delta,
            )
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
            reason = f"no improvement for {plan.patience} steps (stage {name!r}, step {step})"
            writes[_keys.PRUNER_REASON] = reason
            writes[_keys.PRUNER_EARLY_STOPPED] = step
            pruned = True
        elif stop == "stage boundary":
            # the value at the stage's end (as a rung's), not the best on the way: a spike on
            # a small validation set is not what the next stage starts from
            last = values[step] if math.isfinite(values[step]) else finite[-1][1]
            key = _keys.PRUNER_STAGE_VALUE + name
            if key not in trial.system_attrs:
                writes[key] = last
            # written before the others are read: of two trials ending the stage at once,
            # the later reader sees the other
            self._write(study, trial, writes)
            writes = {}
            trials = study.get_trials(deepcopy=False)
            competing = [
                (float(t.system_attrs[key]), t.number)
                for t in trials
                if key in t.system_attrs and t._trial_id != trial._trial_id
            ]
            entry = (last, trial.number)
            competing.append(entry)
            share = plan.stages[stage].promote
            promoted = _promotable(entry, competing, share, maximize)
            threshold = self._min_top_fidelity
            if not promoted and threshold is not None and share < 0.5:
                fidelity = self._top_fidelity(trials, key)
                if fidelity is not None:
                    writes[_keys.PRUNER_TOP_FIDELITY + name] = fidelity
                    if fidelity < threshold:  # its order of the best is noise: cut the bottom
                        promoted = _promotable(entry, competing, 0.5, maximize)
            if not promoted:
                reason = f"not promoted after stage {name!r} (step {step})"
                writes[_keys.PRUNER_REASON] = reason
                pruned = True
        self._write(study, trial, writes)
        return pruned

    def _top_fidelity(self, trials: Sequence[FrozenTrial], key: str) -> float | None:
        """Kendall tau between the values at ``key``'s stage and the final values of the
        trials that finished the last stage (``None``: too few yet)."""
        last = self._plan.stages[-1].name
        pairs = [
            (float(t.system_attrs[key]), float(t.value))
            for t in trials
            if t.state == optuna.trial.TrialState.COMPLETE
            and t.value is not None
            and key in t.system_attrs
            and t.system_attrs.get(_keys.PRUNER_STAGE_REACHED) == last
        ]
        if len(pairs) < self._fidelity_trials:
            return None
        return round(_kendall_tau(pairs), 4)

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

        The runner reports such steps without waiting for the storage.
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


def _kendall_tau(pairs: Sequence[tuple[float, float]]) -> float:
    """Kendall's tau-b of the pairs (written here: scipy is not a dependency of the package,
    and a stage's finishers are tens to hundreds, so the quadratic count is cheap)."""
    concordant = discordant = ties_x = ties_y = 0
    for i, (xi, yi) in enumerate(pairs):
        for xj, yj in pairs[i + 1 :]:
            dx, dy = xi - xj, yi - yj
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt(
        (concordant + discordant + ties_x) * (concordant + discordant + ties_y)
    )
    return (concordant - discordant) / denominator if denominator else 0.0
