"""An Optuna artifact store that keeps blobs in the study's own database.

One SQLAlchemy URL serves both the study (Optuna's tables) and the checkpoints (two tables
of ours), so a cluster needs one database and one backup. Blobs are split into rows of
``chunk_bytes`` (PostgreSQL ``bytea`` and MySQL ``LONGBLOB`` have practical row limits), all rows
of one blob are written in one transaction with the header row last, and a reader checks the
size and SHA-256 recorded in the header before it hands out the last byte.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from typing import Any
from typing import BinaryIO
from typing import TYPE_CHECKING

from optuna_hpcnas._validation import check_int
from optuna_hpcnas.storages._open import SQLITE_TIMEOUT
from optuna_hpcnas.storages._urls import storage_kind

if TYPE_CHECKING:
    import optuna
    import sqlalchemy

_logger = logging.getLogger(__name__)

_DEFAULT_CHUNK_BYTES = 1024 * 1024


class ArtifactCorruptedError(OSError):
    """A stored blob does not match the size or checksum recorded when it was written."""


def _tables(prefix: str) -> tuple[sqlalchemy.MetaData, sqlalchemy.Table, sqlalchemy.Table]:
    import sqlalchemy
    from sqlalchemy.dialects import mysql

    blob = sqlalchemy.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
    metadata = sqlalchemy.MetaData()
    header = sqlalchemy.Table(
        f"{prefix}s",
        metadata,
        sqlalchemy.Column("artifact_id", sqlalchemy.String(255), primary_key=True),
        sqlalchemy.Column("size", sqlalchemy.BigInteger, nullable=False),
        sqlalchemy.Column("n_chunks", sqlalchemy.Integer, nullable=False),
        sqlalchemy.Column("sha256", sqlalchemy.String(64), nullable=False),
        sqlalchemy.Column("created_at", sqlalchemy.Float, nullable=False),
    )
    chunks = sqlalchemy.Table(
        f"{prefix}_chunks",
        metadata,
        sqlalchemy.Column("artifact_id", sqlalchemy.String(255), primary_key=True),
        sqlalchemy.Column("idx", sqlalchemy.Integer, primary_key=True, autoincrement=False),
        sqlalchemy.Column("data", blob, nullable=False),
    )
    return metadata, header, chunks


class _ChunkReader(io.RawIOBase):
    """Reads a blob one row at a time and verifies it when the end is reached."""

    def __init__(self, store: RDBArtifactStore, artifact_id: str, header: Any) -> None:
        self._store = store
        self._artifact_id = artifact_id
        self._size = int(header.size)
        self._n_chunks = int(header.n_chunks)
        self._sha256 = str(header.sha256)
        self._next_idx = 0
        self._buffer = b""
        self._pos = 0
        self._read = 0
        self._hash = hashlib.sha256()
        self._verified = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        while self._pos >= len(self._buffer):
            if self._next_idx >= self._n_chunks:
                self._verify()
                return 0
            self._buffer = self._store._fetch_chunk(self._artifact_id, self._next_idx)
            self._next_idx += 1
            self._pos = 0
            self._read += len(self._buffer)
            self._hash.update(self._buffer)
        n = min(len(view), len(self._buffer) - self._pos)
        view[:n] = self._buffer[self._pos : self._pos + n]
        self._pos += n
        return n

    def readall(self) -> bytes:
        parts = [self._buffer[self._pos :]]
        while self._next_idx < self._n_chunks:
            chunk = self._store._fetch_chunk(self._artifact_id, self._next_idx)
            self._next_idx += 1
            self._read += len(chunk)
            self._hash.update(chunk)
            parts.append(chunk)
        self._buffer, self._pos = b"", 0
        self._verify()
        return b"".join(parts)

    def _verify(self) -> None:
        if self._verified:
            return
        if self._read != self._size or self._hash.hexdigest() != self._sha256:
            raise ArtifactCorruptedError(
                f"Artifact {self._artifact_id!r} is corrupted: read {self._read} bytes with "
                f"sha256 {self._hash.hexdigest()[:16]}..., expected {self._size} bytes with "
                f"sha256 {self._sha256[:16]}...."
            )
        self._verified = True


class RDBArtifactStore:
    """Optuna artifact store backed by two tables of the study's relational database.

    Implements Optuna's ``ArtifactStore`` protocol (``open_reader``, ``write``, ``remove``), so
    :func:`optuna.artifacts.upload_artifact`, :func:`optuna.artifacts.download_artifact` and
    ``optuna_dashboard.run_server(storage, artifact_store=store)`` work with it.

    Args:
        storage: The study's SQLAlchemy URL (``sqlite:///study.db``,
            ``postgresql+psycopg://...``) or an :class:`optuna.storages.RDBStorage`, whose
            engine is then shared.
        chunk_bytes: Largest row written for one blob; larger blobs span several rows.
        table_prefix: Prefix of the two tables (``<prefix>s`` and ``<prefix>_chunks``).
        engine_kwargs: Passed to :func:`sqlalchemy.create_engine` when ``storage`` is a URL.

    Examples:
        .. code-block:: python

            import optuna
            from optuna_hpcnas.checkpoints import RDBArtifactStore

            url = "sqlite:///study.db"
            study = optuna.create_study(storage=url)
            store = RDBArtifactStore(url)
            optuna.artifacts.upload_artifact(
                artifact_store=store, file_path="model.arrow", study_or_trial=study
            )
    """

    def __init__(
        self,
        storage: str | optuna.storages.RDBStorage,
        *,
        chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
        table_prefix: str = "hpcnas_artifact",
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import sqlalchemy

        check_int("chunk_bytes", chunk_bytes, 1024)
        if not isinstance(table_prefix, str) or not table_prefix.isidentifier():
            raise ValueError(f"`table_prefix` is {table_prefix!r}, but must be an identifier.")
        if isinstance(storage, str):
            kwargs = dict(engine_kwargs or {})
            if storage_kind(storage) == "sqlite":
                # A checkpoint write holds SQLite's write lock briefly; wait instead of failing.
                kwargs.setdefault("connect_args", {"timeout": SQLITE_TIMEOUT})
            self._engine = sqlalchemy.create_engine(storage, **kwargs)
            self._owns_engine = True
        else:
            # optuna.storages.get_storage(url) and study._storage wrap the RDBStorage.
            backend = getattr(storage, "_backend", storage)
            engine = getattr(backend, "engine", None)
            if not isinstance(engine, sqlalchemy.engine.Engine):
                raise TypeError(
                    f"`storage` is {storage!r}, but must be a SQLAlchemy URL or an "
                    "optuna.storages.RDBStorage."
                )
            if engine_kwargs is not None:
                raise ValueError("`engine_kwargs` is only used when `storage` is a URL.")
            self._engine = engine
            self._owns_engine = False
        self._chunk_bytes = chunk_bytes
        metadata, self._header, self._chunks = _tables(table_prefix)
        self._create_tables(metadata)

    def _create_tables(self, metadata: sqlalchemy.MetaData) -> None:
        import sqlalchemy

        # Several workers start at once: a concurrent CREATE TABLE may lose the race.
        for attempt in range(5):
            try:
                metadata.create_all(self._engine, checkfirst=True)
                return
            except sqlalchemy.exc.DatabaseError:
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    @property
    def engine(self) -> sqlalchemy.engine.Engine:
        """The SQLAlchemy engine (shared with the study's RDBStorage when one was given)."""
        return self._engine

    def dispose(self) -> None:
        """Close pooled connections (only those of an engine this store created)."""
        if self._owns_engine:
            self._engine.dispose()

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        """Store ``content_body`` under ``artifact_id`` in one transaction (replacing)."""
        import sqlalchemy

        digest = hashlib.sha256()
        size = 0
        idx = 0
        with self._engine.begin() as conn:
            conn.execute(
                sqlalchemy.delete(self._header).where(self._header.c.artifact_id == artifact_id)
            )
            conn.execute(
                sqlalchemy.delete(self._chunks).where(self._chunks.c.artifact_id == artifact_id)
            )
            while True:
                data = content_body.read(self._chunk_bytes)
                if not data:
                    break
                data = bytes(data)
                digest.update(data)
                size += len(data)
                conn.execute(
                    sqlalchemy.insert(self._chunks).values(
                        artifact_id=artifact_id, idx=idx, data=data
                    )
                )
                idx += 1
            # The header row goes last: a reader that sees it sees every chunk.
            conn.execute(
                sqlalchemy.insert(self._header).values(
                    artifact_id=artifact_id,
                    size=size,
                    n_chunks=idx,
                    sha256=digest.hexdigest(),
                    created_at=time.time(),
                )
            )
        _logger.debug("Wrote artifact %s (%d bytes in %d chunks).", artifact_id, size, idx)

    def open_reader(self, artifact_id: str) -> BinaryIO:
        """A binary reader over the blob; raises :class:`ArtifactCorruptedError` at the end if
        the bytes do not match the recorded size and checksum."""
        from optuna.artifacts.exceptions import ArtifactNotFound
        import sqlalchemy

        with self._engine.connect() as conn:
            header = conn.execute(
                sqlalchemy.select(self._header).where(self._header.c.artifact_id == artifact_id)
            ).first()
        if header is None:
            raise ArtifactNotFound(f"Artifact {artifact_id!r} not found.")
        return io.BufferedReader(_ChunkReader(self, artifact_id, header), buffer_size=1 << 20)

    def _fetch_chunk(self, artifact_id: str, idx: int) -> bytes:
        import sqlalchemy

        with self._engine.connect() as conn:
            row = conn.execute(
                sqlalchemy.select(self._chunks.c.data).where(
                    self._chunks.c.artifact_id == artifact_id, self._chunks.c.idx == idx
                )
            ).first()
        if row is None:
            raise ArtifactCorruptedError(f"Artifact {artifact_id!r} is missing chunk {idx}.")
        return bytes(row[0])

    def remove(self, artifact_id: str) -> None:
        """Delete the blob; raises ``ArtifactNotFound`` if there is none."""
        from optuna.artifacts.exceptions import ArtifactNotFound
        import sqlalchemy

        with self._engine.begin() as conn:
            deleted = conn.execute(
                sqlalchemy.delete(self._header).where(self._header.c.artifact_id == artifact_id)
            ).rowcount
            conn.execute(
                sqlalchemy.delete(self._chunks).where(self._chunks.c.artifact_id == artifact_id)
            )
        if not deleted:
            raise ArtifactNotFound(f"Artifact {artifact_id!r} not found.")

    def sha256(self, artifact_id: str) -> str | None:
        """SHA-256 recorded when the blob was written (readers verify against it), or None."""
        import sqlalchemy

        with self._engine.connect() as conn:
            row = conn.execute(
                sqlalchemy.select(self._header.c.sha256).where(
                    self._header.c.artifact_id == artifact_id
                )
            ).first()
        return None if row is None else str(row[0])

    def exists(self, artifact_id: str) -> bool:
        """Whether a complete blob is stored under ``artifact_id``."""
        import sqlalchemy

        with self._engine.connect() as conn:
            row = conn.execute(
                sqlalchemy.select(self._header.c.artifact_id).where(
                    self._header.c.artifact_id == artifact_id
                )
            ).first()
        return row is not None

    def __repr__(self) -> str:
        return f"RDBArtifactStore({self._engine.url.render_as_string(hide_password=True)!r})"
