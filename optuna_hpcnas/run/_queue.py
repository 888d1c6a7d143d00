"""``LeaderQueue``: the trials of one group leader, from the ask to the tell.

It takes trials (pop a budget trial or ask, keep it alive, suggest its architecture, tell
a layout larger than the group infeasible and take the next), sweeps dead workers' trials,
queues the per-round reports and the tell, and gives back the trials asked but not started
when the run stops. Its storage calls run on two ``StorageThread``\\ s, each in order: the
asks (the sampler runs there; an ask starts once the last queued tell is written) and the
writes (reports, attributes, tells), so a pruner's verdict never waits behind the sampler.
Every call goes through one ``StudyCalls``.

Main thread::

    prefetch() (asking ahead: the first ask runs during the warm-up) ... next() -> the
    scheduler's next trial (waits for the ask; queues the next one when asking ahead)
    ... report() / constrain() / population() ... tell() -> close(): give back
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
import contextlib
from dataclasses import dataclass
import logging
import math
import time
from typing import Any
from typing import TYPE_CHECKING
from typing import TypeVar

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.distributed import DynamicScheduler
from optuna_hpcnas.distributed import Task
from optuna_hpcnas.run._storage_thread import StorageThread
from optuna_hpcnas.run._study import grace_period

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.distributed import EvaluationGroup
    from optuna_hpcnas.distributed import UtilisationTracker
    from optuna_hpcnas.evaluation import Decision
    from optuna_hpcnas.evaluation import Outcome
    from optuna_hpcnas.evaluation import TrialPlan
    from optuna_hpcnas.run._batches import InheritedBatches
    from optuna_hpcnas.run._calls import StudyCalls
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Taken:
    """A trial the leader took: its architecture, plan and (population steps) population;
    ``batched``: a one-shot candidate asked on the leader's local copy of the study
    (``run._batches``), written to the study with its batch."""

    trial: optuna.Trial
    arch: Architecture
    plan: TrialPlan
    population: list[Architecture] | None
    batched: bool = False


class _KeptAlive:
    """The heartbeat or lease of every trial the leader holds, from its pop to its tell."""

    def __init__(self, calls: StudyCalls) -> None:
        self._calls = calls
        self._stacks: dict[int, contextlib.ExitStack] = {}

    def start(self, trial: optuna.Trial) -> None:
        self._stacks[trial._trial_id] = self._calls.keep_alive(trial)

    def release(self, trial: optuna.Trial) -> None:
        stack = self._stacks.pop(trial._trial_id, None)
        if stack is not None:
            stack.close()

    def close(self) -> None:
        for stack in self._stacks.values():  # the heartbeat and lease threads
            stack.close()
        self._stacks.clear()


class _Asker:
    """The ask thread: the next feasible trial, its architecture, plan and population."""

    def __init__(
        self,
        calls: StudyCalls,
        space: HierarchicalSearchSpace,
        group: EvaluationGroup,
        config: RunConfig,
        alive: _KeptAlive,
        thread: StorageThread,
        observe_ask: Callable[[float], None] | None,
        batches: InheritedBatches | None = None,
    ) -> None:
        self._calls = calls
        self.batches = batches
        self._space = space
        self._group = group
        self._config = config
        self._alive = alive
        self.thread = thread
        self._observe_ask = observe_ask
        d = config.distributed
        self._ahead = d.ask_ahead == "on" or (d.ask_ahead == "auto" and group.num_groups > 1)
        self._asking: Future[Taken | None] | None = None  # the ask queued on the thread
        self._exhausted = False  # an ask found no trial left
        self._swept = -math.inf
        self.infeasible = 0

    def next(self, told: Future[None] | None) -> Taken | None:
        """The ask queued on the thread (queued now if none is), the next one queued at once
        when asking ahead; each starts once ``told`` (the last tell queued) is written."""
        if self._exhausted:
            return None
        if self._asking is None:
            self._asking = self.thread.submit(self._take, told)
        taken = self.thread.wait(self._asking, "sampler")  # the ask not done yet
        self._asking = None
        if taken is None:
            self._exhausted = True
        elif self._ahead:
            self._asking = self.thread.submit(self._take, told)
        return taken

    def prefetch(self) -> bool:
        """Queue the first ask now when asking ahead (before the warm-up: its pop and sampler
        run while the supernet trains, not on the loop's first wait). One process asks only
        in the loop, where the Python API asks."""
        if not self._ahead or self._asking is not None or self._exhausted:
            return False
        self._asking = self.thread.submit(self._take, None)
        return True

    def pending(self) -> Taken | None:
        """The trial asked ahead and not handed out (after the thread is closed)."""
        asking, self._asking = self._asking, None
        if asking is None or asking.exception() is not None:
            return None
        return asking.result()

    def _take(self, told: Future[None] | None) -> Taken | None:
        """The next feasible trial of the study. The sampler runs once ``told`` (the last
        tell queued) is written (its error, if any, is raised by the write thread's own
        check); a budget trial is popped while that tell is still being written, as popping
        involves no sampler."""
        from optuna.exceptions import UpdateFinishedTrialError

        if self.batches is not None:
            taken = self._take_batched(told)
            if taken is not None:
                return taken
            told = None  # waited for
        tracker = self.thread.tracker
        if self._config.study.n_trials is None:  # study.ask() runs the sampler's hooks
            self._wait(told)
            told = None
        while True:
            trial = self._pop()
            if trial is None:
                return None
            self._wait(told)
            told = None
            started = time.perf_counter()
            try:
                with tracker.track("sampler"):
                    arch = self._calls.suggest(self._space, trial)
                if self._observe_ask is not None:
                    self._observe_ask(time.perf_counter() - started)
            except UpdateFinishedTrialError:
                # A sweep took the trial for a dead worker's before its first heartbeat or
                # lease renewal, and queued its retry: leave both to the others.
                self._alive.release(trial)
                _logger.warning(
                    "Trial %d was recovered while it was asked; asking again.", trial.number
                )
                continue
            excess = arch.cluster.ranks - self._group.size
            if excess > 0:
                self._tell_infeasible(trial, arch, excess)
                continue
            with tracker.track("storage"):
                plan = self._calls.plan().for_trial(trial.user_attrs)
                return Taken(trial, arch, plan, self._population())

    def _take_batched(self, told: Future[None] | None) -> Taken | None:
        """The next candidate of a batch, asked on the local copy; ``None`` once batches
        are over (what the copy holds is written first: the finalists are chosen from it)."""
        batches = self.batches
        assert batches is not None
        tracker = self.thread.tracker
        self._wait(told)
        while True:
            with tracker.track("storage"):
                if not batches.open():
                    batches.flush()
                    return None
            started = time.perf_counter()
            with tracker.track("sampler"):
                trial = batches.ask()
                arch = _records.suggest_architecture(self._space, trial)
            if self._observe_ask is not None:
                self._observe_ask(time.perf_counter() - started)
            excess = arch.cluster.ranks - self._group.size
            if excess > 0:
                batches.tell_infeasible(trial, excess, self._infeasible_reason(arch))
                self.infeasible += 1
                continue
            plan = self._calls.plan().for_trial(trial.user_attrs)
            return Taken(trial, arch, plan, self._population(), batched=True)

    def _wait(self, told: Future[None] | None) -> None:
        if told is not None:
            with self.thread.tracker.track("storage"):
                wait_futures([told])

    def _population(self) -> list[Architecture] | None:
        objective = self._config.objective
        if not objective.population_steps:
            return None
        return self._calls.population(objective.population_size)

    def _pop(self) -> optuna.Trial | None:
        """Sweep (at most every half grace period: a storage scan), then pop or ask; the
        trial is kept alive from here. The timeout is the main thread's to check."""
        with self.thread.tracker.track("storage"):
            now = time.monotonic()
            if now - self._swept >= grace_period(self._config) / 2:
                self._swept = now
                self._calls.sweep()
            trial = self._calls.take()
            if trial is not None:
                self._alive.start(trial)
            return trial

    def _infeasible_reason(self, arch: Architecture) -> str:
        return (
            f"data_parallel x pipeline_stages = {arch.cluster.ranks} exceeds the "
            f"{self._group.size} ranks of evaluation group {self._group.index}"
        )

    def _tell_infeasible(self, trial: optuna.Trial, arch: Architecture, excess: int) -> None:
        reason = self._infeasible_reason(arch)
        with self.thread.tracker.track("storage"):
            self._calls.tell_infeasible(trial, excess, reason)
        self._alive.release(trial)
        self.infeasible += 1
        _logger.info("Trial %d infeasible: %s.", trial.number, reason)


class LeaderQueue:
    """The trials of one group leader (see the module docstring).

    Args:
        calls: The leader's storage calls.
        config: The run configuration.
        space: The search space (the sampler suggests through it on the ask thread).
        group: The leader's evaluation group.
        tracker: The leader's main-thread tracker (its waits are counted there).
        observe_ask: Called with the seconds of each ask (metrics).
        cost: The predicted cost of an architecture, for the cost-aware scheduler (main
            thread: it may run the shared supernet).
    """

    def __init__(
        self,
        calls: StudyCalls,
        *,
        config: RunConfig,
        space: HierarchicalSearchSpace,
        group: EvaluationGroup,
        tracker: UtilisationTracker,
        observe_ask: Callable[[float], None] | None = None,
        cost: Callable[[Architecture], float] | None = None,
    ) -> None:
        self.calls = calls
        self._alive = _KeptAlive(calls)
        self._writes = StorageThread(tracker)
        self.batches = calls.inherited_batches(group)
        self._asker = _Asker(
            calls,
            space,
            group,
            config,
            self._alive,
            StorageThread(tracker),
            observe_ask,
            self.batches,
        )
        self._group = group
        self._tracker = tracker
        d = config.distributed
        cost_aware = d.scheduler == "cost_aware"
        self._scheduler = DynamicScheduler(
            num_groups=1,
            source=self._next_task,
            cost_aware=cost_aware,
            lookahead=d.lookahead if cost_aware else 1,
        )
        self._cost = cost if cost_aware else None
        self._told: Future[None] | None = None  # the last tell queued
        self.trials_done = 0

    @property
    def trials_infeasible(self) -> int:
        return self._asker.infeasible

    @property
    def storage_thread_seconds(self) -> dict[str, float]:
        """Busy seconds of the two storage threads by category (they overlap compute)."""
        out: dict[str, float] = {}
        for thread in (self._writes, self._asker.thread):
            for k, v in thread.tracker.seconds.items():
                if v > 0:
                    out[k] = out.get(k, 0.0) + v
        return out

    # ------------------------------------------------------------------ taking
    def check(self) -> None:
        """Raise the error of a queued write that failed (where the loop can share it)."""
        self.calls.window.check()
        self._writes.check()

    def check_storage(self) -> None:
        """Raise ``StorageUnavailable`` once the storage has been away past the window (at
        a round: the run then ends within one round, not at the next trial)."""
        self.calls.window.check()

    def prefetch(self) -> bool:
        """Start the first ask on the ask thread now when asking ahead (multi-group runs:
        it then overlaps the warm-up); ``False`` when nothing was queued."""
        return self._asker.prefetch()

    def next(self) -> Taken | None:
        """The trial to run next (main thread), ``None`` when none is left."""
        task = self._scheduler.next_task(0, time.monotonic())
        return None if task is None else task.key

    def _next_task(self) -> Task | None:
        """The scheduler's source: the next ask, with its predicted cost when cost-aware."""
        taken = self._asker.next(self._told)
        if taken is None:
            return None
        cost = 0.0
        if self._cost is not None:
            with self._tracker.track("sampler"):
                cost = self._cost(taken.arch)
        return Task(key=taken, cost=cost, submitted=time.monotonic())

    # ------------------------------------------------------------------ during a trial
    def report(
        self, trial: optuna.Trial, plan: TrialPlan, step: int, value: float
    ) -> Future[Decision]:
        """Queue the report at ``step``; its future holds the pruner's verdict."""
        return self._writes.submit(self.calls.report, trial, plan, step, value)

    def constrain(self, trial: optuna.Trial, name: str, value: float) -> None:
        self._writes.submit(self.calls.constrain, trial, name, value)

    def population(self, size: int) -> list[Architecture]:
        return self.wait(self._writes.submit(self.calls.population, size))

    def has_completed_trial(self) -> bool:
        return self.wait(self._writes.submit(self.calls.has_completed_trial))

    def wait(self, future: Future[T], category: str = "storage") -> T:
        """The result of a queued call; the main thread's wait counts as ``category``."""
        return self._writes.wait(future, category)

    # ------------------------------------------------------------------ ending a trial
    def tell(
        self,
        taken: Taken,
        outcome: Outcome,
        *,
        records: dict[str, Any],
        engine: str,
        seconds: float | None = None,
    ) -> Future[None]:
        """Queue the trial's user attributes ``records``, its group and layout (trained by
        ``engine``), the ``seconds`` its evaluation took, and its tell; the next ask starts
        after it."""
        c = taken.arch.cluster
        layout = (
            f"dp{c.data_parallel}xpp{c.pipeline_stages} on {self._group.size} ranks ({engine})"
        )
        system: dict[str, Any] = {
            _keys.DISTRIBUTED_GROUP: self._group.index,
            _keys.DISTRIBUTED_LAYOUT: layout,
        }
        if seconds is not None:
            system[_keys.DISTRIBUTED_EVALUATION_SECONDS] = round(seconds, 3)
        self._told = self._writes.submit(
            self._tell, taken.trial, outcome, records, system, taken.batched
        )
        return self._told

    def _tell(
        self,
        trial: optuna.Trial,
        outcome: Outcome,
        records: dict[str, Any],
        system: dict[str, Any],
        batched: bool,
    ) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        if batched:  # on the local copy; its batch is written once whole
            assert self.batches is not None
            with self._writes.tracker.track("storage"):
                self.batches.tell(trial, outcome, user=records, system=system)
            self.trials_done += 1
            return
        try:
            with self._writes.tracker.track("storage"):
                self.calls.tell(trial, outcome, user=records, system=system)
            # after the write: a test holds every told result to what the storage keeps
            _logger.debug("Trial %d told %s.", trial.number, outcome.state.upper())
        except UpdateFinishedTrialError:
            # Another worker took this trial for dead (no renewal for a grace period) and
            # queued it again; its retry will run, this result is dropped.
            _logger.warning(
                "Trial %d was recovered by another worker while it ran; its result is "
                "dropped (raise [checkpoints] grace_period).",
                trial.number,
            )
        finally:
            self._alive.release(trial)
        self.trials_done += 1

    # ------------------------------------------------------------------ the end
    def drain(self) -> None:
        """Wait for every queued call (counted as drain), the last batch written; raise the
        first error."""
        if self.batches is not None:
            self._writes.submit(self.batches.flush)
        self._writes.drain()
        self._asker.thread.drain()

    def close(self) -> None:
        """Finish the queued writes (the last tell first), give back what was asked but not
        started, stop every heartbeat and lease; errors are logged (also on a signal). With
        the storage gone past the window nothing is given back: the trials held stay
        RUNNING until their heartbeats or leases are stale, then a sweep retries them."""
        if self.batches is not None and not self.calls.window.gave_up:
            self._writes.submit(self.batches.flush)  # the candidates told: not lost
        self._writes.close()
        self._asker.thread.close()
        if not self.calls.window.gave_up:
            self._give_back()
        self._alive.close()

    def _give_back(self) -> None:
        """Trials asked but not started (asked ahead, or in the cost-aware window) go back
        to the queue with their parameters, for this run's resume or another worker."""
        taken: list[Taken] = [task.key for task in self._scheduler.take_waiting()]
        pending = self._asker.pending()
        if pending is not None:
            taken.append(pending)
        batched = [t for t in taken if t.batched]  # only on the local copy: nothing to give
        if batched and self.batches is not None:
            self.batches.forget(len(batched))
        for t in (t for t in taken if not t.batched):
            if self.calls.give_back(t.trial):
                _logger.info("Trial %d was asked but not started: queued again.", t.trial.number)
            self._alive.release(t.trial)
