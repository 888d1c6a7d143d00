"""Runner-level leases: stale-trial recovery on storages without Optuna heartbeats.

Optuna fails a dead worker's trial only on RDB storages, and only once that trial has a
heartbeat record. On a journal file, a Redis journal or the gRPC proxy nothing ever fails it: a
worker killed mid-trial leaves it RUNNING for good, and every resume counts it as taken.

The runner closes that gap itself. Each trial it starts runs inside a :class:`TrialLease`,
which writes ``hpcnas:storages:lease`` (the time until which the trial is known alive) into
the trial's system attributes at once on entry, before any work, and renews it every
``interval`` seconds from a background thread. :func:`recover_expired_trials`, called by every
worker before it asks for a trial (and by ``hpcnas resume``), fails each RUNNING trial whose
lease has expired, or that has neither a lease nor a heartbeat record and started more than
``grace_period`` ago (killed between the ask and the lease), and queues a WAITING copy exactly
as :class:`optuna.storages.RetryHeartbeatStaleTrialCallback` does, so
``RetryHeartbeatStaleTrialCallback.retried_trial_number`` and ``max_retry`` work unchanged.

Several workers may sweep at once, and every resume sweeps again: a trial is retried exactly
once. On RDB storages the failure, the retry and its record in the failed trial are one
transaction on the locked trial (``_records.fail_with_retry``); on the others the storage's own
state transition decides (``set_trial_state_values`` raises ``UpdateFinishedTrialError`` for
every other caller). Optuna's heartbeat sweep goes through the same path. Expiry times are
wall-clock seconds: the hosts of one study need synchronised clocks (NTP), as Optuna's
heartbeats assume too.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
import copy
import datetime
import logging
import threading
import time
from typing import Any
from typing import TYPE_CHECKING
from typing import TypeVar
import warnings

from optuna_hpcnas import _keys
from optuna_hpcnas._process import known_dead
from optuna_hpcnas._process import this_process
from optuna_hpcnas._records import fail_with_retry
from optuna_hpcnas._records import retry_callback
from optuna_hpcnas._records import stale_trial_ids
from optuna_hpcnas._records import trials_with_heartbeat

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.storages._outage import OutageWindow

_logger = logging.getLogger(__name__)


def _check_seconds(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"`{name}` is {value!r}, but must be a number of seconds.")
    if not value > 0:
        raise ValueError(f"`{name}` is {value}, but must be > 0.")


_Renewer = TypeVar("_Renewer", bound="_RenewalThread")


class _RenewalThread(abc.ABC):
    """A daemon thread that renews a running trial's liveness every ``_interval`` seconds:
    the first renewal on entry (an error there propagates), the others from ``_run``."""

    _kind: str
    _number: int
    _interval: float
    _stop: threading.Event
    _thread: threading.Thread | None

    @abc.abstractmethod
    def _renew_now(self) -> bool:
        """One renewal; ``False`` once the trial is finished."""

    @abc.abstractmethod
    def _run(self) -> None:
        """The thread's loop."""

    _storage: Any
    _trial_id: int

    def __enter__(self: _Renewer) -> _Renewer:
        if self._thread is not None:
            raise RuntimeError(f"The {self._kind} of trial {self._number} is already running.")
        # which process runs it, first: a sweep on this host need not wait for the renewals
        # to stop (an RDB pop records it in its own transaction already)
        owner = {"number": self._number, **this_process()}
        self._storage.set_trial_system_attr(self._trial_id, _keys.STORAGES_OWNER, owner)
        self._renew_now()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"hpcnas-{self._kind}-{self._number}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            # A renewal in flight finishes within one storage round trip.
            self._thread.join(timeout=self._interval + 10.0)
            self._thread = None


class TrialLease(_RenewalThread):
    """Keep a running trial's lease fresh, so a dead worker's trial can be recovered.

    Entering records the lease at once (an error there propagates: a trial whose lease cannot
    be written would not be recoverable); a daemon thread then renews it every ``interval``
    seconds until the block exits. Renewal stops by itself once the trial is finished (also
    when another worker failed it for an expired lease). A renewal that fails for another
    reason (a storage hiccup) is logged and retried at the next interval.

    Args:
        trial: The running trial (from ``study.ask()``).
        interval: Seconds between renewals.
        grace_period: Seconds a lease stays valid after each renewal (default
            ``2 * interval``, as Optuna's heartbeat grace period). Must exceed ``interval``.
        window: The process's :class:`OutageWindow`: a renewal that finds the storage gone
            is reported there (one line for the whole outage) and tried again at the next
            interval; renewals stop once the window has run out.

    Examples:
        .. code-block:: python

            recover_expired_trials(study, grace_period=60, max_retry=3)
            trial = study.ask()
            with TrialLease(trial, interval=30):
                value = objective(trial)
            study.tell(trial, value)
    """

    def __init__(
        self,
        trial: optuna.trial.Trial,
        *,
        interval: float = 30.0,
        grace_period: float | None = None,
        window: OutageWindow | None = None,
    ) -> None:
        import optuna

        if not isinstance(trial, optuna.trial.Trial):
            raise TypeError(f"`trial` is {trial!r}, but must be an optuna.trial.Trial.")
        _check_seconds("interval", interval)
        _check_seconds("grace_period", grace_period, allow_none=True)
        if grace_period is None:
            grace_period = 2.0 * interval
        if grace_period <= interval:
            raise ValueError(
                f"`grace_period` is {grace_period}, but must exceed `interval` ({interval}): "
                "a lease would expire between two renewals."
            )
        self._storage = trial.study._storage
        self._trial_id = trial._trial_id
        self._number = trial.number
        self._interval = float(interval)
        self._grace_period = float(grace_period)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window = window

    @property
    def trial_number(self) -> int:
        return self._number

    _kind = "lease"

    def _renew_now(self) -> bool:
        return self.renew()

    def renew(self) -> bool:
        """Write a fresh lease now; ``False`` once the trial is finished (nothing to renew)."""
        import optuna

        lease = {"number": self._number, "expires": time.time() + self._grace_period}
        try:
            self._storage.set_trial_system_attr(self._trial_id, _keys.STORAGES_LEASE, lease)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._window is not None:
                if not _beat(self._window, self.renew, f"lease of trial {self._number}"):
                    return
                continue
            try:
                if not self.renew():
                    _logger.debug(
                        "Trial %d finished; its lease is no longer renewed.", self._number
                    )
                    return
            except Exception as e:
                _logger.warning(
                    "Could not renew the lease of trial %d (%s: %s); retrying in %.0f s.",
                    self._number,
                    type(e).__name__,
                    e,
                    self._interval,
                )


def _beat(window: OutageWindow, renew: Callable[[], bool], what: str) -> bool:
    """One renewal through ``window`` (no retry: the next interval is the retry); whether to
    go on renewing."""
    from optuna_hpcnas.storages._outage import is_connection_error
    from optuna_hpcnas.storages._outage import StorageUnavailable

    try:
        if not renew():
            return False
    except Exception as e:
        if not is_connection_error(e):
            _logger.warning("Could not renew the %s (%s: %s).", what, type(e).__name__, e)
            return True
        try:
            window.failed(e)
        except StorageUnavailable:
            return False
        return True
    window.succeeded()
    return True


class TrialHeartbeat(_RenewalThread):
    """Optuna's heartbeat of a running trial on an RDB storage, sent through an
    :class:`OutageWindow`.

    Optuna's own heartbeat thread ends at the first error, with a traceback, so a trial alive
    across a storage outage would never beat again and be taken for dead. This one records a
    heartbeat at once on entry (an error there propagates, as :class:`TrialLease` does), then
    every ``heartbeat_interval`` of the storage from a daemon thread; a heartbeat that finds
    the storage gone is reported to ``window`` and sent again at the next interval.

    Args:
        trial: The running trial.
        window: The process's outage window.
    """

    def __init__(self, trial: optuna.trial.Trial, window: OutageWindow) -> None:
        storage = trial.storage
        interval = storage.get_heartbeat_interval()  # type: ignore[attr-defined]
        if interval is None:
            raise ValueError(f"The storage of trial {trial.number} records no heartbeats.")
        self._storage = storage
        self._trial_id = trial._trial_id
        self._number = trial.number
        self._interval = float(interval)
        self._window = window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    _kind = "heartbeat"

    def _renew_now(self) -> bool:
        return self.beat()

    def beat(self) -> bool:
        self._storage.record_heartbeat(self._trial_id)
        return True

    def _run(self) -> None:
        what = f"heartbeat of trial {self._number}"
        while not self._stop.wait(self._interval):
            if not _beat(self._window, self.beat, what):
                return


def lease_expiry(trial: optuna.trial.FrozenTrial) -> float | None:
    """When ``trial``'s own lease expires (epoch seconds), or ``None`` if it has none.

    A lease inherited by a retry (Optuna's retry callback copies system attributes) names
    another trial number and does not count.
    """
    lease = trial.system_attrs.get(_keys.STORAGES_LEASE)
    if not isinstance(lease, dict) or lease.get("number") != trial.number:
        return None
    expires = lease.get("expires")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        return None
    return float(expires)


def _expired_reason(
    trial: optuna.trial.FrozenTrial, has_heartbeat: bool, grace_period: float, now: float
) -> str | None:
    expires = lease_expiry(trial)
    if expires is not None:
        if expires >= now:
            return None
        return f"lease expired {now - expires:.1f} s ago"
    if has_heartbeat:
        return None
    start = trial.datetime_start
    # Optuna stores naive local start times on every backend.
    age = (
        float("inf")
        if start is None
        else (datetime.datetime.fromtimestamp(now) - start).total_seconds()
    )
    if age <= grace_period:
        return None
    return f"no lease and no heartbeat {age:.1f} s after it started"


def _owner_gone(trial: optuna.trial.FrozenTrial) -> str | None:
    """Why ``trial`` is dead although its heartbeat or lease has not run out yet: the process
    that took it (its own record, not one a retry inherited) was on this host and is gone."""
    owner = trial.system_attrs.get(_keys.STORAGES_OWNER)
    if not isinstance(owner, dict) or owner.get("number") != trial.number:
        return None
    if not known_dead(owner):
        return None
    return f"its process (pid {owner['pid']} on this host) is gone"


def recover_expired_trials(
    study: optuna.Study,
    *,
    grace_period: float,
    max_retry: int | None = None,
) -> list[int]:
    """FAIL the RUNNING trials of dead workers and queue their retries; returns their numbers.

    A trial is dead when its Optuna heartbeat is older than the storage's grace period (what
    ``optuna.storages.fail_stale_trials`` would fail), when its :class:`TrialLease` expired,
    when it has neither a lease nor an Optuna heartbeat record and started more than
    ``grace_period`` seconds ago (its worker died between the ask and the lease), or at once
    when the process that took it ran on this host and is gone (pid and start time, recorded
    when its lease or heartbeat began). Each dead
    trial goes through :func:`fail_and_requeue`: failed, and a WAITING copy (same parameters,
    distributions, user attributes and system attributes, fixed parameters included, lease
    removed) added as :class:`optuna.storages.RetryHeartbeatStaleTrialCallback` would, unless
    ``max_retry`` retries of it were already made. Safe to call from many workers at once: a
    trial is failed and retried by one of them only, exactly once.

    Args:
        study: The study to sweep.
        grace_period: Seconds after its start a trial without lease or heartbeat is left alone
            (at least the time from an ask to its lease; the lease grace period is fine).
        max_retry: Retries per original trial (``None``: unlimited, as Optuna's default).

    Examples:
        .. code-block:: python

            # Before each ask of every worker, and once in `hpcnas resume`:
            for number in recover_expired_trials(study, grace_period=60, max_retry=3):
                print(f"trial {number} of a dead worker was queued again")
    """
    import optuna
    from optuna.trial import TrialState

    if not isinstance(study, optuna.Study):
        raise TypeError(f"`study` is {study!r}, but must be an optuna.Study.")
    _check_seconds("grace_period", grace_period)
    if max_retry is not None and (isinstance(max_retry, bool) or not isinstance(max_retry, int)):
        raise TypeError(f"`max_retry` is {max_retry!r}, but must be an int or None.")
    if max_retry is not None and max_retry < 0:
        raise ValueError(f"`max_retry` is {max_retry}, but must be >= 0.")
    storage = study._storage
    stale = set(stale_trial_ids(storage, study._study_id))
    running = storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
    with_heartbeat = trials_with_heartbeat(storage, [t._trial_id for t in running])
    now = time.time()
    recovered: list[int] = []
    for trial in running:
        if trial._trial_id in stale:
            reason: str | None = "heartbeat stale"
        else:
            reason = _expired_reason(trial, trial._trial_id in with_heartbeat, grace_period, now)
        if reason is None:
            reason = _owner_gone(trial)
        if reason is None:
            continue
        if fail_and_requeue(
            study,
            trial._trial_id,
            reason_key=_keys.STORAGES_RECOVERED,
            reason=reason,
            max_retry=max_retry,
            event="of a dead worker failed",
        ):
            recovered.append(trial.number)
    return recovered


def fail_and_requeue(
    study: optuna.Study,
    trial_id: int,
    *,
    reason_key: str,
    reason: str,
    max_retry: int | None,
    event: str = "failed",
) -> bool:
    """FAIL a RUNNING trial and queue its one retry (a WAITING copy), as Optuna's heartbeat
    sweep does: the one way a running trial is failed and retried (a dead worker's, by a
    sweep; a preempted one, by ``PreemptionGuard``).

    ``reason`` is recorded in the failed trial's system attribute ``reason_key``, and the
    retry's number in ``hpcnas:storages:retry``. The copy keeps the parameters, distributions
    and attributes but this trial's lease and records, with Optuna's ``failed_trial`` and
    ``retry_history``; the storage's own ``heartbeat_stale_trial_callback`` sets the number of
    retries allowed when the storage has one (so retries count alike however a trial died),
    else ``max_retry``.

    Retried exactly once, whoever calls: on RDB storages the check that the trial is RUNNING,
    the failure, the retry and its record are one transaction on the locked trial
    (``_records.fail_with_retry``), so of concurrent callers one wins and a caller killed
    half-way leaves the trial RUNNING for the next sweep. On the other storages the storage's
    ``RUNNING -> FAIL`` transition picks the winner, which then queues the retry unless one
    exists. Returns whether this call failed the trial; logs
    ``Trial N <event> (<reason>); queued for retry.`` (or why not).
    """
    import optuna

    storage = study._storage
    _, limit = retry_callback(storage, max_retry)
    try:
        if _rdb(storage):
            done = fail_with_retry(
                storage, trial_id, records={reason_key: reason}, max_retry=limit, dropped=_DROPPED
            )
            if done is None:
                return False
            number, retry = done
        else:
            number, retry = _fail_then_retry(study, trial_id, reason_key, reason, max_retry)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    _logger.warning(
        "Trial %d %s (%s); %s.",
        number,
        event,
        reason,
        f"queued for retry as trial {retry}"
        if retry is not None
        else f"not retried (max_retry={limit} reached)",
    )
    return True


def _fail_then_retry(
    study: optuna.Study, trial_id: int, reason_key: str, reason: str, max_retry: int | None
) -> tuple[int, int | None]:
    """Storages without transactions (journal, gRPC proxy): ``RUNNING -> FAIL`` is the claim
    (``UpdateFinishedTrialError`` for every other caller), then the retry, unless a retry of
    this trial is already in the study."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.trial import TrialState

    storage = study._storage
    if storage.get_trial(trial_id).state != TrialState.RUNNING:  # given back, or finished
        raise _lost()
    storage.set_trial_system_attr(trial_id, reason_key, reason)
    if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
        raise _lost()
    failed = copy.deepcopy(storage.get_trial(trial_id))
    existing = _retry_of(study, failed.number)
    if existing is not None:
        return failed.number, existing
    failed.system_attrs = {k: v for k, v in failed.system_attrs.items() if k not in _DROPPED}
    retry, limit = retry_callback(storage, max_retry)
    before = len(study.get_trials(deepcopy=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        retry(study, failed)
    history = failed.system_attrs.get("retry_history")
    if limit is not None and (len(history) if isinstance(history, list) else 0) + 1 > limit:
        return failed.number, None
    return failed.number, _retry_of(study, failed.number, after=before - 1)


def _retry_of(study: optuna.Study, number: int, after: int = -1) -> int | None:
    """The number of the retry of trial ``number`` (the last of its ``retry_history``)."""
    for t in study.get_trials(deepcopy=False):
        history = t.system_attrs.get("retry_history")
        if t.number > after and isinstance(history, list) and history and history[-1] == number:
            return t.number
    return None


def _lost() -> Exception:
    import optuna

    return optuna.exceptions.UpdateFinishedTrialError("the trial is no longer RUNNING")


def _rdb(storage: Any) -> bool:
    from optuna.storages import RDBStorage

    return isinstance(getattr(storage, "_backend", storage), RDBStorage)


# What a retry does not inherit: the failed trial's own lease and records.
_DROPPED = (
    _keys.STORAGES_LEASE,
    _keys.STORAGES_RECOVERED,
    _keys.CHECKPOINT_PREEMPTED,
    _keys.STORAGES_RETRY,
)
