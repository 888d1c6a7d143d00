"""The evaluation loop of one group: the next trial, shared with the group, evaluated by the
core on every rank.

Leader, main thread::

    LeaderQueue.next() (the ask ran on the queue's ask thread) -> TrialTask to the group
    every rank: TrialEvaluator.evaluate(arch, link, GroupEngine)   (the one core)
    leader: LeaderQueue.tell() (queued) -> hooks: averaging between groups, checkpoints

The leader's storage calls are the queue's (``run/_queue.py``); the other ranks get every
task and decision by broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
from dataclasses import dataclass
import time
from typing import TYPE_CHECKING

from optuna_hpcnas.distributed import GroupError
from optuna_hpcnas.distributed import Stop
from optuna_hpcnas.distributed import TrialTask
from optuna_hpcnas.evaluation import TrialPlan
from optuna_hpcnas.run._links import FollowerLink
from optuna_hpcnas.run._links import LeaderLink

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.distributed import EvaluationGroup
    from optuna_hpcnas.distributed import GroupChannel
    from optuna_hpcnas.distributed import UtilisationTracker
    from optuna_hpcnas.distributed._group_engine import GroupEngine
    from optuna_hpcnas.evaluation import TrialEvaluator
    from optuna_hpcnas.run._queue import LeaderQueue
    from optuna_hpcnas.run._queue import Taken


@dataclass(frozen=True)
class LoopHooks:
    """What the composition root plugs into the loop.

    Attributes:
        on_step: Called after every optimizer step (signal checks, averaging progress).
        after_trial: Called by the leader with the told trial's id (averaging, checkpoints).
        reads_told_trial: ``after_trial`` reads the told trial (checkpoint generations), so
            the leader waits for the tell before calling it.
        watch: Marks the leader's running trial (the retry on a signal).
    """

    on_step: Callable[[], None] | None = None
    after_trial: Callable[[int], None] | None = None
    reads_told_trial: bool = False
    watch: Callable[[optuna.Trial], contextlib.AbstractContextManager[None]] | None = None


class GroupLoop:
    """Runs trials on one group until the budget or the timeout ends them.

    Args:
        group: This rank's evaluation group.
        channel: The group's broadcast channel.
        core: The evaluation core.
        engine: The group's engine.
        tracker: This rank's utilisation tracker.
        queue: The leader's trials (``None`` on the other ranks).
        hooks: Step and trial hooks.
        timeout: Seconds of search (``SearchTimeout``).
    """

    def __init__(
        self,
        *,
        group: EvaluationGroup,
        channel: GroupChannel,
        core: TrialEvaluator,
        engine: GroupEngine,
        tracker: UtilisationTracker,
        queue: LeaderQueue | None,
        hooks: LoopHooks | None = None,
        timeout: float | None = None,
    ) -> None:
        self.group = group
        self.channel = channel
        self.core = core
        self.engine = engine
        self.tracker = tracker
        self.queue = queue
        self.hooks = hooks if hooks is not None else LoopHooks()
        self._timeout = SearchTimeout(timeout, queue, channel)

    def run(self) -> None:
        """The loop, inside the tracker's loop window: it ends with the rank's last trial;
        the queue's last storage calls are waited for after it (``drain``)."""
        try:
            with self.tracker.loop():
                self._run()
            if self.queue is not None:
                with self.channel.leader_section("writing the last results"):
                    self.queue.drain()
        finally:  # also on a signal or an error: no finished result is dropped
            if self.queue is not None:
                self.queue.close()

    def _run(self) -> None:
        # A leader holding one-shot batches meets a signal between trials too: its candidates
        # take no optimizer step, so it would otherwise meet it only at the watchdog's forced
        # exit. It checks inside its section: a stop there reaches the group's other ranks at
        # the share below, and they exit with the leader's status (``_shared``).
        between = None
        if self.queue is not None and self.queue.batches is not None:
            between = self.hooks.on_step
        while True:
            message: TrialTask | Stop | None = None
            taken: Taken | None = None
            if self.queue is not None:
                with self.channel.leader_section("while asking for the next trial"):
                    if between is not None:
                        between()
                    taken = self._next(self.queue)
                message = Stop() if taken is None else self._message(taken)
            with self.tracker.track("idle"):
                message = self._shared(message)
            if isinstance(message, Stop):
                return
            assert message is not None
            if taken is not None:
                self._lead(taken, message)
            else:
                self._follow(message)

    def _shared(self, message: TrialTask | Stop | None) -> TrialTask | Stop | None:
        """``channel.share``; the leader's stop on a signal ends this rank as it ends the
        leader (``Preempted`` with its exit status), not as a group failure."""
        try:
            return self.channel.share(message)
        except GroupError as error:
            from optuna_hpcnas.checkpoints import Preempted

            if error.error_type != Preempted.__name__:
                raise
            raise Preempted(int(error.leader_message)) from None

    def _next(self, queue: LeaderQueue) -> Taken | None:
        queue.check()  # an earlier write's error is raised here, in the section
        if self._timeout.passed():
            return None
        return queue.next()

    @staticmethod
    def _message(taken: Taken) -> TrialTask:
        return TrialTask(
            trial_number=taken.trial.number,
            architecture=taken.arch.to_json(),
            plan=taken.plan.to_dict(),
        )

    def _lead(self, taken: Taken, message: TrialTask) -> None:
        assert self.queue is not None
        link = LeaderLink(taken, self.queue, self.channel, self.group.comm, self.tracker)
        hooks = self.hooks
        # a batched candidate lives on the leader's local copy until its batch is written:
        # nothing in the study to give back on a signal, nor to read after the trial (it
        # trains nothing: no averaging, no checkpoint)
        watch: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if hooks.watch is not None and not taken.batched:
            watch = hooks.watch(taken.trial)
        started = time.monotonic()
        with watch:
            with self.tracker.track("compute"):
                ended = self._timeout.check
                outcome = self.core.evaluate(
                    taken.arch, link, self.engine, on_step=hooks.on_step, search_ended=ended
                )
        engine = "deepspeed" if self.engine.uses_deepspeed(taken.arch) else "plain"
        told = self.queue.tell(
            taken,
            outcome,
            records=link.take_records(),
            engine=engine,
            seconds=time.monotonic() - started,
        )
        if hooks.after_trial is not None and not taken.batched:
            with self.channel.leader_section("after the trial"):
                if hooks.reads_told_trial:
                    self.queue.wait(told)
                hooks.after_trial(taken.trial._trial_id)

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
                on_step=self.hooks.on_step,
                search_ended=self._timeout.check,
            )


class SearchTimeout:
    """The search's timeout on one group: no trial starts past it (``passed``), and a trial
    still training then stops at its next validation (``ended``, asked by the leader), once
    the study holds a complete trial, so that a search too short for any candidate still
    leaves one to export.

    Args:
        seconds: The timeout from now (``None``: none).
        queue: The leader's trials (``None`` on the other ranks, which never ask ``ended``).
        channel: The group's broadcast channel.
    """

    def __init__(
        self, seconds: float | None, queue: LeaderQueue | None, channel: GroupChannel
    ) -> None:
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._queue = queue
        self._channel = channel
        self._has_result = False  # the study holds a complete trial (read at the timeout)

    @property
    def check(self) -> Callable[[], bool] | None:
        """``search_ended`` for ``TrialEvaluator.evaluate``: on every rank of a group when
        there is a timeout (the leader's alone is called)."""
        return None if self._deadline is None else self.ended

    def passed(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def ended(self) -> bool:
        """The timeout has passed and the study holds a complete trial (read at each
        validation past the timeout until it does)."""
        assert self._queue is not None
        if not self.passed():
            return False
        if not self._has_result:
            with self._channel.leader_section("at the timeout"):
                self._has_result = self._queue.has_completed_trial()
        return self._has_result
