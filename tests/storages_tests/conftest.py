"""Fixtures for every storage backend: a Redis database, a journal file, a gRPC proxy.

Redis and the database servers follow tests/conftest.py: without the server the test skips,
with ``HPCNAS_REQUIRE_SERVICES=1`` (CI) it fails.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
import os
from pathlib import Path
import socket
import threading
import uuid

import optuna
import pytest

from tests.conftest import _skip_or_fail

REDIS_ADMIN_URL = os.environ.get("HPCNAS_TEST_REDIS_URL", "redis://127.0.0.1:6379")
# Database 0 is left to people; tests claim one of the others for their lifetime.
_REDIS_DBS = range(1, 16)
_CLAIM_KEY = "hpcnas-test:claim"


@pytest.fixture(autouse=True)
def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis database of its own for one test (claimed atomically, flushed afterwards).

    The journal backend keeps its log under fixed keys of a database, so each test needs a
    database nobody else writes: the claim key (SET NX with an expiry) makes concurrent test
    runs on one server pick different ones.
    """
    try:
        import redis
    except ImportError:
        _skip_or_fail("Python package redis is not installed (pip install optuna-hpcnas[redis])")
        return
    base = REDIS_ADMIN_URL.rstrip("/")
    token = uuid.uuid4().hex
    for db in _REDIS_DBS:
        client = redis.Redis.from_url(f"{base}/{db}", socket_connect_timeout=2)
        try:
            claimed = client.set(_CLAIM_KEY, token, nx=True, ex=900)
        except redis.exceptions.RedisError as e:
            client.close()
            _skip_or_fail(f"Redis server not reachable at {base}: {type(e).__name__}")
            return
        if claimed and client.dbsize() == 1:
            break
        if claimed:  # claimed but someone's data is there: give it back
            client.delete(_CLAIM_KEY)
        client.close()
    else:
        pytest.fail(f"no free Redis database among {list(_REDIS_DBS)} at {base}")
    try:
        yield f"{base}/{db}"
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def journal_path(tmp_path: Path) -> str:
    return str(tmp_path / "study.journal")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def grpc_url(tmp_path: Path) -> Iterator[str]:
    """``grpc://127.0.0.1:PORT``: a gRPC storage proxy over a temporary SQLite file, served by
    background threads of this process."""
    pytest.importorskip("grpc", reason="grpcio is not installed (optuna-hpcnas[grpc])")
    from optuna_hpcnas.storages import start_storage_proxy

    port = free_port()
    server = start_storage_proxy(f"sqlite:///{tmp_path / 'proxy.db'}", port=port)
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


_SERVER = pytest.mark.services
BACKENDS = [
    "sqlite",
    "journal-file",
    pytest.param("journal-redis", marks=_SERVER),
    "grpc",
    pytest.param("postgresql", marks=_SERVER),
    pytest.param("mysql", marks=_SERVER),
]
# Backends several processes may share (SQLite is left out: it is for one writer).
SHARED_BACKENDS = [b for b in BACKENDS if b != "sqlite"]


def backend_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    fixture = {
        "journal-file": "journal_path",
        "journal-redis": "redis_url",
        "grpc": "grpc_url",
        "postgresql": "postgres_url",
        "mysql": "mysql_url",
    }[kind]
    return str(request.getfixturevalue(fixture))


@pytest.fixture(params=BACKENDS)
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on every storage backend."""
    return backend_url(request, request.param, tmp_path)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every backend meant for several worker processes."""
    return backend_url(request, request.param, tmp_path)


def sweep_in_threads(
    studies: list[optuna.Study], sweep: Callable[[optuna.Study], list[int]]
) -> list[int]:
    """``sweep`` on every study at once (one thread each, released together): every number
    they returned; the first error of a thread is raised."""
    barrier = threading.Barrier(len(studies))
    won: list[int] = []
    errors: list[BaseException] = []

    def run(study: optuna.Study) -> None:
        try:
            barrier.wait()
            won.extend(sweep(study))
        except BaseException as e:  # raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in studies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return won
