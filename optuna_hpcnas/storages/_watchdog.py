"""A bound on every call to a PostgreSQL server that stops answering.

libpq has no read timeout, and neither TCP keepalives nor ``tcp_user_timeout`` fire against a
frozen server (SIGSTOP, a hung host): its kernel still acknowledges every packet, so a storage
call would wait for good. :func:`watch_engine` hooks the SQLAlchemy engine of an RDB storage
(``_open.rdb_storage``): pool and cursor events note when each checked-out connection last
started or finished a round trip, and a daemon thread shuts down the socket of one that has
waited ``call_timeout`` seconds since. The blocked call then fails as a lost connection
("server closed the connection unexpectedly"), SQLAlchemy invalidates it, and the process's
``OutageWindow`` tries again or gives up, as for a server that went away. A new connection
to the frozen server is bounded by the driver's ``connect_timeout`` (``_open``).
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
import socket
import threading
import time
from typing import Any

_logger = logging.getLogger(__name__)

# The thread looks at most this long after a call's deadline, and ends after this many
# seconds with nothing checked out (the next checkout starts another).
_MAX_PERIOD_S = 1.0
_LINGER_S = 30.0


@dataclass
class _Call:
    connection: Any  # the DBAPI connection, held so its socket is not closed under us
    since: float  # monotonic time its latest round trip started or ended


class CallWatchdog:
    """Shuts down the socket of a checked-out connection whose round trip to the server has
    lasted ``call_timeout`` seconds (see the module docstring); one per engine.

    Args:
        call_timeout: Seconds a round trip may last.
        label: Names the storage in the log line (password masked).
    """

    def __init__(self, call_timeout: float, *, label: str = "storage") -> None:
        self.call_timeout = float(call_timeout)
        self.period = min(_MAX_PERIOD_S, self.call_timeout / 4)
        self.label = label
        self.cut = 0  # connections shut down so far
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}  # by id() of the pool's connection record
        self._thread: threading.Thread | None = None

    def attach(self, engine: Any) -> None:
        """Listen to ``engine``'s pool and cursor events."""
        from sqlalchemy import event

        event.listen(engine, "checkout", self._on_checkout)
        event.listen(engine, "checkin", self._on_release)
        # fired before SQLAlchemy closes a connection it invalidates: never cut a closed one
        event.listen(engine, "invalidate", self._on_release)
        event.listen(engine, "before_cursor_execute", self._on_round_trip)
        event.listen(engine, "after_cursor_execute", self._on_round_trip)

    def _on_checkout(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        call = _Call(dbapi_connection, time.monotonic())
        record.info[self] = call
        with self._lock:
            self._calls[id(record)] = call
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="hpcnas-rdb-watchdog", daemon=True
                )
                self._thread.start()

    def _on_release(self, dbapi_connection: Any, record: Any, *args: Any) -> None:
        record.info.pop(self, None)
        with self._lock:
            self._calls.pop(id(record), None)

    def _on_round_trip(self, conn: Any, *args: Any) -> None:
        call = conn.info.get(self)
        if call is not None:
            call.since = time.monotonic()

    def _watch(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(self.period)
            with self._lock:
                now = time.monotonic()
                if self._calls:
                    idle_since = now
                elif now - idle_since >= _LINGER_S:
                    self._thread = None
                    return
                for key, call in list(self._calls.items()):
                    if now - call.since > self.call_timeout:
                        del self._calls[key]
                        self._shut_down(call.connection, now - call.since)

    def _shut_down(self, connection: Any, waited: float) -> None:
        """Shut the connection's socket down both ways; the descriptor stays the driver's
        (``detach``), which then reads end-of-file and reports the connection lost."""
        try:
            if getattr(connection, "closed", False):
                return
            fd = connection.fileno()
            sock = socket.socket(fileno=fd)
        except Exception as e:  # closed meanwhile, or a driver without fileno()
            _logger.debug("Cannot cut a connection to %s: %r", self.label, e)
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected
        finally:
            sock.detach()
        self.cut += 1
        _logger.warning(
            "No answer from %s for %.1f s (call_timeout): connection closed.", self.label, waited
        )


def watch_engine(engine: Any, call_timeout: float, *, label: str = "storage") -> CallWatchdog:
    """Bound every round trip of ``engine``'s connections by ``call_timeout`` seconds with a
    :class:`CallWatchdog` (its thread starts at the first checkout)."""
    watchdog = CallWatchdog(call_timeout, label=label)
    watchdog.attach(engine)
    return watchdog
