"""Build the tabular NAS benchmark of ``preset("digits-small")``: train all 1,536 architectures.

Every architecture is trained once from scratch on scikit-learn's digits (fixed split and
seed, one thread) with ``optuna_hpcnas.evaluation.train_from_scratch`` on the training split
(``--steps`` optimisation steps of ``--batch-size`` images, Adam at ``--lr``); the table records
accuracy, log-loss, FLOPs, parameters and CPU latency. Rows are flushed to the Parquet file
every ``--flush`` architectures, so an interrupted run resumes where it stopped:

    nohup python bench/make_digits_table.py > bench/data/make_digits_table.log 2>&1 &

Several processes split the work with ``--shard i --num-shards n`` (each writes its own
``digits_small.shardI.parquet``); ``--merge`` then folds them into the table.

About 0.5-1 s per architecture on one core (102 steps of 32 images: 3 passes over the 1,078
training images), 15-25 minutes in all. The stored table was built with ``epochs = 3`` (the
same 102 steps); rows written since record ``steps`` and ``batch_size`` instead.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
import time
from typing import Any

DEFAULT_OUT = Path(__file__).parent / "data" / "digits_small.parquet"


def _write(rows: list[dict[str, Any]], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # every column any row has (rows of the epoch-era table have `epochs`, newer `steps`)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k) for k in columns} for r in rows]
    table = pa.Table.from_pylist(sorted(rows, key=lambda r: r["arch_index"]))
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, out)  # atomic: a kill never leaves a half-written table


def _row(space: Any, index: int, arch: Any, result: dict[str, Any], args: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"arch_index": index, "arch_json": arch.to_json()}
    params = space.to_params(arch)
    for name in space.distributions():
        value = params.get(name)
        row[name] = value
    row.update(
        valid_accuracy=float(result["valid_accuracy"]),
        valid_logloss=float(result["valid_loss"]),
        test_accuracy=float(result["test_accuracy"]),
        test_logloss=float(result["test_loss"]),
        flops=int(result["flops"]),
        params=int(result["params"]),
        latency_ms=float(result["latency_s"]) * 1000.0,
        train_seconds=float(result["train_seconds"]),
        steps=int(result["steps"]),
        batch_size=int(result["batch_size"]),
        lr=float(args.lr),
        seed=int(args.seed),
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--steps", type=int, default=None, help="default: 3 passes over the training split (102)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flush", type=int, default=16)
    parser.add_argument("--limit", type=int, default=None, help="train at most this many")
    parser.add_argument("--shard", type=int, default=0, help="this process's shard")
    parser.add_argument("--num-shards", type=int, default=1, help="processes sharing the work")
    parser.add_argument("--merge", action="store_true", help="merge shard files and exit")
    args = parser.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import pyarrow.parquet as pq
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.evaluation import train_from_scratch

    torch.set_num_threads(1)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    if args.steps is None:
        args.steps = 3 * math.ceil(data.sizes[0] / args.batch_size)
    archs = list(space.enumerate())
    shard_files = sorted(args.out.parent.glob(f"{args.out.stem}.shard*.parquet"))
    done = set()
    for path in [args.out, *shard_files]:
        if path.exists():
            done |= {r["arch_json"] for r in pq.read_table(path).to_pylist()}
    if args.merge:
        rows = [
            r for p in [args.out, *shard_files] if p.exists() for r in pq.read_table(p).to_pylist()
        ]
        unique = {r["arch_json"]: r for r in rows}
        _write(list(unique.values()), args.out)
        for path in shard_files:
            path.unlink()
        print(f"merged {len(unique)} rows into {args.out}")
        return
    out = args.out
    if args.num_shards > 1:
        out = args.out.with_name(f"{args.out.stem}.shard{args.shard}.parquet")
    rows = pq.read_table(out).to_pylist() if out.exists() else []
    todo = [
        (i, a)
        for i, a in enumerate(archs)
        if a.to_json() not in done and i % args.num_shards == args.shard
    ]
    if args.limit is not None:
        todo = todo[: args.limit]
    print(f"{len(done)} rows present, {len(todo)} to train -> {out}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    trained = 0
    for k, (index, arch) in enumerate(todo, 1):
        if arch.to_json() in done:
            continue  # another process trained it since we started
        result = train_from_scratch(
            space, arch, data, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
            seed=args.seed, latency_repeats=10, holdout=True,
        )  # fmt: skip
        rows.append(_row(space, index, arch, result, args))
        done.add(arch.to_json())
        trained += 1
        if trained % args.flush == 0 or k == len(todo):
            _write(rows, out)
            for path in args.out.parent.glob(f"{args.out.stem}.shard*.parquet"):
                if path != out:
                    done |= {r["arch_json"] for r in pq.read_table(path).to_pylist()}
            rate = (time.perf_counter() - start) / trained
            print(
                f"{len(rows)} rows here, {len(done)}/{len(archs)} done, {rate:.2f} s/arch",
                flush=True,
            )
    _write(rows, out)


if __name__ == "__main__":
    main()
