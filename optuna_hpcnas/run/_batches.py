"""``InheritedBatches``: one-shot mode's inherited candidates asked, told and written to the
study in batches.

A candidate scored by the supernet's weights alone takes a fraction of a second; asked and
told on the study one by one, its storage calls (pop, sampler reads, parameters, attributes,
state: a dozen round trips) would cost more than its scoring, and a central storage serves
only so many of them a second. Here the leader's sampler runs on a local in-memory copy of
the study instead: before each batch the copy reads the study's finished trials (one read),
then up to ``size`` candidates are asked, scored and told on the copy, and the finished ones
are written into the study's budget trials in one call (``_records.PublishFinished``: one
transaction on an RDB storage). They are ordinary trials of the study from then on (values,
parameters, records), which the dashboard, ``hpcnas status``, exports, finalists and resume
read as they read any other.

What this trades: the sampler does not see the candidates another group scores until that
group writes its batch (two groups may score the same architecture once each), and a killed
leader loses the scores of its batch not yet written (a fraction of a second of work each;
nothing is left RUNNING in the study). Trials that train (published models, finalists) and
every trial once the finalists' turn has come go through the study one by one, as before.
"""

from __future__ import annotations

from collections.abc import Callable
import logging
import math
import threading
from typing import Any
from typing import TYPE_CHECKING
import uuid

from optuna_hpcnas import _keys
from optuna_hpcnas import _records

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.evaluation import Outcome

_logger = logging.getLogger(__name__)
_FINISHED = ("COMPLETE", "PRUNED", "FAIL")


class InheritedBatches:
    """The local copy of one leader's study and its batches (see the module docstring).

    Args:
        study: The run's study (this leader's).
        sampler: The sampler of the local copy (the run's sampler, built for this leader).
        size: Candidates per batch.
        budget: The run has ``n_trials``: batches fill its WAITING budget trials.
        reserve: Budget trials left WAITING for the one-shot finalists.
        call: The leader's door to the storage (``StudyCalls._call``: the outage window).
        over: ``True`` once batches must end (the timeout's share for finalists has begun).
    """

    def __init__(
        self,
        study: optuna.Study,
        *,
        sampler: optuna.samplers.BaseSampler,
        size: int,
        budget: bool,
        reserve: int,
        call: Callable[..., Any],
        over: Callable[[], bool] = lambda: False,
    ) -> None:
        import optuna

        self._study = study
        self.size = size
        self._budget = budget
        self._reserve = reserve
        self._call = call
        self._over = over
        self._source = uuid.uuid4().hex  # marks what this leader wrote: not copied back
        self.local = optuna.create_study(
            storage=optuna.storages.InMemoryStorage(),
            sampler=sampler,
            pruner=optuna.pruners.NopPruner(),
            directions=study.directions,
        )
        self._copied: set[int] = set()  # trial ids of the study already in the copy
        self._lock = threading.Lock()
        self._left = 0  # candidates the open batch may still ask
        self._in_flight = 0  # asked and not written yet
        self._told: list[optuna.trial.FrozenTrial] = []
        self.written = 0
        self.dropped = 0
        self.closed = False

    # ------------------------------------------------------------------ the ask thread
    def open(self) -> bool:
        """``True`` when a candidate may be asked on the copy: the open batch has room, or
        a new one opens (the study read once: its finished trials copied, its budget
        counted). ``False`` ends batches for good: the study's own asks take over."""
        if not self.closed and self._over():
            with self._lock:
                self.closed, self._left = True, 0
        if self.closed:
            return False
        with self._lock:
            if self._left > 0:
                return True
            in_flight = self._in_flight
        room = self._call(self._read_study)
        if self._budget:
            room -= self._reserve + in_flight
        with self._lock:
            self._left = max(0, min(self.size, room))
            if self._left == 0:
                self.closed = True
            return self._left > 0

    def _read_study(self) -> int:
        """Copy the finished trials that are new (not this leader's); the budget room."""
        from optuna.trial import create_trial
        from optuna.trial import TrialState

        trials = self._study.get_trials(deepcopy=False)
        for t in trials:
            if t._trial_id in self._copied or t.state.name not in _FINISHED:
                continue
            self._copied.add(t._trial_id)
            if t.system_attrs.get(_keys.RUN_BATCH_SOURCE) == self._source:
                continue  # already in the copy: told here first
            self.local.add_trial(
                create_trial(
                    state=t.state,
                    values=t.values if t.state == TrialState.COMPLETE else None,
                    params=t.params,
                    distributions=t.distributions,
                    user_attrs=t.user_attrs,
                    system_attrs=t.system_attrs,
                    intermediate_values=t.intermediate_values,
                )
            )
        return _records.budget_room(trials) if self._budget else self.size

    def ask(self) -> optuna.Trial:
        """A candidate of the open batch (``open`` was ``True``), asked on the copy."""
        with self._lock:
            self._left -= 1
            self._in_flight += 1
        return self.local.ask()

    # ------------------------------------------------------------------ the write thread
    def tell(
        self,
        trial: optuna.Trial,
        outcome: Outcome,
        *,
        user: dict[str, Any],
        system: dict[str, Any],
    ) -> None:
        """Tell the copy; write the batch to the study once it is whole (or batches are
        over)."""
        _records.set_trial_attrs(
            trial, user=user, system={**system, _keys.RUN_BATCH_SOURCE: self._source}
        )
        state, values = outcome.told()
        self.local.tell(trial, values, state=state)
        self._finished(trial)

    def tell_infeasible(self, trial: optuna.Trial, excess: int, reason: str) -> None:
        """A layout larger than the group: the rank constraint, the reason and the worst
        value per direction, on the copy (as ``StudyCalls.tell_infeasible`` tells the
        study)."""
        from optuna.study import StudyDirection

        values = [
            -math.inf if d == StudyDirection.MAXIMIZE else math.inf for d in self.local.directions
        ]
        if _keys.CLUSTER_RANKS_CONSTRAINT not in trial.constraints:
            trial.set_constraint(_keys.CLUSTER_RANKS_CONSTRAINT, float(excess))
        _records.set_trial_attrs(
            trial,
            user={},
            system={_keys.DISTRIBUTED_INFEASIBLE: reason, _keys.RUN_BATCH_SOURCE: self._source},
        )
        self.local.tell(trial, values)
        self._finished(trial)

    def _finished(self, trial: optuna.Trial) -> None:
        frozen = self.local._storage.get_trial(trial._trial_id)
        with self._lock:
            self._told.append(frozen)
            held = len(self._told)
            whole = held >= self.size or (self.closed and self._left == 0)
        _logger.debug("Candidate %d told on the local copy (%d held).", trial.number, held)
        if whole:
            self.flush()

    def forget(self, count: int) -> None:
        """``count`` candidates asked and never told (the run stopped): not waited for."""
        with self._lock:
            self._in_flight -= count

    def flush(self) -> None:
        """Write every candidate told and not written yet (one batch; at the end of the run
        too). Those the budget has no room left for are dropped, with a line."""
        with self._lock:
            batch, self._told = self._told, []
        if not batch:
            return
        publish = _records.PublishFinished(
            self._study,
            batch,
            claim=uuid.uuid4().hex,
            budget=self._budget,
            reserve=self._reserve,
        )
        numbers = self._call(publish)
        with self._lock:
            self._in_flight -= len(batch)
        self.written += len(numbers)
        dropped = len(batch) - len(numbers)
        if dropped:
            self.dropped += dropped
            _logger.info(
                "%d candidate(s) scored by inherited weights found no budget trial left: "
                "not written.",
                dropped,
            )
        _logger.debug("Wrote %d inherited trial(s): %s.", len(numbers), numbers)
