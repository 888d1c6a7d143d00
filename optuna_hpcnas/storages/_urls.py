"""What a storage string says, read without opening anything: its backend, its SQLite file,
and the string with its password masked (for logs and messages)."""

from __future__ import annotations

import os
import re

from optuna_hpcnas._validation import check_str

_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@\s]*:)(?P<pw>[^@\s]*)@")


def mask_url(text: str) -> str:
    """Replace the password of every URL in ``text`` with ``***``.

    Examples:
        >>> mask_url("postgresql+psycopg://nas:s3cret@db:5432/optuna")
        'postgresql+psycopg://nas:***@db:5432/optuna'
        >>> mask_url("sqlite:///nas.db")
        'sqlite:///nas.db'
    """
    return _URL_PASSWORD.sub(lambda m: m.group("head") + "***@", text)


def storage_kind(url: str) -> str:
    """The backend a storage string selects, from its spelling alone (nothing is opened).

    One of ``"sqlite"``, ``"postgresql"``, ``"mysql"`` (MariaDB included), ``"rdb"`` (another
    SQLAlchemy dialect), ``"journal-redis"``, ``"grpc"`` and ``"journal-file"``.

    Examples:
        >>> storage_kind("postgresql+psycopg://nas:pw@db/optuna")
        'postgresql'
        >>> storage_kind("runs/nas.journal")
        'journal-file'
    """
    check_str("url", url)
    if not url.strip():
        raise ValueError("`url` is empty, but must name a storage.")
    # optuna-dashboard's order: Redis by prefix first, then URLs, then files.
    if url.startswith("redis"):
        return "journal-redis"
    scheme, sep, _ = url.partition("://")
    if not sep:
        return "journal-file"
    dialect = scheme.split("+", 1)[0].lower()
    if dialect == "grpc":
        return "grpc"
    if dialect == "sqlite":
        return "sqlite"
    if dialect in ("postgresql", "postgres"):
        return "postgresql"
    if dialect in ("mysql", "mariadb"):
        return "mysql"
    return "rdb"


def sqlite_file(url: str) -> str | None:
    """The absolute path of the database file a SQLite URL names; ``None`` for other storages,
    in-memory databases (``sqlite://``, ``sqlite:///:memory:``) and ``file:`` URIs.

    Examples:
        >>> sqlite_file("sqlite:////runs/nas.db?timeout=5")
        '/runs/nas.db'
        >>> sqlite_file("sqlite:///:memory:") is None
        True
    """
    if storage_kind(url) != "sqlite":
        return None
    import sqlalchemy.engine
    import sqlalchemy.exc

    try:
        database = sqlalchemy.engine.make_url(url).database
    except sqlalchemy.exc.ArgumentError:
        return None
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(database)
