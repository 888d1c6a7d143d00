"""Shared fixtures: database servers for storage tests, and the rule that CI never skips them.

Tests that need PostgreSQL or MySQL skip with a reason on a laptop without the server; with
``HPCNAS_REQUIRE_SERVICES=1`` (set by ``.ci/run``) a missing server fails the test instead.
"""

from __future__ import annotations

from collections.abc import Iterator
import os
import uuid

import pytest

POSTGRES_ADMIN_URL = os.environ.get(
    "HPCNAS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_ADMIN_URL = os.environ.get(
    "HPCNAS_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)


def services_required() -> bool:
    return os.environ.get("HPCNAS_REQUIRE_SERVICES", "") not in ("", "0")


def _skip_or_fail(reason: str) -> None:
    if services_required():
        pytest.fail(f"{reason} (HPCNAS_REQUIRE_SERVICES is set, so this is a failure)")
    pytest.skip(reason)


def _fresh_schema_url(admin_url: str, kind: str) -> Iterator[str]:
    """A URL to an empty database namespace, dropped afterwards."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except Exception as e:
        _skip_or_fail(f"{kind} server not reachable at {admin_url}: {type(e).__name__}")
        return
    name = f"hpcnas_{uuid.uuid4().hex[:12]}"
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        yield url
    finally:
        with engine.connect() as conn:
            if kind == "PostgreSQL":
                conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            else:
                conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name}"))
        engine.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """An empty PostgreSQL database for one test."""
    yield from _fresh_schema_url(POSTGRES_ADMIN_URL, "PostgreSQL")


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """An empty MySQL/MariaDB database for one test."""
    yield from _fresh_schema_url(MYSQL_ADMIN_URL, "MySQL")
