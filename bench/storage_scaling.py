"""Throughput of every Optuna storage with 1-16 worker processes, and what it means at 1,024
groups (issue 16).

Each worker process (multiprocessing spawn) opens the storage with ``open_storage`` and runs
ask/tell of a trivial objective (RandomSampler, one float) for ``--duration`` seconds after a
common start; trials/s counts every worker's trials, latencies are per call (the first trial of
each worker, which opens connections, is left out). Backends: PostgreSQL, MariaDB, the Redis
journal, the journal file, the gRPC proxy (over PostgreSQL unless ``--proxy-over sqlite``) and
SQLite for reference (one file, several writers: what the CLI warns about). The peer in the
same run is PostgreSQL (the recommended cluster default): every row prints its trials/s ratio.

The measured p50/p99 ask+tell latencies and the best trials/s per backend then go into
``bench/distributed_scheduler.py`` (the real scheduler on a simulated clock) to predict
utilisation at 1,024 evaluation groups per backend.

    python bench/storage_scaling.py [--workers 1 2 4 8 16] [--duration 4] [--json out.json]

On this machine (2 cores) clients and servers share the cores: the figures are CPU-bound
lower bounds of what a server on its own node does.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from pathlib import Path
import sys
import tempfile
import threading
import time
from typing import Any
import uuid

import numpy as np
import optuna

from optuna_hpcnas.storages import describe_storage
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.testing.storages import provision_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))

BACKENDS = ("postgresql", "mysql", "journal-redis", "journal-file", "grpc", "sqlite")


def _worker(
    url: str, study_name: str, duration: float, index: int, barrier: Any, out: Any
) -> None:
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(
            study_name=study_name,
            storage=open_storage(url),
            sampler=optuna.samplers.RandomSampler(seed=index),
        )
        dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
        barrier.wait()
        asks: list[float] = []
        tells: list[float] = []
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            trial = study.ask(dist)
            t1 = time.perf_counter()
            study.tell(trial, trial.params["x"])
            t2 = time.perf_counter()
            asks.append(t1 - t0)
            tells.append(t2 - t1)
        out.put((index, asks, tells, None))
    except BaseException as e:
        barrier.abort()
        out.put((index, [], [], f"{type(e).__name__}: {e}"))


def measure(url: str, n_workers: int, duration: float) -> dict[str, float]:
    study_name = f"scaling-{uuid.uuid4().hex[:8]}"
    optuna.create_study(storage=open_storage(url), study_name=study_name)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n_workers + 1, timeout=600)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, study_name, duration, i, barrier, out))
        for i in range(n_workers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    results = [out.get(timeout=duration + 600) for _ in procs]
    for p in procs:
        p.join()
    errors = [e for *_, e in results if e]
    if errors:
        raise RuntimeError(f"{describe_storage(url)} with {n_workers} workers: {errors[0]}")
    asks = np.concatenate([np.asarray(a[1:]) for _, a, _, _ in results])
    tells = np.concatenate([np.asarray(t[1:]) for _, _, t, _ in results])
    n_trials = sum(len(a) for _, a, _, _ in results)
    return {
        "trials_per_s": n_trials / duration,
        "trials": float(n_trials),
        "ask_p50": float(np.quantile(asks, 0.5)) if asks.size else float("nan"),
        "ask_p99": float(np.quantile(asks, 0.99)) if asks.size else float("nan"),
        "tell_p50": float(np.quantile(tells, 0.5)) if tells.size else float("nan"),
        "tell_p99": float(np.quantile(tells, 0.99)) if tells.size else float("nan"),
    }


def storage_figures(
    table: dict[str, dict[int, dict[str, float]]], top: int
) -> dict[str, dict[str, float]]:
    """What the scheduler simulation needs per backend, all from the most contended cell
    (``top`` workers): its ask/tell latencies, and its trials/s as the capacity (a
    conservative one: 1,024 groups contend more than ``top`` workers; the best rate at any
    worker count would credit a single client's speed)."""
    return {
        kind: {
            **{k: v for k, v in cells[top].items() if k.startswith(("ask", "tell"))},
            "capacity_trials_per_s": cells[top]["trials_per_s"],
            "workers": float(top),
        }
        for kind, cells in table.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--proxy-over", default="postgresql", choices=("postgresql", "sqlite"))
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--mean-duration", type=float, nargs="+", default=[10.0, 126.0])
    parser.add_argument("--seeds", type=int, default=1, help="simulation seeds per prediction")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    print(
        f"trivial objective, RandomSampler, {args.duration:g} s per cell, gRPC proxy over "
        f"{args.proxy_over}; {multiprocessing.cpu_count()} CPU cores shared by workers and "
        "servers (CPU-bound figures)\n"
    )
    header = (
        f"{'backend':<14} {'workers':>7} {'trials/s':>9} {'vs PG':>6} {'ask p50':>8} "
        f"{'ask p99':>8} {'tell p50':>8} {'tell p99':>8}"
    )
    print(header)
    print("-" * len(header))
    table: dict[str, dict[int, dict[str, float]]] = {}
    order = sorted(args.backends, key=lambda k: k != "postgresql")  # the peer first
    with tempfile.TemporaryDirectory() as workdir:
        for kind in order:
            table[kind] = {}
            for n in args.workers:
                # A fresh storage per cell: journals replay their whole log, so a study grown
                # by the previous cell would slow the next one down.
                with provision_backend(kind, workdir, proxy_over=args.proxy_over) as url:
                    m = measure(url, n, args.duration)
                table[kind][n] = m
                peer = table.get("postgresql", {}).get(n)
                ratio = f"{m['trials_per_s'] / peer['trials_per_s']:5.2f}x" if peer else "    -"
                print(
                    f"{kind:<14} {n:>7} {m['trials_per_s']:9.1f} {ratio:>6} "
                    f"{1e3 * m['ask_p50']:6.1f}ms {1e3 * m['ask_p99']:6.1f}ms "
                    f"{1e3 * m['tell_p50']:6.1f}ms {1e3 * m['tell_p99']:6.1f}ms",
                    flush=True,
                )
            print()

    top = max(args.workers)
    latency = storage_figures(table, top)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"latency": latency, "table": table}, indent=1, sort_keys=True)
        )
    from distributed_scheduler import predict_storage_utilisation
    from distributed_scheduler import print_storage_prediction

    print(f"Latencies measured with {top} workers fed into bench/distributed_scheduler.py:\n")
    for mean in args.mean_duration:
        rows = predict_storage_utilisation(
            latency, groups=args.groups, seeds=args.seeds, mean_duration=mean
        )
        print_storage_prediction(rows, groups=args.groups, mean=mean)
        print()


if __name__ == "__main__":
    main()
