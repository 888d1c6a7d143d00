"""Where checkpoints of a storage go: the RDB artifact store, or a configured directory.

An RDB storage keeps checkpoint blobs in two tables of its own database
(:class:`RDBArtifactStore`), so one URL holds the whole search.
Journal storages and the gRPC proxy have no tables to put blobs in (and proxy clients may not
reach the database at all), so their checkpoints go to an Optuna
:class:`~optuna.artifacts.FileSystemArtifactStore` on a directory every worker can reach:
``[checkpoints] artifact_store`` in the run file.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from optuna_hpcnas._validation import check_str
from optuna_hpcnas.storages._open import StorageError
from optuna_hpcnas.storages._rdb_artifacts import RDBArtifactStore

if TYPE_CHECKING:
    import optuna
    from optuna.artifacts._protocol import ArtifactStore


def artifact_store_for(
    storage: optuna.storages.BaseStorage, *, artifact_store: str | None
) -> ArtifactStore:
    """The artifact store for the checkpoints of ``storage``.

    Args:
        storage: The study's storage (from :func:`open_storage`, or ``study._storage``).
        artifact_store: A directory for a :class:`optuna.artifacts.FileSystemArtifactStore`
            (created if missing). When given it is used on every storage; when ``None``, RDB
            storages use their own database and other storages are refused.

    Raises:
        StorageError: ``artifact_store`` is ``None`` on a storage without tables, or names a
            path that is not a directory.

    Examples:
        .. code-block:: python

            storage = open_storage("runs/nas.journal")
            store = artifact_store_for(storage, artifact_store="runs/checkpoints")
    """
    from optuna.storages import RDBStorage

    from optuna_hpcnas.storages._files import AtomicFileSystemArtifactStore

    if artifact_store is not None:
        check_str("artifact_store", artifact_store, what="a directory path", nonempty=True)
        path = os.path.abspath(artifact_store)
        if os.path.exists(path) and not os.path.isdir(path):
            raise StorageError(
                f"`[checkpoints] artifact_store` is {artifact_store!r}, which is not a directory."
            )
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(
                f"`[checkpoints] artifact_store` is {artifact_store!r}, which cannot be "
                f"created: {e}"
            ) from None
        return AtomicFileSystemArtifactStore(path)
    backend = getattr(storage, "_backend", storage)  # Optuna's _CachedStorage wraps RDBStorage
    if isinstance(backend, RDBStorage):
        return RDBArtifactStore(backend)
    raise StorageError(
        f"Checkpoints of a {type(backend).__name__} need a directory: set "
        "`[checkpoints] artifact_store` (a path every worker can reach; only RDB storages "
        "keep checkpoints in their own database)."
    )
