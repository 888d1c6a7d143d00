"""``StudyCalls``: every storage call a group leader makes during a run, one method each.

The leader's ask and write threads (``run/_queue.py``), the keep-alive of its trials
(heartbeats or leases), its sweeps of dead workers' trials and its checkpoint writes reach
the study only through this object, and every method goes through ``_call``: the process's
``OutageWindow`` (``storages/_outage.py``) tries a call again while the storage is away, up
to ``[storage] outage_tolerance_s``. Calls that may have taken effect on a try whose answer
was lost are made idempotent here: a tell first reads the trial's state, a pop finds the
trial it claimed. Sweeps wait a grace period after the storage is back, so the trials whose
heartbeats the outage held up are not taken for dead.
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
import logging
import math
import time
from typing import Any
from typing import ParamSpec
from typing import TYPE_CHECKING
from typing import TypeVar
import uuid

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.run._finalists import turn_into_finalist
from optuna_hpcnas.run._study import grace_period
from optuna_hpcnas.run._study import recover_dead_trials
from optuna_hpcnas.storages import OutageWindow

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.distributed import EvaluationGroup
    from optuna_hpcnas.evaluation import Decision
    from optuna_hpcnas.evaluation import Outcome
    from optuna_hpcnas.evaluation import TrialPlan
    from optuna_hpcnas.run._batches import InheritedBatches
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
_WORST = {"maximize": -math.inf, "minimize": math.inf}


class StudyCalls:
    """The storage calls of one leader on its study.

    Args:
        study: The run's study (this leader's ``optuna.Study``).
        config: The run configuration (budget, keep-alive and retry settings, the plan).
        window: The process's outage window (default: one from ``[storage]``, whose sweeps
            wait the grace period and the longest backoff after the storage is back).
    """

    def __init__(
        self, study: optuna.Study, config: RunConfig, window: OutageWindow | None = None
    ) -> None:
        self.study = study
        self._config = config
        if window is None:
            window = OutageWindow(
                config.study.resolved_storage(), tolerance=config.storage.outage_tolerance_s
            )
            window.quiet = grace_period(config) + window.backoff.cap
        self.window = window
        self._plan: TrialPlan | None = None
        # one-shot mode with a timeout: from this time.monotonic() on, trials are finalists
        self.finalists_from: float | None = None

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """The one door to the storage: ``fn`` within the outage window (``OutageWindow.call``:
        a ``fn`` with a ``recover`` method is an idempotent call)."""
        return self.window.call(fn, *args, **kwargs)

    def inherited_batches(self, group: EvaluationGroup) -> InheritedBatches | None:
        """One-shot mode with ``[distributed] one_shot_batch`` > 1: the leader's batches of
        inherited candidates (``run._batches``), through this object's calls; else ``None``."""
        c = self._config
        size = c.distributed.one_shot_batch
        if c.objective.mode != "one-shot" or size <= 1:
            return None
        from optuna_hpcnas.run._batches import InheritedBatches

        budget = c.study.n_trials is not None
        return InheritedBatches(
            self.study,
            sampler=c.sampler.build(seed_offset=group.index),
            size=size,
            budget=budget,
            reserve=c.objective.finalists if budget else 0,
            call=self._call,
            over=self._finalists_turn,
        )

    def _finalists_turn(self) -> bool:
        """The timeout's share for one-shot finalists has begun."""
        return self.finalists_from is not None and time.monotonic() >= self.finalists_from

    # ------------------------------------------------------------------ taking a trial
    def sweep(self) -> None:
        """Fail and queue again the trials of dead workers (``run._study``); not while the
        storage is away nor for the window's quiet time after it is back."""
        if not self.window.sweeps_allowed():
            _logger.debug("No sweep: the storage was away a moment ago.")
            return
        self._call(recover_dead_trials, self.study, self._config)

    def take(self) -> optuna.Trial | None:
        """The next budget trial, popped atomically, or (no ``n_trials``) a new ask. A pop
        tried again after a lost answer takes the trial the lost try claimed, if it did."""
        if self._config.study.n_trials is None:
            return self._call(self.study.ask)
        return self._call(_records.PopClaim(self.study, uuid.uuid4().hex))

    def keep_alive(self, trial: optuna.Trial) -> contextlib.ExitStack:
        """Start ``trial``'s heartbeat (RDB storages) or lease (the others): a worker killed
        at any point from now on leaves it recoverable. Close the stack to stop it. Both
        go on across a storage outage (``OutageWindow``)."""
        from optuna_hpcnas.storages import TrialHeartbeat
        from optuna_hpcnas.storages import TrialLease

        stack = contextlib.ExitStack()
        keeper: TrialHeartbeat | TrialLease
        if _records.has_heartbeat(trial.storage):
            keeper = TrialHeartbeat(trial, self.window)
        else:
            interval = float(self._config.checkpoints.heartbeat_interval)
            grace = grace_period(self._config)
            keeper = TrialLease(trial, interval=interval, grace_period=grace, window=self.window)
        self._call(stack.enter_context, keeper)
        return stack

    def suggest(self, space: HierarchicalSearchSpace, trial: optuna.Trial) -> Architecture:
        """The trial's architecture: the sampler runs (in one-shot mode a finalist's turn
        fixes it first, ``run._finalists``); its parameters and the architecture record are
        written together (one transaction on RDB storages)."""
        objective = self._config.objective
        if objective.mode == "one-shot" and objective.finalists:
            late = self._finalists_turn()
            of = self._call(
                turn_into_finalist,
                self.study,
                trial,
                finalists=objective.finalists,
                budget=self._config.study.n_trials is not None,
                late=late,
            )
            if of is not None:
                _logger.info(
                    "Trial %d is a one-shot finalist: trial %d's architecture, trained through "
                    "the stages.",
                    trial.number,
                    of,
                )
        return self._call(_records.suggest_architecture, space, trial)

    def plan(self) -> TrialPlan:
        """The plan of every trial of the run: read once (the study's directions and pruner
        do not change), so an ask costs no extra round trip to the storage."""
        from optuna_hpcnas.evaluation import TrialPlan

        if self._plan is None:
            c = self._config
            self._plan = self._call(TrialPlan.for_study, self.study, c.objective, c.stages)
        return self._plan

    def population(self, size: int) -> list[Architecture]:
        """The architectures of the last ``size`` complete trials."""
        return self._call(_records.finished_architectures, self.study, size)

    def has_completed_trial(self) -> bool:
        """Whether the study holds a complete trial (any run's)."""
        from optuna.trial import TrialState

        count = self.study._storage.get_n_trials  # a count, not the trials themselves
        return self._call(count, self.study._study_id, TrialState.COMPLETE) > 0

    # ------------------------------------------------------------------ during a trial
    def report(self, trial: optuna.Trial, plan: TrialPlan, step: int, value: float) -> Decision:
        """Report the value at ``step`` and read the pruner's verdict."""
        from optuna_hpcnas.evaluation import report_round

        return self._call(report_round, trial, plan, step, value, None)

    def constrain(self, trial: optuna.Trial, name: str, value: float) -> None:
        self._call(trial.set_constraint, name, value)

    # ------------------------------------------------------------------ ending a trial
    def tell(
        self,
        trial: optuna.Trial,
        outcome: Outcome,
        *,
        user: dict[str, Any],
        system: dict[str, Any],
    ) -> None:
        """The trial's attributes (one transaction on RDB storages), then its state."""
        self._call(_records.set_trial_attrs, trial, user=user, system=system)
        self._tell(trial, *outcome.told())

    def _tell(self, trial: optuna.Trial, state: Any, values: list[float] | None = None) -> None:
        self._call(_records.TellOnce(self.study, trial, state, values))

    def tell_infeasible(self, trial: optuna.Trial, excess: int, reason: str) -> None:
        """A layout larger than the group: the rank constraint > 0, the reason, and the worst
        value per direction (no training)."""
        # the space records the same constraint itself when it knows max_ranks
        if _keys.CLUSTER_RANKS_CONSTRAINT not in trial.constraints:
            self._call(trial.set_constraint, _keys.CLUSTER_RANKS_CONSTRAINT, float(excess))
        self._call(_records.set_trial_system_attr, trial, _keys.DISTRIBUTED_INFEASIBLE, reason)
        from optuna.trial import TrialState

        self._tell(trial, TrialState.COMPLETE, [_WORST[d] for d in self._config.directions])

    def requeue(self, trial: optuna.Trial, reason: str) -> bool:
        """Fail a running trial and queue its retry at once (a signal stopped the worker)."""
        from optuna_hpcnas.checkpoints import mark_trial_for_retry

        max_retry = self._config.checkpoints.max_retry
        return self._call(
            mark_trial_for_retry, self.study, trial._trial_id, reason=reason, max_retry=max_retry
        )

    def give_back(self, trial: optuna.Trial) -> bool:
        """Queue a trial asked but never started again, with its parameters; ``False`` when
        it had finished meanwhile (another worker recovered it)."""
        return self._call(_records.return_to_queue, trial)

    # ------------------------------------------------------------------ checkpoints, records
    def checkpoint(self, write: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A checkpoint write or read (``SupernetCheckpoints``: restore, save, after a trial,
        the last save): blobs and their records go to the study's storage."""
        return self._call(write, *args, **kwargs)

    def store_utilisation(self, reports: list[dict[str, Any]]) -> None:
        self._call(_records.store_utilisation, self.study, reports)
