"""The evaluation loop of one group: pull the next trial, evaluate it with the core, tell.

Leader, main thread::

    next task (the ask, done on the ask thread) -> share the TrialTask with the group
    every rank: TrialEvaluator.evaluate(arch, link, GroupEngine)   (the one core)
    leader: queue the tell -> average shared weights between groups -> checkpoints

Leader, ask thread (a ``StorageThread``): once the last queued tell is written, pop a budget
trial (or ask) -> heartbeat or lease -> suggest the architecture (the sampler runs here) ->
layout larger than the group? constraint + worst values, pull again -> the population.
Leader, write thread (another, first in first out): the trial's reports, attributes and tell;
a pruner's verdict is awaited only when it could stop the trial. With ``ask_ahead`` the next
ask is queued as soon as a trial starts, so it overlaps the trial's compute; otherwise after
the tell, as ``study.optimize`` asks. Two threads, so a verdict never waits behind the
sampler.

Only the leader touches the storage; the others get every task and decision by broadcast.
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

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas.distributed import DynamicScheduler
from optuna_hpcnas.distributed import Stop
from optuna_hpcnas.distributed import Task
from optuna_hpcnas.distributed import TrialTask
from optuna_hpcnas.distributed import UtilisationTracker
from optuna_hpcnas.evaluation import OptunaTrialLink
from optuna_hpcnas.evaluation import Outcome
from optuna_hpcnas.evaluation import TrialPlan
from optuna_hpcnas.run._links import FollowerLink
from optuna_hpcnas.run._links import LeaderLink
from optuna_hpcnas.run._storage_thread import StorageThread
from optuna_hpcnas.run._study import grace_period
from optuna_hpcnas.run._study import recover_dead_trials

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.distributed import EvaluationGroup
    from optuna_hpcnas.distributed import GroupChannel
    from optuna_hpcnas.distributed._group_engine import GroupEngine
    from optuna_hpcnas.evaluation import TrialEvaluator
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_logger = logging.getLogger(__name__)
_WORST = {"maximize": -math.inf, "minimize": math.inf}


class GroupLoop:
    """Runs trials on one group until the budget or the timeout ends them.

    Args:
        config: The run configuration.
        space: The search space.
        group: This rank's evaluation group.
        channel: The group's broadcast channel.
        study: The study (group leaders; ``None`` elsewhere).
        core: The evaluation core.
        engine: The group's engine.
        tracker: This rank's utilisation tracker.
        on_step: Called after every optimizer step (signal checks, averaging progress).
        after_trial: Called by the leader with the told trial's id (averaging, checkpoints).
        observe_ask: Called with the seconds of each ask (metrics).
    """

    def __init__(
        self,
        *,
        config: RunConfig,
        space: HierarchicalSearchSpace,
        group: EvaluationGroup,
        channel: GroupChannel,
        study: optuna.Study | None,
        core: TrialEvaluator,
        engine: GroupEngine,
        tracker: UtilisationTracker,
        on_step: Callable[[], None] | None = None,
        after_trial: Callable[[int], None] | None = None,
        observe_ask: Callable[[float], None] | None = None,
        watch: Callable[[optuna.Trial], Any] | None = None,
    ) -> None:
        self.config = config
        self.space = space
        self.group = group
        self.channel = channel
        self.study = study
        self.core = core
        self.engine = engine
        self.tracker = tracker
        self.on_step = on_step
        self.after_trial = after_trial
        self.observe_ask = observe_ask
        self.watch = watch
        self.trials_done = 0
        self.trials_infeasible = 0
        self._start = time.monotonic()
        self._scheduler = self._make_scheduler() if group.is_leader else None
        # the leader's storage threads: the trial's writes, and the asks (the sampler)
        self._writes = StorageThread(tracker) if group.is_leader else None
        self._asks = StorageThread(tracker) if group.is_leader else None
        self._told: Future[None] | None = None  # the last tell queued
        self._asking: Future[_Taken | None] | None = None  # the ask queued on that thread
        self._exhausted = False  # an ask found no trial left
        self._ask_ahead = _asks_ahead(config, group)
        # heartbeat or lease of every trial this leader took, from its pop to its tell
        self._alive: dict[int, contextlib.ExitStack] = {}
        self._grace = grace_period(config)
        self._swept = -math.inf

    def _make_scheduler(self) -> DynamicScheduler:
        cost_aware = self.config.distributed.scheduler == "cost_aware"
        return DynamicScheduler(
            num_groups=1,
            source=self._next_taken,
            cost_aware=cost_aware,
            lookahead=self.config.distributed.lookahead if cost_aware else 1,
        )

    @property
    def storage_thread_seconds(self) -> dict[str, float]:
        """Busy seconds of the leader's storage threads by category (they overlap compute)."""
        out: dict[str, float] = {}
        for thread in (self._writes, self._asks):
            if thread is not None:
                for k, v in thread.tracker.seconds.items():
                    if v > 0:
                        out[k] = out.get(k, 0.0) + v
        return out

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """The loop, inside the tracker's loop window: it ends with the rank's last trial;
        the storage threads' last calls are waited for after it (``drain``)."""
        try:
            with self.tracker.loop():
                self._run()
            if self._writes is not None and self._asks is not None:
                with self.channel.leader_section("writing the last results"):
                    self._writes.drain()
                    self._asks.drain()
        finally:  # also on a signal or an error: no finished result is dropped
            self._close()

    def _close(self) -> None:
        if self._writes is not None and self._asks is not None:
            self._writes.close()  # the queued writes (the last tell) finish first
            self._asks.close()
            self._give_back()
        for stack in self._alive.values():  # the heartbeat and lease threads
            stack.close()
        self._alive.clear()

    def _run(self) -> None:
        while True:
            message: Any = None
            task: Task | None = None
            if self.group.is_leader:
                with self.channel.leader_section("while asking for the next trial"):
                    task = self._next_task()
                message = Stop() if task is None else self._message(task)
            with self.tracker.track("idle"):
                message = self.channel.share(message)
            if isinstance(message, Stop):
                return
            if task is not None:
                self._lead(task.key, message)
            else:
                self._follow(message)

    def _next_task(self) -> Task | None:
        assert self._scheduler is not None and self._writes is not None
        self._writes.check()  # an earlier write's error is raised here, in the section
        if self._timed_out():
            return None
        return self._scheduler.next_task(0, time.monotonic())

    def _message(self, task: Task) -> TrialTask:
        taken: _Taken = task.key
        return TrialTask(
            trial_number=taken.trial.number,
            architecture=taken.arch.to_json(),
            plan=taken.plan.to_dict(),
        )

    def _lead(self, taken: _Taken, message: TrialTask) -> None:
        assert self._writes is not None
        trial, arch = taken.trial, taken.arch
        link = LeaderLink(
            OptunaTrialLink(trial, taken.plan),
            self.channel,
            self.group.comm,
            self.tracker,
            self._writes,
            population=taken.population,
        )
        watch = self.watch(trial) if self.watch is not None else contextlib.nullcontext()
        with watch:
            with self.tracker.track("compute"):
                outcome = self.core.evaluate(arch, link, self.engine, on_step=self.on_step)
        told = self._told = self._writes.submit(self._tell, link, arch, outcome)
        if self.after_trial is not None:
            with self.channel.leader_section("after the trial"):
                if self.config.checkpoints.enabled:  # the policy reads the told trial
                    self._writes.wait(told)
                self.after_trial(trial._trial_id)

    def _follow(self, message: TrialTask) -> None:
        from optuna_hpcnas.search_space import Architecture

        link = FollowerLink(
            message.trial_number,
            TrialPlan.from_dict(message.plan),
            self.channel,
            self.group.comm,
            self.tracker,
        )
        with self.tracker.track("compute"):
            self.core.evaluate(
                Architecture.from_json(message.architecture),
                link,
                self.engine,
                on_step=self.on_step,
            )

    # ------------------------------------------------------------------ leader: asking
    def _next_taken(self) -> Task | None:
        """The scheduler's source (main thread): the ask queued on the ask thread, the
        next one queued at once when asking ahead; the cost estimate is made here because
        it runs the shared supernet."""
        assert self._asks is not None
        if self._exhausted:
            return None
        if self._asking is None:
            self._asking = self._asks.submit(self._take, self._told)
        taken = self._asks.wait(self._asking, "sampler")  # the ask not done yet
        self._asking = None
        if taken is None:
            self._exhausted = True
            return None
        if self._ask_ahead:
            self._asking = self._asks.submit(self._take, self._told)
        cost = 0.0
        if self.config.distributed.scheduler == "cost_aware":
            with self.tracker.track("sampler"):
                cost = self.core.predicted_flops(taken.arch)
        return Task(key=taken, cost=cost, submitted=time.monotonic())

    def _give_back(self) -> None:
        """Trials asked but not started (asked ahead, or in the cost-aware window) go back
        to the queue with their parameters, for this run's resume or another worker."""
        assert self._scheduler is not None
        taken = [task.key for task in self._scheduler.take_waiting()]
        if self._asking is not None and self._asking.exception() is None:
            pending = self._asking.result()
            if pending is not None:
                taken.append(pending)
        self._asking = None
        for t in taken:
            if _records.return_to_queue(t.trial):
                _logger.info("Trial %d was asked but not started: queued again.", t.trial.number)
            self._release(t.trial)

    def _keep_alive(self, trial: optuna.Trial) -> None:
        """From the moment it is RUNNING, a trial sends heartbeats (RDB storages) or holds a
        lease (the others), so a worker killed at any point leaves it recoverable."""
        from optuna_hpcnas.storages import TrialLease

        stack = contextlib.ExitStack()
        if _records.has_heartbeat(trial.storage):
            stack.enter_context(_records.heartbeat(trial))
        else:
            interval = float(self.config.checkpoints.heartbeat_interval)
            stack.enter_context(TrialLease(trial, interval=interval, grace_period=self._grace))
        self._alive[trial._trial_id] = stack

    def _release(self, trial: optuna.Trial) -> None:
        stack = self._alive.pop(trial._trial_id, None)
        if stack is not None:
            stack.close()

    def _sweep(self) -> None:
        """Recover dead workers' trials, at most every half grace period (a storage scan)."""
        assert self.study is not None
        now = time.monotonic()
        if now - self._swept >= self._grace / 2:
            self._swept = now
            recover_dead_trials(self.study, self.config)

    # ------------------------------------------------------------------ leader: storage threads
    def _timed_out(self) -> bool:
        timeout = self.config.study.timeout
        return timeout is not None and time.monotonic() - self._start >= timeout

    @property
    def _ask_tracker(self) -> UtilisationTracker:
        """The ask thread's tracker (the calls below, but the tell, run there)."""
        assert self._asks is not None
        return self._asks.tracker

    def _pop(self) -> optuna.Trial | None:
        assert self.study is not None
        with self._ask_tracker.track("storage"):  # the timeout is the main thread's to check
            self._sweep()
            trial: optuna.Trial | None
            if self.config.study.n_trials is None:
                trial = self.study.ask()
            else:
                trial = _records.pop_waiting_trial(self.study)
            if trial is not None:
                self._keep_alive(trial)
            return trial

    def _take(self, told: Future[None] | None) -> _Taken | None:
        """The next feasible trial of the study, its architecture, plan and population, once
        the last tell queued before this ask is written (its error is raised by the write
        thread's own check)."""
        assert self.study is not None
        if told is not None:
            with self._ask_tracker.track("storage"):
                wait_futures([told])
        from optuna.exceptions import UpdateFinishedTrialError

        while True:
            trial = self._pop()
            if trial is None:
                return None
            started = time.perf_counter()
            try:
                with self._ask_tracker.track("sampler"):
                    arch = self.space.suggest(trial)
                if self.observe_ask is not None:
                    self.observe_ask(time.perf_counter() - started)
                with self._ask_tracker.track("storage"):
                    _records.record_architecture(trial, arch)
            except UpdateFinishedTrialError:
                # A sweep took the trial for a dead worker's before its first heartbeat or
                # lease renewal, and queued its retry: leave both to the others.
                self._release(trial)
                _logger.warning(
                    "Trial %d was recovered while it was asked; asking again.", trial.number
                )
                continue
            excess = arch.cluster.ranks - self.group.size
            if excess > 0:
                self._tell_infeasible(trial, arch, excess)
                continue
            with self._ask_tracker.track("storage"):
                plan = TrialPlan.for_study(self.study, self.config.objective, self.config.stages)
                population = None
                if self.config.objective.population_steps:
                    size = self.config.objective.population_size
                    population = _records.finished_architectures(self.study, size)
            return _Taken(trial, arch, plan, population)

    def _tell_infeasible(self, trial: optuna.Trial, arch: Architecture, excess: int) -> None:
        """``dp x pp`` exceeds the group: a constraint > 0 and the worst values, no training."""
        assert self.study is not None
        reason = (
            f"data_parallel x pipeline_stages = {arch.cluster.ranks} exceeds the "
            f"{self.group.size} ranks of evaluation group {self.group.index}"
        )
        with self._ask_tracker.track("storage"):
            # the space records the same constraint itself when it knows max_ranks
            if _keys.CLUSTER_RANKS_CONSTRAINT not in trial.constraints:
                trial.set_constraint(_keys.CLUSTER_RANKS_CONSTRAINT, float(excess))
            _records.set_trial_system_attr(trial, _keys.DISTRIBUTED_INFEASIBLE, reason)
            self.study.tell(trial, [_WORST[d] for d in self.config.directions])
        self._release(trial)
        self.trials_infeasible += 1
        _logger.info("Trial %d infeasible: %s.", trial.number, reason)

    def _tell(self, link: LeaderLink, arch: Architecture, outcome: Outcome) -> None:
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        assert self.study is not None
        trial = link.trial
        engine = "deepspeed" if self.engine.uses_deepspeed(arch) else "plain"
        c = arch.cluster
        layout = f"dp{c.data_parallel}xpp{c.pipeline_stages} on {self.group.size} ranks ({engine})"
        assert self._writes is not None
        try:
            with self._writes.tracker.track("storage"):
                system: dict[str, Any] = {
                    _keys.DISTRIBUTED_GROUP: self.group.index,
                    _keys.DISTRIBUTED_LAYOUT: layout,
                }
                _records.set_trial_attrs(trial, user=link.take_records(), system=system)
                if outcome.state == "complete":
                    assert outcome.values is not None
                    self.study.tell(trial, list(outcome.values))
                elif outcome.state == "pruned":
                    self.study.tell(trial, state=TrialState.PRUNED)
                else:
                    self.study.tell(trial, state=TrialState.FAIL)
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
            self._release(trial)
        self.trials_done += 1


@dataclass(frozen=True)
class _Taken:
    """A trial the leader took: its architecture, plan and (population steps) population."""

    trial: optuna.Trial
    arch: Architecture
    plan: TrialPlan
    population: list[Architecture] | None


def _asks_ahead(config: RunConfig, group: EvaluationGroup) -> bool:
    mode = config.distributed.ask_ahead
    return mode == "on" or (mode == "auto" and group.num_groups > 1)
