"""RDBArtifactStore: Optuna's artifact protocol on the study's own database."""

from __future__ import annotations

import io
import json
from pathlib import Path
import threading

import optuna
from optuna.artifacts import download_artifact
from optuna.artifacts import upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
import pytest
import sqlalchemy

from optuna_hpcnas.checkpoints import ArtifactCorruptedError
from optuna_hpcnas.checkpoints import RDBArtifactStore


def test_protocol_round_trip_chunked_and_overwrite(db_url: str) -> None:
    store = RDBArtifactStore(db_url, chunk_bytes=1024)
    data = bytes(range(256)) * 41 + b"tail"  # 10 chunks and a partial one
    store.write("a", io.BytesIO(data))
    with store.engine.connect() as conn:
        n_rows = conn.execute(
            sqlalchemy.text("SELECT COUNT(*) FROM hpcnas_artifact_chunks WHERE artifact_id='a'")
        ).scalar()
    assert n_rows == len(data) // 1024 + 1
    with store.open_reader("a") as f:
        assert f.read() == data
    with store.open_reader("a") as f:  # small reads cross chunk borders
        parts = iter(lambda: f.read(1000), b"")
        assert b"".join(parts) == data
    store.write("a", io.BytesIO(b"short"))
    with store.open_reader("a") as f:
        assert f.read() == b"short"
    store.write("empty", io.BytesIO(b""))
    with store.open_reader("empty") as f:
        assert f.read() == b""
    store.remove("a")
    with pytest.raises(ArtifactNotFound):
        store.open_reader("a")
    with pytest.raises(ArtifactNotFound):
        store.remove("a")
    store.dispose()


def test_failed_write_leaves_nothing_and_keeps_old_blob(sqlite_url: str) -> None:
    store = RDBArtifactStore(sqlite_url, chunk_bytes=1024)
    store.write("a", io.BytesIO(b"old" * 1000))

    class Broken(io.RawIOBase):
        def __init__(self) -> None:
            self.n = 0

        def read(self, n: int = -1) -> bytes:  # type: ignore[override]
            self.n += 1
            if self.n > 2:
                raise OSError("disk went away")
            return b"x" * 1024

    with pytest.raises(OSError, match="disk went away"):
        store.write("a", Broken())  # type: ignore[arg-type]
    with pytest.raises(OSError):
        store.write("b", Broken())  # type: ignore[arg-type]
    with store.open_reader("a") as f:
        assert f.read() == b"old" * 1000
    assert not store.exists("b")


@pytest.mark.parametrize("damage", ["flip", "truncate", "drop_chunk"])
def test_damaged_blob_is_detected(sqlite_url: str, damage: str) -> None:
    store = RDBArtifactStore(sqlite_url, chunk_bytes=1024)
    store.write("a", io.BytesIO(bytes(range(256)) * 10))
    with store.engine.begin() as conn:
        if damage == "flip":
            row = conn.execute(
                sqlalchemy.text("SELECT data FROM hpcnas_artifact_chunks WHERE idx=1")
            ).scalar_one()
            data = bytearray(row)
            data[100] ^= 0x01
            conn.execute(
                sqlalchemy.text("UPDATE hpcnas_artifact_chunks SET data=:d WHERE idx=1"),
                {"d": bytes(data)},
            )
        elif damage == "truncate":
            conn.execute(
                sqlalchemy.text("UPDATE hpcnas_artifact_chunks SET data=:d WHERE idx=2"),
                {"d": b"\0" * 10},
            )
        else:
            conn.execute(sqlalchemy.text("DELETE FROM hpcnas_artifact_chunks WHERE idx=1"))
    with pytest.raises(ArtifactCorruptedError, match="'a'"):
        with store.open_reader("a") as f:
            f.read()


def test_upload_and_download_artifact(db_url: str, tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(db_url)
    store = RDBArtifactStore(storage)  # shares the study's engine
    assert store.engine is storage.engine
    study = optuna.create_study(storage=storage)
    src = tmp_path / "model.bin"
    src.write_bytes(b"\x00\x01weights" * 5000)
    trial = study.ask()
    artifact_id = upload_artifact(artifact_store=store, file_path=str(src), study_or_trial=trial)
    study.tell(trial, 1.0)
    dst = tmp_path / "copy.bin"
    download_artifact(artifact_store=store, file_path=str(dst), artifact_id=artifact_id)
    assert dst.read_bytes() == src.read_bytes()
    metas = optuna.artifacts.get_all_artifact_meta(study.trials[0], storage=storage)
    assert [m.artifact_id for m in metas] == [artifact_id]


def test_optuna_dashboard_serves_checkpoints(sqlite_url: str) -> None:
    """optuna-dashboard started with the store lists and serves our checkpoint blobs."""
    import numpy as np
    from optuna_dashboard import wsgi

    from optuna_hpcnas.checkpoints import CheckpointManager
    from optuna_hpcnas.checkpoints._format import read_records

    study = optuna.create_study(storage=sqlite_url, study_name="dash")
    store = RDBArtifactStore(sqlite_url)
    info = CheckpointManager(study=study, artifact_store=store).save(
        {"w": np.arange(10, dtype=np.float32)}, step=3
    )
    app = wsgi(sqlite_url, artifact_store=store)

    def get(path: str) -> tuple[str, bytes]:
        status: list[str] = []
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": path,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8080",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": io.StringIO(),
        }
        body = app(environ, lambda s, h, *a: status.append(s))  # type: ignore[arg-type]
        return status[0], b"".join(body)

    status, body = get(f"/api/studies/{study._study_id}")
    assert status.startswith("200")
    listed = json.loads(body)["artifacts"]
    assert [a["artifact_id"] for a in listed] == [info.artifact_id]
    assert listed[0]["filename"] == f"{info.checkpoint_id}.arrow"
    status, body = get(f"/artifacts/{study._study_id}/{info.artifact_id}")
    assert status.startswith("200")
    assert read_records(body, expected_id=info.checkpoint_id)[1][0].name == "w"


def test_constructor_validation(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="`chunk_bytes` is 10"):
        RDBArtifactStore(sqlite_url, chunk_bytes=10)
    with pytest.raises(TypeError, match="`storage` is"):
        RDBArtifactStore(optuna.storages.InMemoryStorage())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`table_prefix` is 'a b'"):
        RDBArtifactStore(sqlite_url, table_prefix="a b")


def test_threads_share_one_store(sqlite_url: str) -> None:
    store = RDBArtifactStore(sqlite_url, chunk_bytes=1024)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(5):
                store.write(f"{i}-{j}", io.BytesIO(bytes([i]) * 3000))
                with store.open_reader(f"{i}-{j}") as f:
                    assert f.read() == bytes([i]) * 3000
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
