"""Save and load chains of incremental checkpoints through an Optuna artifact store.

A checkpoint is one Arrow blob (see ``_format.py``) plus a manifest: a small JSON study system
attribute written *after* the blob, so a checkpoint exists for readers only once it is complete.
Every ``full_every``-th checkpoint of a chain is full; the others store only the tensors that
changed since their parent (XOR of bit patterns for floats, wrapping deltas for integers) and
reference the rest. Loading walks from the newest manifest back to its full checkpoint, verifies
every blob, replays the chain and checks each tensor's checksum; a broken checkpoint is skipped
with a warning that names it, and the next older one is tried.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
import contextlib
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
import hashlib
import io
import json
import logging
import math
import re
import time
from typing import Any
from typing import TYPE_CHECKING
import uuid
import warnings

import numpy as np

from optuna_hpcnas import _keys
from optuna_hpcnas._records import OPTUNA_ARTIFACTS_PREFIX
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.checkpoints._config import CheckpointConfig
from optuna_hpcnas.checkpoints._format import bits
from optuna_hpcnas.checkpoints._format import CheckpointFormatError
from optuna_hpcnas.checkpoints._format import checksum
from optuna_hpcnas.checkpoints._format import read_records
from optuna_hpcnas.checkpoints._format import Record
from optuna_hpcnas.checkpoints._format import shuffle
from optuna_hpcnas.checkpoints._format import storage_dtype
from optuna_hpcnas.checkpoints._format import unshuffle
from optuna_hpcnas.checkpoints._format import write_records

if TYPE_CHECKING:
    import optuna
    from optuna.artifacts._protocol import ArtifactStore

_logger = logging.getLogger(__name__)

# Optuna's own prefix for artifact metadata (optuna.artifacts._upload): registering our blobs
# under it makes them show up as study artifacts in optuna-dashboard.
_ARROW_MIMETYPE = "application/vnd.apache.arrow.file"
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_MAX_CHAIN = 100_000


class CheckpointError(RuntimeError):
    """A checkpoint cannot be loaded: missing link, bad checksum or refused format."""


class InvalidCheckpointWarning(UserWarning):
    """A checkpoint was skipped on load; the message names it and says why."""


@dataclass(frozen=True)
class CheckpointInfo:
    """The manifest of one stored checkpoint."""

    checkpoint_id: str
    namespace: str
    step: int
    kind: str
    parent_id: str | None
    depth: int
    artifact_id: str
    size: int
    sha256: str
    n_records: int
    n_changed: int
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CheckpointInfo:
        """Parse a manifest; ``ValueError`` / ``TypeError`` name the field that is wrong.

        Manifests are JSON in a shared study, so anything may be there (another version, a
        hand edit); a wrong-typed field must fail here and not later while sorting or loading.
        """
        try:
            data = json.loads(text)
        except RecursionError:  # json's decoder recurses once per nesting level
            raise ValueError("manifest is nested too deeply to be a manifest") from None
        if not isinstance(data, dict):
            raise TypeError(f"manifest is {type(data).__name__}, not a JSON object")
        missing = sorted(set(_MANIFEST_FIELDS) - set(data) - {"metadata"})
        if missing:
            raise KeyError(f"manifest lacks field(s) {', '.join(missing)}")
        unknown = sorted(set(data) - set(_MANIFEST_FIELDS))
        if unknown:
            raise KeyError(f"manifest has unknown field(s) {', '.join(unknown)}")
        for name, value in data.items():
            allowed = _MANIFEST_FIELDS[name]
            # bool is an int subclass in Python; a `true` step is as wrong as a string one.
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise TypeError(
                    f"manifest field {name!r} is {value!r}, but must be "
                    + " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
                )
            if name in _COUNTS and not 0 <= value <= _MAX_COUNT:  # type: ignore[operator]
                raise ValueError(
                    f"manifest field {name!r} is {value}, but must be in [0, {_MAX_COUNT}]"
                )
        if not math.isfinite(data["created_at"]):
            raise ValueError(f"manifest field 'created_at' is {data['created_at']}")
        return cls(**data)


# Fields that count something, and their largest value: a step is an optimizer step, so 10**12
# is beyond any run (a manifest claiming 10**30 steps is damage, not progress).
_COUNTS = ("step", "depth", "size", "n_records", "n_changed")
_MAX_COUNT = 10**12
# The JSON types each manifest field may take (``created_at`` may come back as an int).
_MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "checkpoint_id": (str,),
    "namespace": (str,),
    "step": (int,),
    "kind": (str,),
    "parent_id": (str, type(None)),
    "depth": (int,),
    "artifact_id": (str,),
    "size": (int,),
    "sha256": (str,),
    "n_records": (int,),
    "n_changed": (int,),
    "created_at": (float, int),
    "metadata": (dict,),
}


@dataclass
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    flat: np.ndarray


class Checkpoint:
    """A loaded checkpoint: its manifest and the reconstructed tensors."""

    def __init__(self, info: CheckpointInfo, entries: dict[str, _Entry]) -> None:
        self.info = info
        self._entries = entries

    @property
    def step(self) -> int:
        return self.info.step

    @property
    def metadata(self) -> dict[str, Any]:
        return self.info.metadata

    def names(self) -> list[str]:
        return list(self._entries)

    def array(self, name: str) -> np.ndarray:
        """A copy of one tensor as numpy (bfloat16 comes back as its uint16 bit pattern)."""
        e = self._entries[name]
        return e.flat.reshape(e.shape).copy()

    def state(self) -> dict[str, Any]:
        """Every tensor as saved: torch tensors for those given as torch, numpy otherwise."""
        out: dict[str, Any] = {}
        for name, e in self._entries.items():
            arr = e.flat.reshape(e.shape).copy()
            if e.dtype.startswith("torch:"):
                import torch

                t = torch.from_numpy(arr)
                if e.dtype == "torch:bfloat16":
                    t = t.view(torch.bfloat16)
                out[name] = t
            else:
                out[name] = arr
        return out

    def __repr__(self) -> str:
        return (
            f"Checkpoint(id={self.info.checkpoint_id!r}, step={self.step}, "
            f"kind={self.info.kind!r}, tensors={len(self._entries)})"
        )


def _as_entry(name: str, value: Any) -> _Entry:
    if not isinstance(name, str) or not name:
        raise TypeError(f"State keys must be non-empty strings, got {name!r}.")
    if hasattr(value, "detach") and type(value).__module__.startswith("torch"):
        import torch

        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy().view(np.uint16)
            dtype = "torch:bfloat16"
        else:
            arr = t.numpy()
            dtype = f"torch:{arr.dtype.name}"
    elif isinstance(value, np.ndarray | np.generic | int | float | bool):
        arr = np.asarray(value)
        dtype = arr.dtype.name
    else:
        raise TypeError(
            f"State value {name!r} is {type(value).__name__}, but must be a numpy array or a "
            "torch tensor (put other values in the JSON metadata)."
        )
    try:
        sdt = storage_dtype(dtype)
    except CheckpointFormatError as e:
        raise TypeError(f"State value {name!r}: {e}") from None
    shape = tuple(int(s) for s in arr.shape)
    flat = np.ascontiguousarray(arr.reshape(-1)).astype(sdt, copy=False)
    return _Entry(dtype=dtype, shape=shape, flat=flat)


class CheckpointManager:
    """Incremental, checksummed checkpoints of a training state, stored as Optuna artifacts.

    A state is a mapping ``name -> numpy array | torch tensor`` (a ``state_dict`` and the
    optimizer's tensors, RNG states as uint8 tensors) plus JSON metadata (step counters,
    sampler cursor, hyperparameters). Manifests live in the study's system attributes under
    ``hpcnas:checkpoints:manifest:<namespace>:<id>``; blobs go to ``artifact_store`` (ideally an
    :class:`RDBArtifactStore` on the study's own database) and are listed as study artifacts.

    The manager keeps a copy of the last saved or loaded state in memory to diff against, so
    one process should own one ``namespace`` (give each worker or rank its own).

    Args:
        study: The study the checkpoints belong to.
        artifact_store: Any Optuna artifact store.
        namespace: Name of this chain of checkpoints (``"supernet"``, ``"worker-3"``).
        config: Chain length (``full_every``), retention (``keep_chains``), zstd level and shard
            size come from here.

    Examples:
        .. code-block:: python

            manager = CheckpointManager(study=study, artifact_store=store)
            manager.save({"w": weights}, step=100, metadata={"epoch": 1})
            latest = manager.load_latest()  # newest valid checkpoint, or None
    """

    def __init__(
        self,
        *,
        study: optuna.Study,
        artifact_store: ArtifactStore,
        namespace: str = "supernet",
        config: CheckpointConfig | None = None,
    ) -> None:
        import optuna

        if not isinstance(study, optuna.Study):
            raise TypeError(f"`study` is {study!r}, but must be an optuna.Study.")
        for method in ("open_reader", "write", "remove"):
            if not callable(getattr(artifact_store, method, None)):
                raise TypeError(
                    f"`artifact_store` is {artifact_store!r}, but has no `{method}` method."
                )
        if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
            raise ValueError(
                f"`namespace` is {namespace!r}, but must match {_NAMESPACE_RE.pattern}."
            )
        if config is None:
            config = CheckpointConfig()
        if not isinstance(config, CheckpointConfig):
            raise TypeError(f"`config` is {config!r}, but must be a CheckpointConfig.")
        self._study = study
        self._store = artifact_store
        self._namespace = namespace
        self._config = config
        self._parent: CheckpointInfo | None = None
        self._parent_state: dict[str, _Entry] = {}

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def config(self) -> CheckpointConfig:
        return self._config

    @property
    def _prefix(self) -> str:
        return f"{_keys.CHECKPOINT_MANIFEST_PREFIX}{self._namespace}:"

    # ------------------------------------------------------------------ save

    def maybe_save(
        self,
        step: int,
        state_fn: Callable[[], tuple[Mapping[str, Any], Mapping[str, Any]]],
    ) -> CheckpointInfo | None:
        """Save ``state_fn()`` (``(tensors, metadata)``) if ``step`` is a multiple of N."""
        if step % self._config.every_n_steps != 0:
            return None
        tensors, metadata = state_fn()
        return self.save(tensors, step=step, metadata=metadata)

    def save(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        metadata: Mapping[str, Any] | None = None,
        full: bool | None = None,
    ) -> CheckpointInfo:
        """Write one checkpoint and return its manifest.

        Args:
            state: ``name -> numpy array | torch tensor``.
            step: Training step (orders checkpoints; resumed runs continue from it).
            metadata: JSON-serialisable extras stored in the manifest.
            full: Force a full (``True``) or incremental (``False``) checkpoint; by default
                every ``full_every``-th checkpoint of a chain is full.
        """
        check_int("step", step, 0)
        if not isinstance(state, Mapping):
            raise TypeError(f"`state` is {type(state).__name__}, but must be a mapping.")
        meta = dict(metadata or {})
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise TypeError(f"`metadata` must be JSON-serialisable: {e}") from None

        entries = {name: _as_entry(name, value) for name, value in state.items()}
        parent = self._parent
        if full is None:
            full = parent is None or parent.depth + 1 >= self._config.full_every
        elif not full and parent is None:
            raise ValueError("`full` is False, but there is no parent checkpoint to diff against.")
        parent_state = {} if full else self._parent_state
        checkpoint_id = f"{self._namespace}.{int(step):010d}.{uuid.uuid4().hex[:12]}"
        parent_id = None if full or parent is None else parent.checkpoint_id

        records, new_state, n_changed = self._diff(entries, parent_state, parent_id)
        blob = write_records(
            records,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            zstd_level=self._config.zstd_level,
        )
        info = CheckpointInfo(
            checkpoint_id=checkpoint_id,
            namespace=self._namespace,
            step=int(step),
            kind="full" if full else "incremental",
            parent_id=parent_id,
            depth=0 if full or parent is None else parent.depth + 1,
            artifact_id=str(uuid.uuid4()),
            size=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
            n_records=len(records),
            n_changed=n_changed,
            created_at=time.time(),
            metadata=meta,
        )
        self._publish(info, blob)
        self._parent = info
        self._parent_state = new_state
        _logger.debug(
            "Saved %s checkpoint %s (%d bytes, %d/%d tensors changed).",
            info.kind,
            checkpoint_id,
            info.size,
            n_changed,
            len(entries),
        )
        if full:
            self.prune()
        return info

    def _diff(
        self,
        entries: Mapping[str, _Entry],
        parent_state: Mapping[str, _Entry],
        parent_id: str | None,
    ) -> tuple[list[Record], dict[str, _Entry], int]:
        """The records of ``entries`` against the parent's state, the new diff base and the
        number of tensors that changed."""
        records: list[Record] = []
        new_state: dict[str, _Entry] = {}
        n_changed = 0
        for name, entry in entries.items():
            base = parent_state.get(name)
            if base is not None and (base.dtype != entry.dtype or base.shape != entry.shape):
                base = None
            name_changed = False
            for shard, (offset, count) in enumerate(self._shards(entry)):
                cur = entry.flat[offset : offset + count]
                prev = None if base is None else base.flat[offset : offset + count]
                record = self._encode(name, entry, shard, offset, cur, prev, parent_id)
                name_changed |= record.encoding != "ref"
                records.append(record)
            if name_changed:
                n_changed += 1
                new_state[name] = _Entry(entry.dtype, entry.shape, entry.flat.copy())
            else:
                assert base is not None
                new_state[name] = base
        return records, new_state, n_changed

    def _publish(self, info: CheckpointInfo, blob: bytes) -> None:
        """Write the blob, list it as an Optuna artifact of the study, then the manifest."""
        self._store.write(info.artifact_id, io.BytesIO(blob))
        storage = self._study._storage
        study_id = self._study._study_id
        artifact_meta = {
            "artifact_id": info.artifact_id,
            "filename": f"{info.checkpoint_id}.arrow",
            "mimetype": _ARROW_MIMETYPE,
            "encoding": None,
        }
        try:
            storage.set_study_system_attr(
                study_id, OPTUNA_ARTIFACTS_PREFIX + info.artifact_id, json.dumps(artifact_meta)
            )
            # The manifest goes last: until it exists, the checkpoint does not.
            storage.set_study_system_attr(
                study_id, self._prefix + info.checkpoint_id, info.to_json()
            )
        except BaseException:
            # no blob without its manifest (a full database, a signal): remove it again
            with contextlib.suppress(Exception):
                self._store.remove(info.artifact_id)
            raise

    def _shards(self, entry: _Entry) -> list[tuple[int, int]]:
        n = entry.flat.size
        per = max(1, self._config.shard_bytes // max(1, entry.flat.dtype.itemsize))
        if n == 0:
            return [(0, 0)]
        return [(offset, min(per, n - offset)) for offset in range(0, n, per)]

    @staticmethod
    def _encode(
        name: str,
        entry: _Entry,
        shard: int,
        offset: int,
        cur: np.ndarray,
        prev: np.ndarray | None,
        parent_id: str | None,
    ) -> Record:
        value_checksum = checksum(cur)
        if prev is None:
            encoding, payload_arr = "raw", cur
        elif np.array_equal(bits(cur), bits(prev)):
            encoding, payload_arr = "ref", None
        elif cur.dtype.kind in "iu":
            # Wrapping integer difference: lossless, and small counters give small deltas.
            encoding, payload_arr = "delta", (bits(cur) - bits(prev)).view(cur.dtype)
        else:
            # Floats: XOR of bit patterns is lossless; unchanged high bytes become zeros.
            encoding, payload_arr = "xor", (bits(cur) ^ bits(prev)).view(cur.dtype)
        payload = b"" if payload_arr is None else shuffle(payload_arr)
        return Record(
            name=name,
            dtype=entry.dtype,
            shape=entry.shape,
            shard=shard,
            offset=offset,
            count=int(cur.size),
            encoding=encoding,
            parent=None if encoding == "raw" else parent_id,
            payload=payload,
            checksum=checksum(payload),
            value_checksum=value_checksum,
        )

    # ------------------------------------------------------------------ list / load

    def list_checkpoints(self) -> list[CheckpointInfo]:
        """Manifests of this namespace, oldest first (by step, then creation time)."""
        attrs = self._study._storage.get_study_system_attrs(self._study._study_id)
        infos = []
        for key, value in attrs.items():
            if not key.startswith(self._prefix) or value in (None, "null"):
                continue
            try:
                infos.append(CheckpointInfo.from_json(value))
            except (TypeError, ValueError, KeyError) as e:
                name = key[len(self._prefix) :]
                message = f"Checkpoint {name!r} has an unreadable manifest and was skipped: {e}"
                _logger.warning(message)
                warnings.warn(message, InvalidCheckpointWarning, stacklevel=2)
        infos.sort(key=lambda i: (i.step, i.created_at))
        return infos

    def load(self, checkpoint_id: str) -> Checkpoint:
        """Load one checkpoint; raises :class:`CheckpointError` if it or its chain is broken."""
        manifests = {i.checkpoint_id: i for i in self.list_checkpoints()}
        return self._load(checkpoint_id, manifests)

    def load_latest(
        self, accept: Callable[[Checkpoint], object] | None = None
    ) -> Checkpoint | None:
        """The newest checkpoint that loads and verifies, or ``None`` if there is none.

        Broken checkpoints are skipped with an :class:`InvalidCheckpointWarning` naming them.
        ``accept(checkpoint)`` (e.g. restoring it into a model) may raise
        :class:`CheckpointError` for one whose content does not fit: it is skipped the same way
        and the next older one is tried. The loaded state becomes the parent of the next
        incremental save.
        """
        infos = self.list_checkpoints()
        manifests = {i.checkpoint_id: i for i in infos}
        for info in reversed(infos):
            try:
                ckpt = self._load(info.checkpoint_id, manifests)
                if accept is not None:
                    accept(ckpt)
            except CheckpointError as e:
                message = (
                    f"Checkpoint {info.checkpoint_id!r} (step {info.step}) is invalid and was "
                    f"skipped: {e}"
                )
                _logger.warning(message)
                warnings.warn(message, InvalidCheckpointWarning, stacklevel=2)
                continue
            self._parent = info
            self._parent_state = {
                n: _Entry(e.dtype, e.shape, e.flat.copy()) for n, e in ckpt._entries.items()
            }
            return ckpt
        return None

    def _read_blob(self, info: CheckpointInfo) -> bytes:
        from optuna.artifacts.exceptions import ArtifactNotFound

        # A store that verifies its own SHA-256 while reading (RDBArtifactStore) spares us a
        # second pass over the bytes when its digest is the manifest's.
        stored_digest = getattr(self._store, "sha256", None)
        self_verifying = callable(stored_digest) and stored_digest(info.artifact_id) == info.sha256
        try:
            with self._store.open_reader(info.artifact_id) as f:
                blob = f.read()
        except ArtifactNotFound as e:
            raise CheckpointError(
                f"blob {info.artifact_id!r} of checkpoint {info.checkpoint_id!r} is missing"
            ) from e
        except OSError as e:
            raise CheckpointError(
                f"blob of checkpoint {info.checkpoint_id!r} is unreadable: {e}"
            ) from e
        if len(blob) != info.size or (
            not self_verifying and hashlib.sha256(blob).hexdigest() != info.sha256
        ):
            raise CheckpointError(
                f"blob of checkpoint {info.checkpoint_id!r} fails its checksum "
                f"({len(blob)} bytes, expected {info.size})"
            )
        return blob

    def _load(self, checkpoint_id: str, manifests: dict[str, CheckpointInfo]) -> Checkpoint:
        if checkpoint_id not in manifests:
            raise CheckpointError(f"no manifest for checkpoint {checkpoint_id!r}")
        chain = [manifests[checkpoint_id]]
        while chain[-1].parent_id is not None:
            parent_id = chain[-1].parent_id
            if parent_id not in manifests:
                raise CheckpointError(
                    f"chain broken: checkpoint {chain[-1].checkpoint_id!r} needs parent "
                    f"{parent_id!r}, which is missing"
                )
            chain.append(manifests[parent_id])
            if len(chain) > _MAX_CHAIN:
                raise CheckpointError(f"chain of {checkpoint_id!r} does not end (cycle?)")
        chain.reverse()

        state: dict[str, _Entry] = {}
        records: list[Record] = []
        for info in chain:
            blob = self._read_blob(info)
            try:
                _, records = read_records(blob, expected_id=info.checkpoint_id)
            except CheckpointFormatError as e:
                raise CheckpointError(f"checkpoint {info.checkpoint_id!r}: {e}") from e
            state = self._apply(info, records, state)
        target = chain[-1]
        for r in records:
            flat = state[r.name].flat[r.offset : r.offset + r.count]
            if checksum(flat) != r.value_checksum:
                raise CheckpointError(
                    f"checkpoint {target.checkpoint_id!r}: tensor {r.name!r} shard {r.shard} "
                    "does not match its checksum after replaying the chain"
                )
        return Checkpoint(target, state)

    @staticmethod
    def _apply(
        info: CheckpointInfo, records: list[Record], prev_state: dict[str, _Entry]
    ) -> dict[str, _Entry]:
        by_name: dict[str, list[Record]] = {}
        for r in records:
            by_name.setdefault(r.name, []).append(r)
        state: dict[str, _Entry] = {}
        for name, shards in by_name.items():
            shards.sort(key=lambda r: r.shard)
            first = shards[0]
            sdt = storage_dtype(first.dtype)
            total = int(np.prod(first.shape, dtype=np.int64))
            prev = prev_state.get(name)
            needs_parent = any(r.encoding != "raw" for r in shards)
            if needs_parent:
                if any(r.parent != info.parent_id for r in shards if r.encoding != "raw"):
                    raise CheckpointError(
                        f"checkpoint {info.checkpoint_id!r}: record {name!r} refers to a "
                        "different parent than its manifest"
                    )
                if prev is None or prev.dtype != first.dtype or prev.shape != first.shape:
                    raise CheckpointError(
                        f"checkpoint {info.checkpoint_id!r}: tensor {name!r} refers to its "
                        f"parent {info.parent_id!r}, which does not hold it"
                    )
            if all(r.encoding == "ref" for r in shards):
                assert prev is not None
                state[name] = prev
                continue
            flat = np.empty(total, dtype=sdt)
            covered = 0
            for r in shards:
                if r.offset != covered or r.offset + r.count > total:
                    raise CheckpointError(
                        f"checkpoint {info.checkpoint_id!r}: shards of {name!r} do not tile it"
                    )
                covered += r.count
                part = flat[r.offset : r.offset + r.count]
                if r.encoding == "ref":
                    assert prev is not None
                    part[...] = prev.flat[r.offset : r.offset + r.count]
                    continue
                try:
                    decoded = unshuffle(r.payload, sdt, r.count)
                except CheckpointFormatError as e:
                    raise CheckpointError(f"checkpoint {info.checkpoint_id!r}: {e}") from e
                if r.encoding == "raw":
                    part[...] = decoded
                else:
                    assert prev is not None
                    old = bits(prev.flat[r.offset : r.offset + r.count])
                    new = bits(decoded)
                    if r.encoding == "xor":
                        part[...] = (old ^ new).view(sdt)
                    else:
                        part[...] = (old + new).view(sdt)
            if covered != total:
                raise CheckpointError(
                    f"checkpoint {info.checkpoint_id!r}: shards of {name!r} do not tile it"
                )
            state[name] = _Entry(first.dtype, first.shape, flat)
        return state

    # ------------------------------------------------------------------ retention

    def remove_all(self) -> list[str]:
        """Remove every checkpoint of this namespace (newest first); returns their ids."""
        infos = self.list_checkpoints()
        self._remove(infos)
        self._parent = None
        self._parent_state = {}
        return [i.checkpoint_id for i in infos]

    def _remove(self, infos: list[CheckpointInfo]) -> None:
        from optuna.artifacts.exceptions import ArtifactNotFound

        storage = self._study._storage
        study_id = self._study._study_id
        # Newest first, so a crash half-way never leaves a child without its parent.
        for info in sorted(infos, key=lambda i: (i.step, i.created_at), reverse=True):
            storage.set_study_system_attr(
                study_id, self._prefix + info.checkpoint_id, json.dumps(None)
            )
            storage.set_study_system_attr(
                study_id, OPTUNA_ARTIFACTS_PREFIX + info.artifact_id, json.dumps(None)
            )
            try:
                self._store.remove(info.artifact_id)
            except ArtifactNotFound:
                pass

    def prune(self) -> list[str]:
        """Remove chains older than the newest ``keep_chains``; returns removed checkpoint ids.

        A chain is a full checkpoint and every checkpoint that descends from it.
        """
        infos = self.list_checkpoints()
        by_id = {i.checkpoint_id: i for i in infos}

        def root(info: CheckpointInfo) -> str:
            seen = 0
            while info.parent_id is not None and info.parent_id in by_id and seen < _MAX_CHAIN:
                info = by_id[info.parent_id]
                seen += 1
            return info.checkpoint_id

        roots: dict[str, list[CheckpointInfo]] = {}
        for info in infos:
            roots.setdefault(root(info), []).append(info)
        ordered = sorted(roots, key=lambda r: max((i.step, i.created_at) for i in roots[r]))
        doomed = ordered[: max(0, len(ordered) - self._config.keep_chains)]
        if self._parent is not None and root(self._parent) in doomed:
            doomed.remove(root(self._parent))
        removed: list[str] = []
        for r in doomed:
            self._remove(roots[r])
            removed.extend(i.checkpoint_id for i in roots[r])
        if removed:
            _logger.debug("Retention removed %d checkpoints of %s.", len(removed), self._namespace)
        return removed
