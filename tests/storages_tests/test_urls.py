"""What a storage string says without opening it: masked password, backend, SQLite file."""

from __future__ import annotations

import os

import pytest

from optuna_hpcnas.storages import mask_url
from optuna_hpcnas.storages import sqlite_file
from optuna_hpcnas.storages import storage_kind


@pytest.mark.parametrize(
    "url, masked",
    [
        ("postgresql+psycopg://nas:pa:ss@db/x", "postgresql+psycopg://nas:***@db/x"),
        ("mysql+pymysql://root:@127.0.0.1/test", "mysql+pymysql://root:***@127.0.0.1/test"),
        ("postgresql://nas@db/x", "postgresql://nas@db/x"),
        ("sqlite:////abs/path.db", "sqlite:////abs/path.db"),
        (
            "use a=postgresql://u:p@h/d and b=mysql://v:q@h/d",
            "use a=postgresql://u:***@h/d and b=mysql://v:***@h/d",
        ),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_sqlite_file_is_the_one_sqlite_check() -> None:
    assert sqlite_file("sqlite:////abs/nas.db?timeout=5") == "/abs/nas.db"
    assert sqlite_file("sqlite:///nas.db") == os.path.abspath("nas.db")
    for memory in ("sqlite://", "sqlite:///:memory:"):
        assert storage_kind(memory) == "sqlite" and sqlite_file(memory) is None
    for other in ("postgresql+psycopg://u:p@h/d", "runs/nas.journal", "redis://h:6379/0"):
        assert storage_kind(other) != "sqlite" and sqlite_file(other) is None
