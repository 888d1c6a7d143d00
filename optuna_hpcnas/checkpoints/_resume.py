"""Resume after faults: heartbeat storage, retry of dead or preempted trials, signal handling.

A worker killed with SIGKILL leaves its trial RUNNING; with RDB heartbeats, the next worker to
start a trial after ``grace_period`` marks it FAIL and Optuna's
``RetryHeartbeatStaleTrialCallback`` queues a WAITING copy, which the next ``ask`` picks up. A
worker that gets SIGTERM or SIGUSR1 (Slurm preemption, ``--signal=B:USR1@120``) does the same at
once through :class:`PreemptionGuard`: checkpoint at the next step boundary, FAIL the running
trial, queue its retry, exit; a watchdog forces the exit before the deadline if the training
loop never reaches a boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
import contextlib
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any
from typing import Protocol
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas._validation import check_number
from optuna_hpcnas._validation import check_str
from optuna_hpcnas.checkpoints._config import CheckpointConfig
from optuna_hpcnas.storages import CALL_TIMEOUT_S

if TYPE_CHECKING:
    import optuna

_logger = logging.getLogger(__name__)


def heartbeat_storage(
    url: str,
    config: CheckpointConfig | None = None,
    *,
    engine_kwargs: dict[str, Any] | None = None,
    call_timeout: float | None = CALL_TIMEOUT_S,
) -> optuna.storages.RDBStorage:
    """An RDB storage whose dead workers' trials are retried.

    Heartbeats every ``config.heartbeat_interval`` seconds; a trial silent for
    ``config.grace_period`` is failed and re-queued (up to ``config.max_retry`` times) by
    :class:`optuna.storages.RetryHeartbeatStaleTrialCallback`. Built by the storage room's
    one RDB constructor (``optuna_hpcnas.storages.rdb_storage``), as ``open_storage`` builds it,
    with the same bound on a call to a frozen PostgreSQL or MySQL server: ``call_timeout``
    seconds (``open_storage``'s ``call_timeout``; ``None`` waits without limit).

    Examples:
        .. code-block:: python

            config = CheckpointConfig(heartbeat_interval=30)
            storage = heartbeat_storage("sqlite:///study.db", config)
            study = optuna.load_study(study_name="nas", storage=storage)
    """
    from optuna_hpcnas.storages import rdb_storage

    check_str("url", url, what="a SQLAlchemy URL string")
    check_number("call_timeout", call_timeout, allow_none=True)
    config = config or CheckpointConfig()
    return rdb_storage(
        url,
        heartbeat_interval=config.heartbeat_interval,
        grace_period=config.grace_period,
        max_retry=config.max_retry,
        engine_kwargs=engine_kwargs,
        call_timeout=call_timeout,
    )


def mark_trial_for_retry(
    study: optuna.Study,
    trial_id: int,
    *,
    reason: str,
    max_retry: int | None = None,
) -> bool:
    """FAIL a running trial and queue a WAITING copy, as a heartbeat sweep would
    (``optuna_hpcnas.storages.fail_and_requeue``; ``reason`` is recorded as
    ``hpcnas:checkpoints:preempted``). Returns whether this call failed the trial (``False``
    if it had already finished).
    """
    from optuna_hpcnas.storages import fail_and_requeue

    return fail_and_requeue(
        study,
        trial_id,
        reason_key=_keys.CHECKPOINT_PREEMPTED,
        reason=reason,
        max_retry=max_retry,
        event="stopped",
    )


class Peers(Protocol):
    """The other ranks of the job (``optuna_hpcnas.distributed._stop.JobStop``): a signal that
    reached one rank stops them all, each leader giving back its trial."""

    @property
    def is_leader(self) -> bool: ...

    def notify(self, signum: int) -> None: ...

    def poll(self) -> int | None: ...

    def done(self) -> None: ...

    def ready(self) -> bool: ...

    def wait(self, seconds: float) -> bool: ...


class Preempted(SystemExit):
    """Raised by :meth:`PreemptionGuard.check` after the state is saved; exits the process."""


class PreemptionGuard:
    """SIGTERM/SIGUSR1 handling for a worker: checkpoint, retry the trial, exit in time.

    Install it around the worker loop (signal handlers can only be set in the main thread; the
    previous handlers come back on exit), tell it which trial runs with :meth:`watch`, and call
    :meth:`check` at every step boundary. On a signal, the next :meth:`check` calls
    ``checkpoint()``, FAILs the watched trial, queues its retry and raises :class:`Preempted`
    (exit status ``128 + signal``). If no :meth:`check` comes within ``deadline`` seconds, a
    watchdog thread queues the retry and ends the process itself (the last periodic checkpoint
    is then the one resumed from).

    Args:
        checkpoint: Saves the current state (e.g. ``lambda: manager.save(*state(), step=s)``).
        signals: Signals handled (names or numbers).
        deadline: Seconds from the signal to the forced exit (at most 30).
        max_retry: Retries when the storage has no heartbeat callback of its own.
        requeue: Fails the watched trial and queues its retry, given the trial and the
            signal's name (default: ``mark_trial_for_retry`` with ``max_retry``).
        peers: The other ranks of an MPI job: a signal one rank got is passed on at each
            :meth:`check`, every group leader gives back its trial, and a rank exits once
            the leaders it waits for did (at most ``deadline / 2`` seconds).
        before_exit: Called by the watchdog before it ends the process (from its thread):
            writes what must not be lost, e.g. results held back to be written together.

    Examples:
        .. code-block:: python

            with PreemptionGuard(checkpoint=save_now) as guard:

                def objective(trial):
                    with guard.watch(trial):
                        for step in range(steps):
                            train_step()
                            guard.check()
                    return evaluate()

                study.optimize(objective, callbacks=[guard])
    """

    def __init__(
        self,
        *,
        checkpoint: Callable[[], object] | None = None,
        signals: Sequence[str | int] = ("SIGTERM", "SIGUSR1"),
        deadline: float = 25.0,
        max_retry: int | None = 3,
        requeue: Callable[[optuna.Trial, str], object] | None = None,
        peers: Peers | None = None,
        before_exit: Callable[[], object] | None = None,
    ) -> None:
        if checkpoint is not None and not callable(checkpoint):
            raise TypeError(f"`checkpoint` is {checkpoint!r}, but must be callable or None.")
        check_number("deadline", deadline, positive=False)
        if not 0 < deadline <= 30:
            raise ValueError(f"`deadline` is {deadline}, but must be in (0, 30] seconds.")
        resolved = []
        for s in signals:
            try:
                resolved.append(signal.Signals[s] if isinstance(s, str) else signal.Signals(s))
            except (KeyError, ValueError):
                raise ValueError(f"`signals` holds {s!r}, which is not a signal.") from None
        if not resolved:
            raise ValueError("`signals` is empty.")
        self._checkpoint = checkpoint
        self._signals = tuple(resolved)
        self._deadline = float(deadline)
        self._max_retry = max_retry
        self._requeue = requeue
        self._peers = peers
        self._before_exit = before_exit
        self._previous: dict[signal.Signals, Any] = {}
        self._received: signal.Signals | None = None
        self._trial: optuna.Trial | None = None
        self._handled = threading.Event()
        self._lock = threading.Lock()
        self._watchdog: threading.Timer | None = None

    @classmethod
    def from_config(
        cls,
        config: CheckpointConfig,
        *,
        checkpoint: Callable[[], object] | None = None,
        requeue: Callable[[optuna.Trial, str], object] | None = None,
        peers: Peers | None = None,
        signals: Sequence[str | int] = ("SIGTERM", "SIGUSR1"),
        before_exit: Callable[[], object] | None = None,
    ) -> PreemptionGuard:
        """The guard of ``[checkpoints]`` (its deadline and retries); arguments as the
        constructor's."""
        return cls(
            checkpoint=checkpoint,
            signals=signals,
            deadline=config.exit_deadline,
            max_retry=config.max_retry,
            requeue=requeue,
            peers=peers,
            before_exit=before_exit,
        )

    @property
    def requested(self) -> bool:
        """Whether a handled signal arrived."""
        return self._received is not None

    @property
    def received(self) -> signal.Signals | None:
        return self._received

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionGuard must be entered in the main thread.")
        for s in self._signals:
            self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()

    @contextlib.contextmanager
    def watch(self, trial: optuna.Trial) -> Iterator[None]:
        """Mark ``trial`` as the one to retry if a signal stops this worker."""
        self._trial = trial
        try:
            yield
        finally:
            self._trial = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._received is None:
            self._stop(signal.Signals(signum), "Received")

    def _stop(self, received: signal.Signals, how: str) -> None:
        self._received = received
        _logger.warning(
            "%s %s: checkpointing at the next step and exiting within %.0f s.",
            how,
            received.name,
            self._deadline,
        )
        self._watchdog = threading.Timer(self._deadline, self._force_exit)
        self._watchdog.daemon = True
        self._watchdog.start()

    def check(self) -> None:
        """At a step boundary: if a signal arrived (here, or at another rank of the job),
        checkpoint, retry the trial, exit."""
        peers = self._peers
        if self._received is None and peers is not None:
            told = peers.poll()
            if told is not None:
                self._stop(signal.Signals(told), "Another rank of the job received")
        if self._received is None:
            return
        if peers is not None:
            peers.notify(int(self._received))
            if not peers.is_leader and not peers.ready():
                return  # steps on with its leader until the leader gave the trial back
        with self._lock:
            if self._handled.is_set():
                return
            if self._checkpoint is not None:
                try:
                    self._checkpoint()
                except Exception:
                    _logger.exception("Checkpoint on %s failed.", self._received.name)
            self._retry_trial()
            self._handled.set()
        if peers is not None and peers.is_leader:
            peers.done()
            if not peers.wait(self._deadline / 2):
                _logger.warning("Not every group leader gave back its trial in time.")
        if self._watchdog is not None:
            self._watchdog.cancel()
        raise Preempted(128 + int(self._received))

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna callback: between trials, a pending signal still checkpoints and exits."""
        self.check()

    def _retry_trial(self) -> None:
        trial = self._trial
        if trial is None or self._received is None:
            return
        if self._requeue is not None:
            self._requeue(trial, self._received.name)
            return
        mark_trial_for_retry(
            trial.study,
            trial._trial_id,
            reason=self._received.name,
            max_retry=self._max_retry,
        )

    def _force_exit(self) -> None:
        assert self._received is not None
        with self._lock:
            if self._handled.is_set():
                return
            _logger.error(
                "No step boundary within %.0f s of %s: queueing the trial for retry and exiting "
                "without a new checkpoint.",
                self._deadline,
                self._received.name,
            )
            try:
                self._retry_trial()
            except Exception:
                _logger.exception("Could not queue the trial for retry.")
            if self._before_exit is not None:
                try:
                    self._before_exit()
                except Exception:
                    _logger.exception("Could not write what was held back.")
            self._handled.set()
        logging.shutdown()
        os._exit(128 + int(self._received))
