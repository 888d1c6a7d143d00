"""Riding out a storage outage: which errors mean the storage went away, how long to wait
between tries, and the window one process waits before it gives up.

A group leader's storage calls (``run/_calls.py``, ``StudyCalls._call``) go through one
:class:`OutageWindow`, and so do the heartbeat and lease threads of its trials. A call that
fails because the connection is gone (:func:`is_connection_error`) is tried again with capped
exponential backoff and jitter; any other error is raised at once. The first such failure
logs one line, the first success after it another; once the storage has been gone for
``[storage] outage_tolerance_s`` seconds every call raises :class:`StorageUnavailable`, and
``hpcnas run`` exits with :data:`EXIT_STORAGE_UNAVAILABLE` (``hpcnas resume`` continues).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
import contextlib
from dataclasses import dataclass
import functools
import logging
import random
import threading
import time
from typing import Any
from typing import TypeVar

from optuna_hpcnas._validation import check_number
from optuna_hpcnas.storages._open import describe_storage
from optuna_hpcnas.storages._open import StorageError
from optuna_hpcnas.storages._urls import mask_url

_logger = logging.getLogger(__name__)
T = TypeVar("T")

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry".
EXIT_STORAGE_UNAVAILABLE = 75

# PostgreSQL SQLSTATEs of a connection that is gone or refused: class 08 (connection
# exception), admin_shutdown, crash_shutdown, cannot_connect_now (starting or stopping).
_PG_DISCONNECT_STATES = ("57P01", "57P02", "57P03")
# MySQL/MariaDB client and server codes of a lost or refused connection: can't connect
# (2002, 2003), server gone away (2006), lost connection (2013, 2055), shutdown in progress
# (1053), connection killed (1927), lost connection reading the initial packet (2027).
_MYSQL_DISCONNECT_CODES = frozenset({1053, 1927, 2002, 2003, 2006, 2013, 2027, 2055})
_CHAIN_DEPTH = 16


# What a driver says when the connection is gone, in the text of Optuna's own warning.
_DISCONNECT_WORDS = (
    "server closed the connection",
    "terminating connection",
    "connection refused",
    "connection failed",
    "lost connection",
    "gone away",
    "connection reset",
)


class _DisconnectWarnings(logging.Filter):
    """Drops Optuna's "Caught an error from sqlalchemy ... Falling back" warning (meant for a
    query with too many variables) when the error was the connection going away: the
    window's own line says that once."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("Caught an error from sqlalchemy"):
            return True
        return not any(w in text.lower() for w in _DISCONNECT_WORDS)


@contextlib.contextmanager
def quiet_disconnect_warnings() -> Iterator[None]:
    """While the block runs, Optuna's RDB storage does not log a lost connection itself."""
    logger = logging.getLogger("optuna.storages._rdb.storage")
    drop = _DisconnectWarnings()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class StorageUnavailable(StorageError):
    """The storage has been unreachable for longer than the outage window; the message names
    it (password masked), how long, and the last error."""


def _is_connection_level(error: BaseException) -> bool:
    """Whether this one exception (not its causes) says the connection is gone."""
    invalidated = getattr(error, "connection_invalidated", None)
    if invalidated is True:  # SQLAlchemy's DBAPIError after the dialect's is_disconnect
        return True
    module = type(error).__module__ or ""
    name = type(error).__name__
    if module.startswith("redis"):
        # redis.exceptions.ConnectionError (BusyLoadingError included) and TimeoutError
        return name in ("ConnectionError", "TimeoutError", "BusyLoadingError")
    if module.startswith(("psycopg", "psycopg2")):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state is None:  # raised by the client: refused, closed, reset, no answer
            return name in ("OperationalError", "InterfaceError", "ConnectionTimeout")
        return str(state).startswith("08") or str(state) in _PG_DISCONNECT_STATES
    if module.startswith(("pymysql", "MySQLdb")):
        if name == "InterfaceError":  # a closed connection used again
            return True
        code = error.args[0] if error.args else None
        return name == "OperationalError" and code in _MYSQL_DISCONNECT_CODES
    code = getattr(error, "code", None)
    if module.startswith("grpc") and callable(code):  # grpc.RpcError of a call
        try:
            return getattr(code(), "name", None) == "UNAVAILABLE"
        except Exception:
            return False
    # The socket layer (BrokenPipeError, ConnectionResetError, ConnectionRefusedError, ...);
    # Optuna's gRPC client raises ConnectionError("GRPC connection timeout") itself.
    return isinstance(error, ConnectionError)


def _connection_link(error: BaseException) -> BaseException | None:
    """The exception of ``error``'s chain (itself, its causes, contexts and DBAPI ``orig``)
    that says the connection is gone, or ``None``."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo and len(seen) < _CHAIN_DEPTH:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if _is_connection_level(e):
            return e
        for linked in (e.__cause__, e.__context__, getattr(e, "orig", None)):
            if isinstance(linked, BaseException):
                todo.append(linked)
    return None


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the storage's connection is gone (so the call may be tried
    again), for every backend: SQLAlchemy errors that invalidated their connection,
    psycopg/psycopg2 and PyMySQL disconnects and refusals, ``redis.exceptions.ConnectionError``
    and ``TimeoutError``, gRPC ``UNAVAILABLE``, and the socket's own ``ConnectionError``.
    Optuna wraps RDB errors in ``StorageInternalError``: its causes are read too.

    Examples:
        >>> is_connection_error(ConnectionRefusedError(111, "Connection refused"))
        True
        >>> is_connection_error(ValueError("Cannot tell a COMPLETE trial."))
        False
    """
    return _connection_link(error) is not None


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter: try ``n`` (0-based) waits a uniform draw in
    ``[min(cap, base * factor**n) / 2, min(cap, base * factor**n)]`` seconds.

    Examples:
        >>> b = Backoff(base=0.1, cap=5.0)
        >>> rng = random.Random(0)
        >>> [round(b.delay(n, rng), 3) for n in range(3)]
        [0.092, 0.176, 0.284]
        >>> 2.5 <= b.delay(50, rng) <= 5.0
        True
    """

    base: float = 0.1
    cap: float = 5.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            check_number(name, getattr(self, name))
        check_number("factor", self.factor, minimum=1)

    def delay(self, attempt: int, rng: random.Random) -> float:
        # the exponent is capped first: base * factor**1000 overflows a float
        exponent = min(attempt, 64)
        ceiling = min(self.cap, self.base * self.factor**exponent)
        return rng.uniform(ceiling / 2, ceiling)


def _one_line(error: BaseException) -> str:
    """The connection error in ``error``'s chain (Optuna wraps it), in one line."""
    error = _connection_link(error) or error
    text = " ".join(str(error).split("\n", 1)[0].split())
    return mask_url(f"{type(error).__name__}: {text}" if text else type(error).__name__)


class OutageWindow:
    """How one process rides out its storage going away (see the module docstring).

    Args:
        url: The storage (named in the log lines and the error, password masked).
        tolerance: Seconds the storage may stay unreachable before every call raises
            :class:`StorageUnavailable` (``[storage] outage_tolerance_s``; 0: give up at the
            first connection error).
        quiet: Seconds after the storage is back during which :meth:`sweeps_allowed` is
            ``False``: other workers' heartbeats and leases, stale from the outage, get that
            long to be renewed before anyone takes their trials for dead.
        backoff: The wait between tries.
        rng: The jitter's generator (a fresh ``random.Random()`` by default: workers must not
            retry in step).
        clock: Monotonic seconds (tests).
        sleep: Waits between tries (tests).

    Examples:
        >>> window = OutageWindow("sqlite:///nas.db", tolerance=120)
        >>> window.call(sum, [1, 2, 3])
        6
    """

    def __init__(
        self,
        url: str,
        *,
        tolerance: float,
        quiet: float = 0.0,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        for name, value in (("tolerance", tolerance), ("quiet", quiet)):
            check_number(name, value, positive=False, minimum=0)
        self.url = url
        self.tolerance = float(tolerance)
        self.quiet = float(quiet)
        self.backoff = backoff if backoff is not None else Backoff()
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._back_at: float | None = None
        self._gave_up: StorageUnavailable | None = None
        self.outages = 0  # how often the storage went away

    # ------------------------------------------------------------------ state
    @property
    def down(self) -> bool:
        return self._down_since is not None

    @property
    def gave_up(self) -> bool:
        return self._gave_up is not None

    def check(self) -> None:
        """Raise :class:`StorageUnavailable` once the window has run out."""
        if self._gave_up is not None:
            raise StorageUnavailable(str(self._gave_up))

    def sweeps_allowed(self) -> bool:
        """``False`` while the storage is away and for ``quiet`` seconds after it is back."""
        with self._lock:
            if self._down_since is not None:
                return False
            return self._back_at is None or self._clock() - self._back_at >= self.quiet

    def failed(self, error: BaseException) -> None:
        """Record a connection error: the first of an outage logs one line; past the window,
        raise :class:`StorageUnavailable` (and from then on, every call does)."""
        with self._lock:
            if self._gave_up is not None:
                raise StorageUnavailable(str(self._gave_up)) from None
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
                self.outages += 1
                _logger.warning(
                    "Storage %s went away (%s); retrying for up to %g s "
                    "([storage] outage_tolerance_s).",
                    describe_storage(self.url),
                    _one_line(error),
                    self.tolerance,
                )
            away = now - self._down_since
            if away < self.tolerance:
                return
            self._gave_up = StorageUnavailable(
                f"storage {describe_storage(self.url)} unreachable for {away:.0f} s "
                f"(more than [storage] outage_tolerance_s = {self.tolerance:g}); last error: "
                f"{_one_line(error)}"
            )
            raise StorageUnavailable(str(self._gave_up)) from None

    def succeeded(self) -> None:
        """Record an answer of the storage: the first after an outage logs one line."""
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._down_since is None or self._gave_up is not None:
                return
            now = self._clock()
            _logger.warning(
                "Storage %s is back after %.1f s.",
                describe_storage(self.url),
                now - self._down_since,
            )
            self._down_since = None
            self._back_at = now

    def remaining(self) -> float:
        """Seconds left in the window of the current outage (``tolerance`` when none)."""
        with self._lock:
            if self._down_since is None:
                return self.tolerance
            return max(0.0, self.tolerance - (self._clock() - self._down_since))

    # ------------------------------------------------------------------ calls
    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, tried again on connection errors within the window. A
        ``fn`` with a ``recover`` method is made idempotent with it (``attempt``)."""
        recover = getattr(fn, "recover", None)
        return self.attempt(functools.partial(fn, *args, **kwargs), recover=recover)

    def attempt(
        self,
        fn: Callable[[], T],
        *,
        recover: Callable[[], tuple[bool, T | None]] | None = None,
    ) -> T:
        """``fn()`` within the window. ``recover`` makes a retried call idempotent: before
        each try after a connection error it is asked (on the storage) whether an earlier
        try took effect although its answer was lost; ``(True, value)`` returns ``value``
        instead of trying again.
        """
        self.check()
        tries = 0
        while True:
            try:
                if tries and recover is not None:
                    done, value = recover()
                    if done:
                        self.succeeded()
                        return value  # type: ignore[return-value]
                result = fn()
            except Exception as e:
                if not is_connection_error(e):
                    self.succeeded()  # the storage answered, with an error of another kind
                    raise
                self.failed(e)  # StorageUnavailable past the window
                self._sleep(min(self.backoff.delay(tries, self._rng), self.remaining() + 0.05))
                tries += 1
                continue
            self.succeeded()
            return result
