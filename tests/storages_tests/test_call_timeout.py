"""A call to a frozen RDB server ends within the storage's ``call_timeout``: a PostgreSQL
cluster of its own frozen with SIGSTOP in the middle of a call (the watchdog cuts the
connection; a new one times out), and the driver timeouts a MySQL or PostgreSQL engine is
given (seen at the driver's connect, no server needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
import threading
import time
from typing import Any

import optuna
import pytest
import sqlalchemy

from optuna_hpcnas.storages import is_connection_error
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import rdb_storage
from optuna_hpcnas.testing.outages import postgres_bin
from optuna_hpcnas.testing.outages import PostgresServer
from tests.conftest import _skip_or_fail

CALL_TIMEOUT = 1.0
# the watchdog looks every call_timeout / 4; a loaded machine gets a second more
MARGIN = 1.5


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    if postgres_bin() is None:
        _skip_or_fail("PostgreSQL's pg_ctl/initdb not found (install postgresql)")
    server = PostgresServer()
    with server:
        yield server


def _timed(call: Any) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as e:
        return time.monotonic() - started, e
    return time.monotonic() - started, None


@pytest.mark.services
def test_a_call_to_a_frozen_postgresql_fails_as_a_lost_connection_within_the_call_timeout(
    postgres: PostgresServer,
) -> None:
    storage = open_storage(postgres.url, call_timeout=CALL_TIMEOUT)
    optuna.create_study(storage=storage, study_name="frozen")
    blocked: list[tuple[float, BaseException | None]] = []
    with storage.engine.connect() as conn:  # type: ignore[attr-defined]
        conn.exec_driver_sql("SELECT 1")
        # frozen while the call waits for its answer, not before it is sent
        caller = threading.Thread(
            target=lambda: blocked.append(_timed(lambda: conn.exec_driver_sql("SELECT 1")))
        )
        postgres.freeze()
        try:
            caller.start()
            caller.join(timeout=30)
            # a new connection: the frozen postmaster's kernel accepts it, nobody answers
            reconnect = _timed(storage.get_all_studies)
        finally:
            postgres.thaw()
    assert not caller.is_alive()
    for _, error in (blocked[0], reconnect):
        assert error is not None and is_connection_error(error), error
    assert blocked[0][0] < CALL_TIMEOUT + MARGIN
    assert reconnect[0] < 2 + MARGIN  # connect_timeout: libpq's least, 2 s
    assert [s.study_name for s in storage.get_all_studies()] == ["frozen"]  # thawed: back


@pytest.mark.services
def test_round_trips_each_within_the_call_timeout_are_not_cut(postgres: PostgresServer) -> None:
    """The bound is on each round trip, not on a transaction: a checkpoint written in many
    statements outlasts the call timeout. A statement longer than it counts as no answer."""
    storage = open_storage(postgres.url, call_timeout=CALL_TIMEOUT)
    engine = storage.engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        for _ in range(4):
            conn.exec_driver_sql("SELECT pg_sleep(0.5)")
    seconds, error = _timed(lambda: engine.connect().exec_driver_sql("SELECT pg_sleep(5)"))
    assert error is not None and is_connection_error(error), error
    assert seconds < CALL_TIMEOUT + MARGIN


class _Connected(Exception):
    """Raised in place of the driver's connect: the arguments were seen."""


def _connect_args(dialect: type, url: str, call_timeout: float) -> dict[str, Any]:
    """The keyword arguments ``rdb_storage(url, call_timeout=...)`` hands the driver."""
    seen: list[dict[str, Any]] = []

    def capture(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        seen.append(dict(cparams))
        raise _Connected

    sqlalchemy.event.listen(dialect, "do_connect", capture)
    try:
        with pytest.raises(_Connected):
            rdb_storage(url, call_timeout=call_timeout)
    finally:
        sqlalchemy.event.remove(dialect, "do_connect", capture)
    return seen[0]


def test_mysql_connections_read_and_write_with_the_call_timeout() -> None:
    # A frozen MySQL/MariaDB cannot be made here (the test server is a shared service, not one
    # of our own to SIGSTOP): PyMySQL's socket timeouts are the bound, so they are checked at
    # the driver's connect.
    pytest.importorskip("pymysql")
    from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql

    args = _connect_args(MySQLDialect_pymysql, "mysql+pymysql://nas@db:3306/nas", 2.5)
    assert {k: args[k] for k in ("connect_timeout", "read_timeout", "write_timeout")} == {
        "connect_timeout": 3,
        "read_timeout": 3,
        "write_timeout": 3,
    }
    named = _connect_args(MySQLDialect_pymysql, "mysql+pymysql://nas@db/nas?read_timeout=60", 2)
    assert (named["read_timeout"], named["write_timeout"]) == (60, 2)


def test_postgresql_connections_time_out_within_the_call_timeout() -> None:
    pytest.importorskip("psycopg")
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    url = "postgresql+psycopg://nas@db:5432/nas"
    assert _connect_args(PGDialect_psycopg, url, 1.0)["connect_timeout"] == 2
    assert _connect_args(PGDialect_psycopg, url, 7.5)["connect_timeout"] == 8
    named = _connect_args(PGDialect_psycopg, url + "?connect_timeout=30", 1.0)
    assert named["connect_timeout"] == "30"


def test_sqlite_and_storages_without_a_call_timeout_are_not_watched(tmp_path: Path) -> None:
    for storage in (
        rdb_storage(f"sqlite:///{tmp_path / 'a.db'}", call_timeout=CALL_TIMEOUT),
        open_storage(f"sqlite:///{tmp_path / 'b.db'}", call_timeout=CALL_TIMEOUT),
    ):
        assert not storage.engine.dispatch.before_cursor_execute  # type: ignore[attr-defined]
        assert not storage.engine.pool.dispatch.checkout  # type: ignore[attr-defined]


def test_heartbeat_storages_bound_their_calls_as_open_storage_does() -> None:
    """``checkpoints.heartbeat_storage`` hands the driver the same timeouts, its default
    being ``open_storage``'s; ``call_timeout=None`` leaves a call unbounded."""
    pytest.importorskip("psycopg")
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    from optuna_hpcnas.checkpoints import heartbeat_storage
    from optuna_hpcnas.storages import CALL_TIMEOUT_S

    seen: list[dict[str, Any]] = []

    def capture(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        seen.append(dict(cparams))
        raise _Connected

    url = "postgresql+psycopg://nas@db:5432/nas"
    sqlalchemy.event.listen(PGDialect_psycopg, "do_connect", capture)
    try:
        for call_timeout in (CALL_TIMEOUT_S, 4.2, None):
            with pytest.raises(_Connected):
                heartbeat_storage(url, call_timeout=call_timeout)
    finally:
        sqlalchemy.event.remove(PGDialect_psycopg, "do_connect", capture)
    assert [args.get("connect_timeout") for args in seen] == [int(CALL_TIMEOUT_S), 5, None]
