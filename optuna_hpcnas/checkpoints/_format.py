"""The on-disk checkpoint format: one Arrow IPC file, one record per tensor shard.

Each record carries ``name, dtype, shape, shard, offset, encoding, parent, payload, checksum,
value_checksum``. Payloads are byte-shuffled (byte ``i`` of every element together, so the
constant sign/exponent bytes of small float updates form long runs) and compressed with zstd by
Arrow's IPC buffer compression. ``encoding`` says how the payload relates to the parent
checkpoint: ``raw`` (the values), ``xor`` (bit patterns XOR the parent's: lossless for floats),
``delta`` (wrapping integer difference) or ``ref`` (unchanged, no payload).

Nothing here unpickles: the reader checks the Arrow magic bytes first, then that the schema is
exactly ours with no extension types, then every checksum.
"""

from __future__ import annotations

from dataclasses import dataclass
import hashlib
from typing import Any

import numpy as np

FORMAT_VERSION = 1
_MAGIC = b"ARROW1"
_EXTENSION_KEYS = (b"ARROW:extension:name", b"ARROW:extension:metadata")
ENCODINGS = ("raw", "xor", "delta", "ref")
_BATCH_BYTES = 32 * 1024 * 1024

# Plain numeric dtypes only; "bfloat16" is carried as its 16-bit pattern.
_NUMPY_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
_BITS_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}


class CheckpointFormatError(ValueError):
    """A blob is not a checkpoint of this format: refused without running any code."""


class CheckpointChecksumError(CheckpointFormatError):
    """A record's payload or decoded value does not match its checksum."""


def _pyarrow() -> Any:
    """pyarrow, refusing versions that deserialise pickled extension types (CVE-2023-47248)."""
    try:
        import pyarrow as pa
    except ImportError as e:
        raise ImportError("Checkpoints need pyarrow: pip install 'optuna-hpcnas[arrow]'.") from e
    version = tuple(int(p) for p in pa.__version__.split(".")[:3] if p.isdigit())
    if version < (14, 0, 1):
        raise ImportError(f"pyarrow {pa.__version__} is unsafe; checkpoints need >= 14.0.1.")
    return pa


def storage_dtype(dtype: str) -> np.dtype:
    """The little-endian numpy dtype that holds the bits of a recorded ``dtype``."""
    kind = dtype.split(":", 1)[-1]
    if kind == "bfloat16":
        return np.dtype("<u2")
    if kind not in _NUMPY_DTYPES:
        raise CheckpointFormatError(f"dtype {dtype!r} is not allowed in a checkpoint.")
    return np.dtype(kind).newbyteorder("<")


def checksum(data: bytes | memoryview | np.ndarray) -> str:
    """BLAKE2b-128 hex digest (fast, and collisions are not a concern against bit rot)."""
    if isinstance(data, np.ndarray):
        view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    else:
        view = memoryview(data).cast("B")
    return hashlib.blake2b(view, digest_size=16).hexdigest()


def shuffle(flat: np.ndarray) -> bytes:
    """Byte-shuffle a 1-D array: all first bytes, then all second bytes, ..."""
    size = flat.dtype.itemsize
    raw = np.ascontiguousarray(flat).view(np.uint8)
    if size == 1:
        return raw.tobytes()
    return raw.reshape(-1, size).T.tobytes()


def unshuffle(data: bytes, dtype: np.dtype, count: int) -> np.ndarray:
    """Inverse of :func:`shuffle`; returns a new writable 1-D array of ``count`` elements."""
    size = dtype.itemsize
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size != size * count:
        raise CheckpointFormatError(
            f"payload holds {raw.size} bytes, expected {size * count} for {count} x {dtype}."
        )
    if size == 1:
        return raw.view(dtype).copy()
    return np.ascontiguousarray(raw.reshape(size, count).T).view(dtype).reshape(count)


def bits(flat: np.ndarray) -> np.ndarray:
    """The same memory viewed as unsigned integers (for XOR)."""
    size = flat.dtype.itemsize
    return flat.view(_BITS_DTYPE[size])


@dataclass(frozen=True)
class Record:
    """One tensor shard as stored."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    count: int
    encoding: str
    parent: str | None
    payload: bytes
    checksum: str
    value_checksum: str


def _schema() -> Any:
    pa = _pyarrow()

    return pa.schema(
        [
            pa.field("name", pa.string(), nullable=False),
            pa.field("dtype", pa.string(), nullable=False),
            pa.field("shape", pa.list_(pa.int64()), nullable=False),
            pa.field("shard", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("count", pa.int64(), nullable=False),
            pa.field("encoding", pa.string(), nullable=False),
            pa.field("parent", pa.string(), nullable=True),
            pa.field("payload", pa.large_binary(), nullable=False),
            pa.field("checksum", pa.string(), nullable=False),
            pa.field("value_checksum", pa.string(), nullable=False),
        ]
    )


def write_records(
    records: list[Record], *, checkpoint_id: str, parent_id: str | None, zstd_level: int
) -> bytes:
    """Serialise records as an Arrow IPC file of zstd-compressed record batches.

    Records are grouped into batches of about ``_BATCH_BYTES`` of payload: one batch per
    record would cost about a kilobyte of IPC framing each, more than most increments.
    """
    pa = _pyarrow()

    schema = _schema().with_metadata(
        {
            "hpcnas.format": str(FORMAT_VERSION),
            "hpcnas.checkpoint_id": checkpoint_id,
            "hpcnas.parent_id": parent_id or "",
        }
    )
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=zstd_level))
    sink = pa.BufferOutputStream()
    groups: list[list[Record]] = [[]]
    size = 0
    for r in records:
        if groups[-1] and size + len(r.payload) > _BATCH_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += len(r.payload)
    with pa.ipc.new_file(sink, schema, options=options) as writer:
        for group in groups:
            if not group:
                continue
            batch = pa.record_batch(
                [
                    pa.array([r.name for r in group], pa.string()),
                    pa.array([r.dtype for r in group], pa.string()),
                    pa.array([list(r.shape) for r in group], pa.list_(pa.int64())),
                    pa.array([r.shard for r in group], pa.int32()),
                    pa.array([r.offset for r in group], pa.int64()),
                    pa.array([r.count for r in group], pa.int64()),
                    pa.array([r.encoding for r in group], pa.string()),
                    pa.array([r.parent for r in group], pa.string()),
                    pa.array([r.payload for r in group], pa.large_binary()),
                    pa.array([r.checksum for r in group], pa.string()),
                    pa.array([r.value_checksum for r in group], pa.string()),
                ],
                schema=schema,
            )
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _check_schema(schema: Any) -> None:
    expected = _schema()
    for field in schema:
        meta = field.metadata or {}
        if any(k in meta for k in _EXTENSION_KEYS) or hasattr(field.type, "extension_name"):
            raise CheckpointFormatError(
                f"field {field.name!r} carries an Arrow extension type; refused."
            )
    if not schema.equals(expected, check_metadata=False):
        raise CheckpointFormatError(f"unexpected schema {schema}; refused.")
    meta = schema.metadata or {}
    version = meta.get(b"hpcnas.format")
    if version != str(FORMAT_VERSION).encode():
        raise CheckpointFormatError(f"unsupported format version {version!r}.")


def read_records(
    blob: bytes, *, expected_id: str | None = None
) -> tuple[dict[str, str], list[Record]]:
    """Parse and verify a checkpoint blob; refuses anything that is not exactly our format."""
    pa = _pyarrow()

    if len(blob) < 2 * len(_MAGIC) or not (blob.startswith(_MAGIC) and blob.endswith(_MAGIC)):
        raise CheckpointFormatError(
            f"not an Arrow IPC file (starts with {blob[:8]!r}); refused without parsing."
        )
    try:
        reader = pa.ipc.open_file(pa.BufferReader(blob))
        _check_schema(reader.schema)
        meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
        if expected_id is not None and meta.get("hpcnas.checkpoint_id") != expected_id:
            raise CheckpointFormatError(
                f"blob holds checkpoint {meta.get('hpcnas.checkpoint_id')!r}, "
                f"expected {expected_id!r}."
            )
        records = []
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            _check_schema(batch.schema)
            for row in batch.to_pylist():
                records.append(_record_from_row(row))
    except CheckpointFormatError:
        raise
    except (pa.ArrowException, ValueError, TypeError, KeyError) as e:
        raise CheckpointFormatError(f"unreadable Arrow checkpoint: {e}") from e
    return meta, records


def _record_from_row(row: dict[str, Any]) -> Record:
    encoding = row["encoding"]
    if encoding not in ENCODINGS:
        raise CheckpointFormatError(f"unknown encoding {encoding!r} in record {row['name']!r}.")
    storage_dtype(row["dtype"])
    record = Record(
        name=row["name"],
        dtype=row["dtype"],
        shape=tuple(int(s) for s in row["shape"]),
        shard=int(row["shard"]),
        offset=int(row["offset"]),
        count=int(row["count"]),
        encoding=encoding,
        parent=row["parent"],
        payload=row["payload"],
        checksum=row["checksum"],
        value_checksum=row["value_checksum"],
    )
    if checksum(record.payload) != record.checksum:
        raise CheckpointChecksumError(
            f"record {record.name!r} shard {record.shard}: payload checksum mismatch."
        )
    return record
