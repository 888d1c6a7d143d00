"""Open any Optuna storage from the one string a user types, spelled as optuna-dashboard spells it.

This is the first thing ``hpcnas run`` / ``status`` / ``best`` / ``export`` / ``dashboard`` do
with ``--storage`` (or ``OPTUNA_STORAGE``, or the config): the string picks the backend,

- an RDB URL (``sqlite:///nas.db``, ``postgresql+psycopg://...``, ``mysql+pymysql://...``)
  opens :class:`optuna.storages.RDBStorage`, with heartbeats when asked;
- ``redis://host:6379/0`` opens :class:`optuna.storages.JournalStorage` on
  :class:`optuna.storages.journal.JournalRedisBackend` (``BatchedRedisBackend``: the same
  journal, many logs per round trip);
- ``grpc://host:port`` opens :class:`optuna.storages.GrpcStorageProxy` (a server started by
  ``hpcnas storage-proxy``);
- anything else is a path to an Optuna journal file (created when missing), opened with
  :class:`optuna.storages.journal.JournalFileBackend` and Optuna's symlink file lock,

and every failure a user can cause (server down, a directory, a file of the wrong kind, an
unknown scheme, a missing extra) becomes one :class:`StorageError` line naming the URL with its
password masked. Optuna itself is imported only here, when a storage is opened.
"""

from __future__ import annotations

from collections.abc import Callable
import json
import logging
import math
import os
from pathlib import Path
import random
import time
from typing import Any
from typing import TYPE_CHECKING
from typing import TypeVar
from urllib.parse import parse_qs
from urllib.parse import urlsplit
from urllib.parse import urlunsplit
import warnings

from optuna_hpcnas._validation import check_heartbeat
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas.storages._urls import mask_url
from optuna_hpcnas.storages._urls import sqlite_file
from optuna_hpcnas.storages._urls import storage_kind
from optuna_hpcnas.storages._watchdog import watch_engine

if TYPE_CHECKING:
    import optuna

_logger = logging.getLogger(__name__)
T = TypeVar("T")

# A journal's first line is its first operation (create a study): small. Reading more than
# this without a newline means the file is not a journal.
_JOURNAL_PROBE_BYTES = 1 << 16
# Connection waits when opening a server storage, so a stopped server is reported, not waited
# for forever (gRPC's channel would).
_CONNECT_TIMEOUT_S = 10.0
# The longest one call to a Redis, PostgreSQL or MySQL server may wait for its answer: a frozen
# server (stopped, swapping, partitioned) then fails the call as a lost connection, which the
# outage window handles, instead of hanging it for good.
CALL_TIMEOUT_S = 30.0

_KIND_NAMES = {
    "sqlite": "SQLite",
    "postgresql": "PostgreSQL",
    "mysql": "MySQL/MariaDB",
    "rdb": "RDB",
    "journal-redis": "Redis journal",
    "journal-file": "journal file",
    "grpc": "gRPC storage proxy",
}
# Drivers SQLAlchemy loads for each dialect, and the extra of this package that installs them.
_DRIVER_EXTRAS = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}


class StorageError(RuntimeError):
    """A storage URL cannot be opened; the message names the (masked) URL and the problem."""


def describe_storage(url: str) -> str:
    """Kind and masked URL, for logs: ``"PostgreSQL postgresql+psycopg://nas:***@db/optuna"``."""
    return f"{_KIND_NAMES[storage_kind(url)]} {mask_url(url)}"


def supports_heartbeat(storage: optuna.storages.BaseStorage) -> bool:
    """Whether ``storage`` records Optuna heartbeats for running trials.

    True for an RDB storage opened with a ``heartbeat_interval`` (Optuna then fails trials whose
    heartbeat stops and its retry callback re-queues them). Journal storages and the gRPC proxy
    have no heartbeats: run their trials under a :class:`TrialLease` and call
    :func:`recover_expired_trials` instead.
    """
    from optuna_hpcnas._records import has_heartbeat

    return has_heartbeat(storage)


def open_storage(
    url: str,
    *,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    max_retry: int | None = None,
    connect_timeout: float = _CONNECT_TIMEOUT_S,
    call_timeout: float = CALL_TIMEOUT_S,
    must_exist: bool = False,
) -> optuna.storages.BaseStorage:
    """Open the storage a URL or path names (see the module docstring for the spellings).

    Args:
        url: RDB URL, ``redis://...``, ``grpc://host:port`` or a journal file path.
        heartbeat_interval: Seconds between heartbeats of a running trial. RDB storages record
            them (and re-queue dead workers' trials through
            :class:`optuna.storages.RetryHeartbeatStaleTrialCallback`); other storages have no
            heartbeats, so the value is not used there (:func:`supports_heartbeat` is False:
            use :class:`TrialLease`).
        grace_period: Seconds without heartbeat before a trial is failed (default twice the
            interval). Only with ``heartbeat_interval``.
        max_retry: How often such a trial is re-queued (``None``: Optuna's default, without
            limit). Only with ``heartbeat_interval``.
        connect_timeout: Seconds to wait for a Redis server or a gRPC proxy to answer.
        call_timeout: Seconds one call to a server may wait for its answer; a frozen server
            then fails the call as a lost connection instead of hanging the caller. Redis: a
            ``socket_timeout`` added to the URL unless it has one. PostgreSQL (psycopg,
            psycopg2): a watchdog thread cuts a connection whose round trip lasts that
            long, and ``connect_timeout`` (at least 2 s, libpq's minimum). MySQL (PyMySQL,
            mysqlclient): ``connect_timeout``, ``read_timeout`` and ``write_timeout``
            (whole seconds). Connect arguments the URL names are kept. Not used for SQLite.
        must_exist: Refuse a SQLite or journal file that does not exist yet (a reader never
            creates an empty storage).

    Raises:
        StorageError: The storage cannot be opened (the message says why, password masked).

    Examples:
        .. code-block:: python

            storage = open_storage("sqlite:///nas.db", heartbeat_interval=30, max_retry=3)
            study = optuna.create_study(storage=storage, study_name="nas", load_if_exists=True)
    """
    kind = storage_kind(url)
    for name, value, minimum in (
        ("heartbeat_interval", heartbeat_interval, 1),
        ("grace_period", grace_period, 0),
        ("max_retry", max_retry, 0),
    ):
        check_int(name, value, minimum, allow_none=True)
    if heartbeat_interval is None and (grace_period is not None or max_retry is not None):
        raise ValueError(
            f"`grace_period` is {grace_period!r} and `max_retry` is {max_retry!r}, but they "
            "need a `heartbeat_interval`."
        )
    for label, seconds in (("connect_timeout", connect_timeout), ("call_timeout", call_timeout)):
        check_number(label, seconds)
    if heartbeat_interval is not None:
        # Validated before anything touches a file or a server.
        try:
            check_heartbeat(heartbeat_interval, grace_period, max_retry)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Heartbeat settings for {mask_url(url)}: {e}") from None
    if must_exist:
        _check_exists(url, kind)
    if kind == "journal-redis":
        return _open_redis(url, float(connect_timeout), float(call_timeout))
    if kind == "grpc":
        return _open_grpc(url, float(connect_timeout))
    if kind == "journal-file":
        return _open_journal_file(url)
    return _open_rdb(url, heartbeat_interval, grace_period, max_retry, float(call_timeout))


def _error(url: str, problem: str) -> StorageError:
    # One line: server errors carry multi-line SQL and driver details.
    first = " ".join(str(problem).split("\n", 1)[0].split())
    return StorageError(f"Cannot open storage {mask_url(url)}: {mask_url(first)}")


def _missing_extra(url: str, module: str, extra: str) -> StorageError:
    return _error(url, f"Python package {module!r} is missing; install optuna-hpcnas[{extra}]")


def _check_exists(url: str, kind: str) -> None:
    path = sqlite_file(url)
    if path is not None and not os.path.exists(path):
        raise _error(url, f"no such SQLite file {path!r}")
    if kind == "journal-file" and not os.path.exists(url):
        raise _error(url, "no such journal file")


# ------------------------------------------------------------------ RDB


def _open_rdb(
    url: str,
    heartbeat_interval: int | None,
    grace_period: int | None,
    max_retry: int | None,
    call_timeout: float,
) -> optuna.storages.BaseStorage:
    import sqlalchemy.exc

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError as e:
        raise _error(url, f"not a storage URL ({e})") from None
    sqlite_path = _checked_sqlite_file(url)

    def open_once() -> optuna.storages.RDBStorage:
        return rdb_storage(
            url,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            max_retry=max_retry,
            call_timeout=call_timeout,
        )

    try:
        if sqlite_path is None:
            return open_once()
        return _first_open_of_sqlite(open_once)
    except StorageError:
        raise
    except sqlalchemy.exc.NoSuchModuleError:
        raise _error(
            url,
            f"unknown scheme {parsed.drivername!r} (use an RDB URL, redis://..., "
            "grpc://host:port or a journal file path)",
        ) from None
    except ModuleNotFoundError as e:
        dialect = parsed.get_backend_name()
        extra = _DRIVER_EXTRAS.get(dialect)
        if extra is None:
            raise _error(url, f"Python package {e.name!r} is missing") from None
        raise _missing_extra(url, str(e.name), extra) from None
    except sqlalchemy.exc.DatabaseError as e:
        orig = getattr(e, "orig", None) or e
        if sqlite_path is not None:
            if "not a database" in str(orig):
                raise _error(url, f"{sqlite_path} is not a SQLite database ({orig})") from None
            if _read_only(sqlite_path):
                raise _error(
                    url,
                    f"{sqlite_path} is on a read-only file system: SQLite must write beside "
                    f"its database (its -wal and -shm files) to open it ({orig})",
                ) from None
            raise _error(url, f"SQLite error on {sqlite_path}: {orig}") from None
        raise _error(url, f"server not reachable or refused the connection: {orig}") from None
    except sqlalchemy.exc.SQLAlchemyError as e:
        raise _error(url, f"{type(e).__name__}: {e}") from None
    except RuntimeError as e:
        # Optuna refuses a schema of another version with a RuntimeError naming the upgrade.
        raise _error(url, str(e)) from None


def _read_only(path: str) -> bool:
    """Whether the directory of ``path`` cannot be written (a read-only mount, or no write
    permission)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY) or not os.access(
            directory, os.W_OK
        )
    except OSError:
        return False


def rdb_storage(
    url: str,
    *,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    max_retry: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    call_timeout: float | None = None,
) -> optuna.storages.RDBStorage:
    """The one constructor of this package's RDB storages (``open_storage``,
    ``checkpoints.heartbeat_storage``), without ``open_storage``'s checks and messages.

    With ``heartbeat_interval`` a running trial sends heartbeats, and one silent for
    ``grace_period`` is failed and queued again (up to ``max_retry`` times) by
    :class:`optuna.storages.RetryHeartbeatStaleTrialCallback`. On SQLite a writer waits up
    to ``SQLITE_TIMEOUT`` seconds for the lock (checkpoint blobs share the file), every
    transaction takes the lock when it begins, and a file on a local disk uses the
    write-ahead log (``_configure_sqlite``). With ``call_timeout`` no call waits longer than
    that for a PostgreSQL or MySQL server's answer (``_timeout_connect_args``, and
    ``_watchdog.CallWatchdog`` for PostgreSQL).
    """
    import optuna
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    kind = storage_kind(url)
    kwargs = dict(engine_kwargs or {})
    if kind == "sqlite":
        kwargs.setdefault("connect_args", {"timeout": SQLITE_TIMEOUT})
    elif call_timeout is not None:
        kwargs["connect_args"] = _timeout_connect_args(
            url, call_timeout, kwargs.get("connect_args", {})
        )
    with warnings.catch_warnings():
        # Heartbeats are marked experimental since Optuna 2.9; this is the supported use.
        warnings.simplefilter("ignore", ExperimentalWarning)
        heartbeat: dict[str, Any] = {}
        if heartbeat_interval is not None:
            retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
            heartbeat = {
                "heartbeat_interval": heartbeat_interval,
                "grace_period": grace_period,
                "heartbeat_stale_trial_callback": retry,
            }
        storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, **heartbeat)
    if kind == "sqlite":
        path = sqlite_file(url)
        wal = path is not None and on_local_filesystem(path)
        _configure_sqlite(storage.engine, write_ahead_log=wal)
    elif call_timeout is not None and _driver(url) in _WATCHED_DRIVERS:
        watch_engine(storage.engine, call_timeout, label=describe_storage(url))
    return storage


# How a call to a frozen server is bounded, by SQLAlchemy dialect+driver. libpq has no read
# timeout: a watchdog cuts the connection (the driver's fileno() is its socket), and
# connect_timeout bounds a new one. PyMySQL and mysqlclient read and write with timeouts.
_WATCHED_DRIVERS = frozenset({"postgresql+psycopg", "postgresql+psycopg2"})
_READ_TIMEOUT_DRIVERS = frozenset(
    {"mysql+pymysql", "mysql+mysqldb", "mariadb+pymysql", "mariadb+mysqldb"}
)


def _driver(url: str) -> str:
    """``dialect+driver`` of an RDB URL, the default driver spelled out."""
    import sqlalchemy.engine

    parsed = sqlalchemy.engine.make_url(url)
    return f"{parsed.get_backend_name()}+{parsed.get_driver_name()}"


def _timeout_connect_args(
    url: str, call_timeout: float, connect_args: dict[str, Any]
) -> dict[str, Any]:
    """``connect_args`` with the driver timeouts that bound a call to ``call_timeout``
    seconds, except those the URL's query or ``connect_args`` name already.

    Examples:
        >>> _timeout_connect_args("mysql+pymysql://u@db/nas?read_timeout=60", 5.0, {})
        {'connect_timeout': 5, 'write_timeout': 5}
        >>> _timeout_connect_args("postgresql+psycopg://u@db/nas", 0.5, {})
        {'connect_timeout': 2}
    """
    import sqlalchemy.engine

    driver = _driver(url)
    seconds = max(1, math.ceil(call_timeout))
    if driver in _WATCHED_DRIVERS:
        # psycopg and libpq round connect_timeout up to 2 s
        ours: dict[str, Any] = {"connect_timeout": max(2, seconds)}
    elif driver in _READ_TIMEOUT_DRIVERS:
        ours = dict.fromkeys(("connect_timeout", "read_timeout", "write_timeout"), seconds)
    else:
        return dict(connect_args)
    named = sqlalchemy.engine.make_url(url).query
    return {**{k: v for k, v in ours.items() if k not in named}, **connect_args}


def _configure_sqlite(engine: Any, *, write_ahead_log: bool) -> None:
    """Make every transaction on a SQLite engine take the write lock when it begins, and use
    SQLite's write-ahead log on a local disk.

    Python's sqlite3 driver starts a transaction only at the first write, so Optuna's
    read-check-write updates (``RUNNING -> FAIL`` only if still running, ``WAITING ->
    RUNNING`` only if still waiting) are not atomic on SQLite: two processes, or two threads
    of a gRPC proxy, both succeed, and a trial is retried or run twice. ``BEGIN IMMEDIATE``
    (SQLAlchemy's documented recipe for pysqlite transactions) makes the check and the write
    one transaction, as ``SELECT ... FOR UPDATE`` does on PostgreSQL and MySQL.

    ``journal_mode=WAL`` with ``synchronous=NORMAL`` makes a commit an append to the log
    without a sync of the database file (about 1.3 ms instead of 6.8 ms here), so the write
    lock is held that much shorter; a committed trial survives a killed process, only an
    operating-system crash or power loss may lose the last commits. The mode is stored in the
    file, so optuna-dashboard and other readers use it too. SQLite's write-ahead log needs
    every process on one host, so it is not used on network file systems (NFS, Lustre, GPFS,
    ...: ``on_local_filesystem``), where the rollback journal stays.
    """
    import sqlalchemy

    def on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        # Hand transaction control to SQLAlchemy's "begin" event below.
        dbapi_connection.isolation_level = None
        if write_ahead_log:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    def on_begin(connection: Any) -> None:
        if write_ahead_log:
            _begin_immediate(connection.connection.driver_connection, timeout=SQLITE_TIMEOUT)
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    sqlalchemy.event.listen(engine, "connect", on_connect)
    sqlalchemy.event.listen(engine, "begin", on_begin)
    # Connections pooled while Optuna created the schema predate the hooks.
    engine.dispose()


SQLITE_TIMEOUT = 60.0  # seconds a SQLite writer waits for the lock before it fails


def _begin_immediate(connection: Any, *, timeout: float) -> None:
    """``BEGIN IMMEDIATE`` on a write-ahead-logged SQLite file, trying again every 0.2-2 ms.

    SQLite's own busy handler sleeps up to 100 ms between tries, so with several processes
    a writer often sleeps long after the lock was released. Once the lock is held, nothing
    else in a write-ahead-logged transaction waits for another connection, so the busy
    timeout is lifted only for this statement (written by hand: Python's sqlite3 has no
    busy-handler hook).
    """
    import sqlite3

    connection.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + timeout
        delay = 0.0002
        while True:
            try:
                connection.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 0.002)
    finally:
        connection.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")


def _checked_sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL (``sqlite_file``), refused when it cannot be one."""
    path = sqlite_file(url)
    if path is None:
        return None
    if os.path.isdir(path):
        raise _error(url, f"{path} is a directory, not a SQLite database file")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise _error(url, f"directory {parent} does not exist")
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        if not is_sqlite_database(path):
            hint = (
                " (an Optuna journal: pass its path without sqlite:///)"
                if _looks_like_journal(path)
                else ""
            )
            raise _error(url, f"{path} is not a SQLite database{hint}")
    return path


def is_sqlite_database(path: str) -> bool:
    """Whether the existing file ``path`` is a SQLite database, asked of SQLite itself.

    A read-only SQLite connection, not ``open()``: this process may hold SQLite connections to
    the file, and closing a descriptor of our own would drop their POSIX locks (SQLite keeps
    its own descriptors open while another connection of the process holds a lock).
    """
    import sqlite3

    try:
        connection = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        connection.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as e:
        # "file is not a database"; a locked or busy file is a database nonetheless
        return "not a database" not in str(e)
    finally:
        connection.close()
    return True


# File systems whose locks and shared memory are local to one host (SQLite's write-ahead log
# works there); anything else, network file systems included, keeps the rollback journal.
_LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "f2fs", "apfs", "hfs"}
)


def on_local_filesystem(path: str, *, mounts: str = "/proc/mounts") -> bool:
    """Whether ``path`` lies on a local file system (by the longest mount point containing it
    in ``/proc/mounts``); ``False`` when that cannot be told."""
    target = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    best, fstype = "", ""
    try:
        with open(mounts, encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best):
                    best, fstype = point, fields[2]
    except OSError:
        return False
    return fstype in _LOCAL_FILESYSTEMS


# What SQLite says when another process created the same schema first.
_SCHEMA_RACE = ("already exists", "UNIQUE constraint failed")
_SCHEMA_TRIES = 20


def _first_open_of_sqlite(open_once: Callable[[], T]) -> T:
    """``open_once()``, tried again while another process is creating the same schema.

    Two processes creating Optuna's tables in a new file at once make the loser fail with
    ``table ... already exists`` or ``UNIQUE constraint failed: alembic_version``; a second
    try finds the tables (``create_all`` checks first) and the version row. Nothing of ours
    locks the database file: opening and closing it in a process that holds SQLite
    connections to it would drop SQLite's own POSIX locks (SQLite's "How To Corrupt An SQLite
    Database File", 2.2), and another process would then delete the write-ahead log in use.
    """
    import sqlalchemy.exc

    rng = random.Random()  # jitter only: the outcome does not depend on it
    for attempt in range(_SCHEMA_TRIES):
        try:
            return open_once()
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as e:
            if attempt == _SCHEMA_TRIES - 1 or not any(m in str(e) for m in _SCHEMA_RACE):
                raise
            time.sleep(rng.uniform(0.01, 0.05) * (attempt + 1))
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ journal file


def _looks_like_journal(path: str) -> bool:
    """Whether a non-empty file starts like an Optuna journal (one JSON operation a line)."""
    with open(path, "rb") as f:
        head = f.read(_JOURNAL_PROBE_BYTES)
    line = head.split(b"\n", 1)[0]
    try:
        first = json.loads(line)
    except ValueError:
        return False
    return isinstance(first, dict) and "op_code" in first and "worker_id" in first


def _open_journal_file(url: str) -> optuna.storages.BaseStorage:
    import optuna
    from optuna.storages.journal import JournalFileBackend
    from optuna.storages.journal import JournalFileSymlinkLock

    path = os.path.abspath(url)
    if os.path.isdir(path):
        raise _error(url, f"{path} is a directory, not a journal file")
    if not os.path.isdir(os.path.dirname(path)):
        raise _error(url, f"directory {os.path.dirname(path)} does not exist")
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        if is_sqlite_database(path):
            # optuna-dashboard refuses the bare path of a SQLite file the same way.
            raise _error(url, f"{path} is a SQLite database: use sqlite:///{url}")
        if not _looks_like_journal(path):
            raise _error(url, f"{path} is neither a SQLite database nor an Optuna journal")
    try:
        with warnings.catch_warnings():
            # JournalFileBackend is stable, but some Optuna versions still flag it.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            backend = JournalFileBackend(path, lock_obj=JournalFileSymlinkLock(path))
            return optuna.storages.JournalStorage(backend)
    except OSError as e:
        raise _error(url, f"{type(e).__name__}: {e}") from None
    except ValueError as e:
        # A journal whose lines do not replay (damaged or of another version).
        raise _error(url, f"the journal does not replay: {e}") from None


# ------------------------------------------------------------------ Redis journal


def with_socket_timeout(url: str, seconds: float) -> str:
    """``url`` with ``socket_timeout=seconds`` in its query, unless it names one already
    (redis-py reads it from the URL)."""
    parts = urlsplit(url)
    if "socket_timeout" in parse_qs(parts.query):
        return url
    query = "&".join(q for q in (parts.query, f"socket_timeout={seconds:g}") if q)
    return urlunsplit(parts._replace(query=query))


def _open_redis(url: str, timeout: float, call_timeout: float) -> optuna.storages.BaseStorage:
    try:
        import redis
    except ImportError:
        raise _missing_extra(url, "redis", "redis") from None
    import optuna

    try:
        # The journal's own client waits indefinitely; probe first so a stopped server is an
        # error now, not a hang in the first ask.
        probe = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            probe.ping()
        finally:
            probe.close()
    except (ValueError, TypeError) as e:
        raise _error(url, f"not a Redis URL ({e})") from None
    except redis.exceptions.RedisError as e:
        raise _error(url, f"Redis server not reachable: {e}") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        from optuna_hpcnas.storages._redis_journal import BatchedRedisBackend

        backend = BatchedRedisBackend(with_socket_timeout(url, call_timeout))
        return optuna.storages.JournalStorage(backend)


# ------------------------------------------------------------------ gRPC proxy


def parse_grpc_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``grpc://host:port``; ``ValueError`` naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != "grpc":
        raise ValueError(f"{mask_url(url)} does not start with grpc://")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{mask_url(url)} must be grpc://host:port (nothing after the port)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{mask_url(url)} has a port that is not a number in 1-65535") from None
    if not parts.hostname or port is None or port == 0:
        raise ValueError(f"{mask_url(url)} must be grpc://host:port (host and port required)")
    return parts.hostname, port


def _open_grpc(url: str, timeout: float) -> optuna.storages.BaseStorage:
    try:
        host, port = parse_grpc_url(url)
    except ValueError as e:
        raise _error(url, str(e)) from None
    try:
        import grpc  # noqa: F401
    except ImportError:
        raise _missing_extra(url, "grpcio", "grpc") from None
    import optuna
    from optuna.storages import GrpcStorageProxy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        proxy = GrpcStorageProxy(host=host, port=port)
    try:
        proxy.wait_server_ready(timeout=timeout)
    except ConnectionError:
        proxy.close()
        raise _error(
            url,
            f"no gRPC storage proxy answers at {host}:{port} within {timeout:g} s "
            "(start one with `hpcnas storage-proxy --storage URL`)",
        ) from None
    return proxy
