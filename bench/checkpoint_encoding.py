"""Encoding benchmark: one checkpoint's bytes and write/read speed, 1, 10 and 100 steps after
its parent, for a ~5M-parameter SuperNet trained on sklearn digits with single-path sampling.

Compared in the same run: ``torch.save`` of the full state (model + SGD momentum) in memory and
through Optuna's ``FileSystemArtifactStore``, and our incremental Arrow checkpoint (XOR of bit
patterns, byte shuffle, zstd through Arrow IPC) through the same ``FileSystemArtifactStore`` and
through ``RDBArtifactStore`` on SQLite. MB/s counts the logical state size. Reads of ours
replay the chain (full parent + increment). Last, the read of the newest checkpoint at the end
of a chain of 10 (a full one and 9 increments, 10 steps apart).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/checkpoint_encoding.py
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from typing import Any

from _checkpoint_common import DigitsSupernetTrainer
from _checkpoint_common import n_params
from _checkpoint_common import table
import optuna
from optuna.artifacts import FileSystemArtifactStore
import torch

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.checkpoints import CheckpointConfig
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import RDBArtifactStore
from optuna_hpcnas.checkpoints import training_state


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _best(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _measure_torch_save(
    d: int, tstate: dict[str, Any], fs: FileSystemArtifactStore, repeat: int
) -> list[list[Any]]:
    buf = io.BytesIO()
    torch.save(tstate, buf)
    size = buf.tell()
    blob = buf.getvalue()

    def write_fs() -> None:
        b = io.BytesIO()
        torch.save(tstate, b)
        b.seek(0)
        fs.write(f"ts-{d}", b)

    def read_fs() -> None:
        with fs.open_reader(f"ts-{d}") as f:
            torch.load(io.BytesIO(f.read()), weights_only=True)

    write_fs()
    return [
        [
            "torch.save (memory)",
            d,
            size,
            size,
            _best(lambda: torch.save(tstate, io.BytesIO()), repeat),
            _best(lambda: torch.load(io.BytesIO(blob), weights_only=True), repeat),
        ],
        [
            "torch.save -> FileSystemArtifactStore",
            d,
            size,
            size,
            _best(write_fs, repeat),
            _best(read_fs, repeat),
        ],
    ]


def _measure_ours(
    study: optuna.Study,
    store: Any,
    prefix: str,
    parent: tuple[dict[str, Any], dict[str, Any], Any],
    child: tuple[dict[str, Any], dict[str, Any]],
    d: int,
    repeat: int,
) -> tuple[int, float, float]:
    """Bytes and best write time of the increment ``d`` steps after a full parent, and best
    read time of the chain (parent + increment) by a fresh manager."""
    writes, size, namespace = [], 0, ""
    for i in range(repeat):
        namespace = f"{prefix}-{i}"
        m = CheckpointManager(
            study=study,
            artifact_store=store,
            namespace=namespace,
            config=CheckpointConfig(full_every=100, keep_chains=100),
        )
        m.save(parent[0], step=0, metadata=parent[1])
        t0 = time.perf_counter()
        info = m.save(child[0], step=d, metadata=child[1])
        writes.append(time.perf_counter() - t0)
        size = info.size

    def read() -> None:
        ckpt = CheckpointManager(study=study, artifact_store=store, namespace=namespace)
        loaded = ckpt.load_latest()
        assert loaded is not None and loaded.step == d

    return size, min(writes), _best(read, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="32,64,104", help="SuperNet widths (cifar-like)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="timings: best of N")
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    widths = tuple(int(w) for w in args.widths.split(","))
    space = HierarchicalSearchSpace.preset("cifar-like", widths=widths)
    trainer = DigitsSupernetTrainer(space)
    for _ in range(args.warmup):
        trainer.train_step()

    tmp = tempfile.mkdtemp()
    url = f"sqlite:///{os.path.join(tmp, 'study.db')}"
    study = optuna.create_study(storage=url)
    rdb = RDBArtifactStore(url)
    fs = FileSystemArtifactStore(os.path.join(tmp, "fs"))
    os.makedirs(os.path.join(tmp, "fs"), exist_ok=True)

    def capture() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        tensors, meta = training_state(trainer.net, trainer.opt)
        return _clone(tensors), meta, _clone(trainer.torch_state())

    chain = CheckpointManager(
        study=study, artifact_store=rdb, namespace="chain", config=CheckpointConfig(full_every=10)
    )
    parent = capture()
    chain.save(parent[0], step=0, metadata=parent[1])
    captured: dict[int, Any] = {}
    for step in range(1, 101):
        trainer.train_step()
        if step in (1, 10, 100):
            captured[step] = capture()
        if step % 10 == 0 and step < 100:
            t, m = training_state(trainer.net, trainer.opt)
            chain.save(t, step=step, metadata=m)
    logical = sum(v.numel() * v.element_size() for v in parent[0].values())
    mb = logical / 1e6

    rows = []
    for d, (tensors, meta, tstate) in captured.items():
        rows.extend(_measure_torch_save(d, tstate, fs, args.repeat))
        stores = (("ours -> FileSystemArtifactStore", fs), ("ours -> RDB (SQLite)", rdb))
        ts_bytes = rows[-1][2]
        for si, (label, store) in enumerate(stores):
            size, w, r = _measure_ours(
                study, store, f"d{d}-s{si}", parent, (tensors, meta), d, args.repeat
            )
            rows.append([label, d, size, ts_bytes, w, r])

    # Full checkpoint for reference.
    full_mgr = CheckpointManager(study=study, artifact_store=rdb, namespace="full")
    t0 = time.perf_counter()
    full = full_mgr.save(parent[0], step=0, metadata=parent[1])
    full_write = time.perf_counter() - t0
    buf = io.BytesIO()
    torch.save(parent[2], buf)

    def chain_read() -> None:
        ckpt = CheckpointManager(study=study, artifact_store=rdb, namespace="chain").load_latest()
        assert ckpt is not None and ckpt.info.depth == 9

    chain_s = _best(chain_read, args.repeat)
    cpu0 = time.process_time()
    chain_read()
    chain_cpu = time.process_time() - cpu0

    print(
        f"SuperNet cifar-like widths {widths} on digits: {n_params(trainer.net):,} parameters, "
        f"state {mb:.1f} MB (weights + momentum), single-path SGD; best of {args.repeat}"
    )
    out = [
        [
            "ours full -> RDB (SQLite)",
            "full",
            f"{full.size / 1e6:.2f}",
            f"{full.size / buf.tell():.3f}",
            f"{mb / full_write:.0f}",
            "-",
        ]
    ]
    for label, d, size, ts_bytes, w, r in rows:
        out.append(
            [
                label,
                d,
                f"{size / 1e6:.2f}",
                f"{size / ts_bytes:.3f}",
                f"{mb / w:.0f}",
                f"{mb / r:.0f}",
            ]
        )
    print(
        table(
            out,
            ["method", "steps after parent", "MB", "vs torch.save", "write MB/s", "read MB/s"],
        )
    )
    print(
        f"newest checkpoint at the end of a 10-link chain (RDB, SQLite): {chain_s:.2f} s wall, "
        f"{chain_cpu:.2f} s CPU (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
