"""``AtomicFileSystemArtifactStore``: checkpoint blobs in a directory, whole or not at all
(``artifact_store_for`` builds it for ``[checkpoints] artifact_store``)."""

from __future__ import annotations

import os
import shutil
from typing import BinaryIO
import uuid

from optuna.artifacts import FileSystemArtifactStore


class AtomicFileSystemArtifactStore(FileSystemArtifactStore):
    """Optuna's ``FileSystemArtifactStore`` whose blobs appear whole or not at all.

    Optuna's store writes the blob in place: a full disk (or a killed writer) leaves a partial
    file under the artifact's name for good. Here the blob goes to a temporary name in the same
    directory, is flushed to disk and renamed over the artifact's name; on any error the
    temporary file is removed and the error raised.
    """

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        target = self._get_filepath(artifact_id)
        temp = os.path.join(os.path.dirname(target), f".{artifact_id}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temp, "xb") as f:
                shutil.copyfileobj(content_body, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException:
            try:
                os.remove(temp)
            except OSError:
                pass
            raise
