"""``SupernetObjective``: the callable a study optimises, scoring architectures with weights
inherited from a trained ``SuperNet``, fine-tuned stage by stage.

It is the Python API's face of the one evaluation core (``TrialEvaluator``): it suggests the
architecture, wraps the trial in an ``OptunaTrialLink`` and turns the core's ``Outcome`` into
what Optuna expects (values, ``TrialPruned``, or a failed trial with its ``fail_reason``).
``hpcnas run`` and every MPI group call the same core.
"""

from __future__ import annotations

from collections.abc import Mapping
import logging
from typing import Any
from typing import Literal

import optuna
import torch

from optuna_hpcnas._records import record_architecture
from optuna_hpcnas._threads import configure_threads
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation._config import ObjectiveConfig
from optuna_hpcnas.evaluation._core import Engine
from optuna_hpcnas.evaluation._core import OptunaTrialLink
from optuna_hpcnas.evaluation._core import TrialEvaluator
from optuna_hpcnas.evaluation._core import TrialPlan
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.search_space import fit_to_input
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.supernet import SuperNet
from optuna_hpcnas.supernet import SupernetTrainer
from optuna_hpcnas.supernet import SupernetTrainingConfig
from optuna_hpcnas.supernet._supernet import check_input_shape

_logger = logging.getLogger(__name__)


class SupernetObjective:
    """Scores each trial's architecture with weights inherited from a shared ``SuperNet``.

    Per trial: suggest an architecture from ``space``; export its subnet from the supernet
    and recompute its BatchNorm statistics; count FLOPs and parameters, measure and predict
    latency, set the hard limits as constraints; then fine-tune it stage by stage (budgets of
    optimisation steps, the stage's learning rate), reporting the validation objective every
    ``eval_every`` steps and at each stage's end so a ``StagedPruner`` can stop it. On small
    data the validation is cross-validation (``ObjectiveConfig.validation``). Returns the
    scalarised objective or the tuple of objectives.
    The supernet itself is not changed by fine-tuning.

    Args:
        space: The search space; the choices the data's sample shape rules out are left out
            (``optuna_hpcnas.search_space.fit_to_input``, each logged) unless ``supernet`` is
            given. ``self.space`` is the space searched.
        data: The task (train / valid / test); its shape is checked against the space here.
        supernet: A trained supernet; a new one (trained with ``train_supernet``) if ``None``.
        training: Supernet training options.
        plan: The stages; the ``StagedPruner``'s plan is used when the study has one.
        config: Objective options.
        device: Where training runs.
        seed: Seed of the new supernet's weights and of each trial's random streams
            (``(seed, trial.number)``).
        engine: Who fine-tunes candidates (plain PyTorch in this process by default).
        threads: torch's intra-op threads in this process, as ``hpcnas run`` sets them:
            ``"auto"`` its share of the usable CPUs (``OMP_NUM_THREADS`` when set; logged),
            a number, or ``None`` to leave torch's setting alone (a caller that set it).

    Examples:
        >>> import optuna
        >>> from optuna_hpcnas import HierarchicalSearchSpace
        >>> from optuna_hpcnas.data import load_digits_task
        >>> from optuna_hpcnas.pruners import StagedPruner, StagePlan
        >>> space = HierarchicalSearchSpace.preset("digits-small")
        >>> objective = SupernetObjective(
        ...     space, load_digits_task(),
        ...     training=SupernetTrainingConfig(paths_per_batch=2, epochs=1),
        ...     config=ObjectiveConfig(latency_repeats=2),
        ... )
        >>> _ = objective.train_supernet(max_batches=2)
        >>> study = optuna.create_study(direction="maximize",
        ...                             pruner=StagedPruner(StagePlan(scale=0.01)))
        >>> study.optimize(objective, n_trials=2)
    """

    def __init__(
        self,
        space: HierarchicalSearchSpace,
        data: TaskData,
        *,
        supernet: SuperNet | None = None,
        training: SupernetTrainingConfig | Mapping[str, Any] | None = None,
        plan: StagePlan | Mapping[str, Any] | None = None,
        config: ObjectiveConfig | Mapping[str, Any] | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
        engine: Engine | None = None,
        threads: int | Literal["auto"] | None = "auto",
    ) -> None:
        if threads is not None and threads != "auto":
            check_int("threads", threads, 1)
        if not isinstance(space, HierarchicalSearchSpace):
            raise TypeError(f"`space` must be a HierarchicalSearchSpace, but got {space!r}.")
        if not isinstance(data, TaskData):
            raise TypeError(f"`data` must be a TaskData, but got {type(data).__name__}.")
        if data.domain != space.domain:
            raise ValueError(
                f"The data is a {data.domain!r} task, but the search space is for "
                f"{space.domain!r} data; use a space and a task of the same domain."
            )
        check_input_shape(space.domain, data.input_shape)
        data.check()
        if threads is not None:
            configure_threads(
                requested=None if threads == "auto" else int(threads), ranks_on_node=1
            )
        if supernet is None:
            fit = fit_to_input(space, data.input_shape)
            for note in fit.notes:
                _logger.info(note)
            space = fit.space
        self.space = space
        self.data = data
        self.config = _as(config, ObjectiveConfig)
        self.plan = _as(plan, StagePlan)
        training_config = _as(training, SupernetTrainingConfig)
        if supernet is None:
            supernet = SuperNet(
                space, input_shape=data.input_shape, num_classes=data.num_classes, seed=seed
            )
        elif supernet.space != space or supernet.input_shape != tuple(data.input_shape):
            raise ValueError("`supernet` was built for another space or input shape.")
        self.supernet = supernet
        self.trainer = SupernetTrainer(supernet, training_config, device=device)
        self.device = torch.device(device)
        self.core = TrialEvaluator(data, self.trainer, self.config, seed=seed)
        self.predictor = self.core.predictor
        self.engine = engine

    @property
    def directions(self) -> list[str]:
        """Directions for ``optuna.create_study(directions=...)``."""
        return self.config.directions

    def train_supernet(
        self, *, epochs: int | None = None, max_batches: int | None = None
    ) -> list[float]:
        """Train the shared weights (``SupernetTrainer.fit``, ``k`` paths per batch)."""
        return self.core.warm_up(epochs=epochs, max_batches=max_batches)

    # ------------------------------------------------------------------ one trial
    def __call__(self, trial: optuna.Trial) -> float | tuple[float, ...]:
        arch = self.space.suggest(trial)
        record_architecture(trial, arch)
        plan = TrialPlan.for_study(trial.study, self.config, self.plan)
        plan = plan.for_trial(trial.user_attrs)
        outcome = self.core.evaluate(arch, OptunaTrialLink(trial, plan), self.engine)
        if outcome.state == "pruned":
            raise optuna.TrialPruned(outcome.reason)
        if outcome.state == "failed":
            # Optuna fails a trial whose value is NaN; the reason is in `fail_reason`.
            n = len(self.config.objectives)
            return float("nan") if n == 1 else tuple(float("nan") for _ in range(n))
        assert outcome.values is not None
        return outcome.values[0] if len(outcome.values) == 1 else outcome.values


def _as(value: Any, cls: type) -> Any:
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls(**value)
    raise TypeError(f"Expected a {cls.__name__} or a mapping, but got {type(value).__name__}.")
