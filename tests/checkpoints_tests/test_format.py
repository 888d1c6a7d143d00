"""The record format: lossless round trips, and refusal of anything that is not ours."""

from __future__ import annotations

import io
import json
from pathlib import Path
import pickle

import numpy as np
import optuna
import pyarrow as pa
import pytest
import torch

from optuna_hpcnas.checkpoints import CheckpointConfig
from optuna_hpcnas.checkpoints import CheckpointFormatError
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import InvalidCheckpointWarning
from optuna_hpcnas.checkpoints import RDBArtifactStore
from optuna_hpcnas.checkpoints._format import _schema
from optuna_hpcnas.checkpoints._format import read_records


def _manager(url: str, **config: int) -> tuple[optuna.Study, RDBArtifactStore, CheckpointManager]:
    study = optuna.create_study(storage=url)
    store = RDBArtifactStore(url)
    return (
        study,
        store,
        CheckpointManager(study=study, artifact_store=store, config=CheckpointConfig(**config)),
    )


def test_every_dtype_round_trips_bit_exactly(sqlite_url: str) -> None:
    rng = np.random.default_rng(0)
    state = {
        "f32": rng.standard_normal((7, 5)).astype(np.float32),
        "f64_nan": np.array([np.nan, -0.0, np.inf, 1e-310]),
        "f16": rng.standard_normal(33).astype(np.float16),
        "c64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "i64": np.array([-(2**63), 2**63 - 1, 0], dtype=np.int64),
        "u8": np.arange(256, dtype=np.uint8),
        "bool": rng.random(17) > 0.5,
        "big_endian": np.arange(5, dtype=">i4"),
        "scalar": np.float32(3.5),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "torch_bf16": torch.randn(6, 2).to(torch.bfloat16),
        "torch_i32": torch.arange(10, dtype=torch.int32).reshape(2, 5),
        "torch_rng": torch.get_rng_state(),
    }
    _, _, manager = _manager(sqlite_url, shard_bytes=1024, full_every=3)
    manager.save(state, step=1)
    # Change some values (incl. NaN payloads and integer wrap-around) and save increments.
    state2 = dict(state)
    state2["f64_nan"] = np.array([1.0, np.nan, -np.inf, 0.0])
    state2["i64"] = np.array([2**63 - 1, -(2**63), 5], dtype=np.int64)
    state2["torch_bf16"] = state["torch_bf16"] * 2
    state2["f32"] = state["f32"] + 1
    manager.save(state2, step=2)
    loaded = CheckpointManager(study=manager._study, artifact_store=manager._store).load_latest()
    assert loaded is not None and loaded.info.kind == "incremental"
    out = loaded.state()
    for name, value in state2.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(out[name], torch.Tensor) and out[name].dtype == value.dtype
            assert torch.equal(out[name].view(torch.uint8), value.view(torch.uint8))
        else:
            expected = np.asarray(value)
            assert out[name].shape == expected.shape
            assert out[name].dtype == expected.dtype.newbyteorder("=")
            assert (
                out[name].tobytes() == expected.astype(expected.dtype.newbyteorder("<")).tobytes()
            )


def test_object_dtype_and_other_values_are_rejected(sqlite_url: str) -> None:
    _, _, manager = _manager(sqlite_url)
    with pytest.raises(TypeError, match="'obj'"):
        manager.save({"obj": np.array([object()])}, step=0)
    with pytest.raises(TypeError, match="'lst'"):
        manager.save({"lst": [1, 2]}, step=0)
    with pytest.raises(TypeError, match="JSON"):
        manager.save({"w": np.zeros(2)}, step=0, metadata={"x": object()})


class _CreatesFile:
    """Unpickling this creates a file: the proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


def _extension_blob(registered: bool) -> bytes:
    """A file with our exact columns, but the payload column wrapped in an extension type."""

    class Evil(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.large_binary(), "hpcnas.test.evil")

        def __arrow_ext_serialize__(self) -> bytes:
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> Evil:
            return Evil()

    schema = _schema()
    fields = [schema.field(i) for i in range(len(schema))]
    idx = schema.get_field_index("payload")
    fields[idx] = pa.field("payload", Evil(), nullable=False)
    ext_schema = pa.schema(fields, metadata={"hpcnas.format": "1"})
    columns = [
        pa.array(["w"]),
        pa.array(["float32"]),
        pa.array([[1]], pa.list_(pa.int64())),
        pa.array([0], pa.int32()),
        pa.array([0], pa.int64()),
        pa.array([1], pa.int64()),
        pa.array(["raw"]),
        pa.array([None], pa.string()),
        pa.ExtensionArray.from_storage(Evil(), pa.array([b"\0\0\0\0"], pa.large_binary())),
        pa.array(["x"]),
        pa.array(["x"]),
    ]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, ext_schema) as w:
        w.write_batch(pa.record_batch(columns, schema=ext_schema))
    blob = sink.getvalue().to_pybytes()
    if registered:
        pa.register_extension_type(Evil())
    return blob


def test_pickle_blob_is_refused_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    blob = pickle.dumps(_CreatesFile(marker))
    with pytest.raises(CheckpointFormatError, match="not an Arrow IPC file"):
        read_records(blob)
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2), "evil": _CreatesFile(marker)}, buf)
    with pytest.raises(CheckpointFormatError, match="not an Arrow IPC file"):
        read_records(buf.getvalue())
    assert not marker.exists()
    pickle.loads(blob)  # the payload is armed: unpickling it does create the file
    assert marker.exists()


@pytest.mark.parametrize("registered", [False, True])
def test_extension_type_is_refused(registered: bool) -> None:
    blob = _extension_blob(registered)
    try:
        with pytest.raises(CheckpointFormatError, match="extension type"):
            read_records(blob)
    finally:
        if registered:
            pa.unregister_extension_type("hpcnas.test.evil")


@pytest.mark.parametrize("kind", ["pickle", "torch.save", "extension"])
def test_swapped_blob_with_matching_manifest_is_skipped(
    sqlite_url: str, tmp_path: Path, kind: str
) -> None:
    """Even with a forged manifest checksum, a hostile blob is refused and the previous used."""
    import hashlib

    marker = tmp_path / "pwned"
    study, store, manager = _manager(sqlite_url)
    manager.save({"w": np.ones(8, np.float32)}, step=1)
    bad = manager.save({"w": np.full(8, 2, np.float32)}, step=2, full=True)
    if kind == "pickle":
        blob = pickle.dumps(_CreatesFile(marker))
    elif kind == "torch.save":
        buf = io.BytesIO()
        torch.save({"w": _CreatesFile(marker)}, buf)
        blob = buf.getvalue()
    else:
        blob = _extension_blob(registered=False)
    store.write(bad.artifact_id, io.BytesIO(blob))
    forged = json.loads(bad.to_json())
    forged.update(size=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    study._storage.set_study_system_attr(
        study._study_id, manager._prefix + bad.checkpoint_id, json.dumps(forged)
    )
    fresh = CheckpointManager(study=study, artifact_store=store)
    with pytest.warns(InvalidCheckpointWarning, match=bad.checkpoint_id):
        ckpt = fresh.load_latest()
    assert ckpt is not None and ckpt.step == 1
    assert np.array_equal(ckpt.array("w"), np.ones(8, np.float32))
    assert not marker.exists()
