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
        [--batch 64] [--mean-duration 0.1]

``--batch k`` measures one-shot mode's protocol instead (``[distributed] one_shot_batch``):
each worker reads the study once and writes ``k`` trials finished on a local in-memory copy
in one call; a trial's latencies are its share of the read and the write plus its local ask
and tell (measured once per worker: at 1,024 groups that work is on the groups' own nodes).

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
    url: str, study_name: str, duration: float, index: int, barrier: Any, out: Any, batch: int
) -> None:
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(
            study_name=study_name,
            storage=open_storage(url),
            sampler=optuna.samplers.RandomSampler(seed=index),
        )
        barrier.wait()
        run = _ask_and_tell if batch == 1 else _batched
        asks, tells = run(study, duration, batch, index)
        out.put((index, asks, tells, None))
    except BaseException as e:
        barrier.abort()
        out.put((index, [], [], f"{type(e).__name__}: {e}"))


_DISTRIBUTIONS = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def _ask_and_tell(
    study: optuna.Study, duration: float, batch: int, index: int
) -> tuple[list[float], list[float]]:
    """``study.ask`` / ``study.tell`` per trial: the latency of each."""
    asks: list[float] = []
    tells: list[float] = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        trial = study.ask(_DISTRIBUTIONS)
        t1 = time.perf_counter()
        study.tell(trial, trial.params["x"])
        t2 = time.perf_counter()
        asks.append(t1 - t0)
        tells.append(t2 - t1)
    return asks, tells


def _batched(
    study: optuna.Study, duration: float, batch: int, index: int
) -> tuple[list[float], list[float]]:
    """``hpcnas run``'s one-shot batches (``run._batches``) as the storage sees them: one read
    of the study, then one write of ``batch`` finished trials (``_records.PublishFinished``,
    new trials). The trials are asked and told once on a local in-memory copy before the
    clock starts and written again in every batch: at 1,024 groups that local work runs on
    each group's own node, so it is left out of the storage's capacity (here it would take
    the shared cores from the server). Each trial's latencies are its share of the batch's
    read (ask) and write (tell) plus the local ask and tell measured before."""
    from optuna_hpcnas._records import PublishFinished

    local = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=index))
    frozen = []
    t0 = time.perf_counter()
    for _ in range(batch):
        trial = local.ask(_DISTRIBUTIONS)
        local.tell(trial, trial.params["x"])
        frozen.append(local._storage.get_trial(trial._trial_id))
    local_s = (time.perf_counter() - t0) / batch / 2  # half an ask, half a tell
    asks: list[float] = []
    tells: list[float] = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        t1 = time.perf_counter()
        study.get_trials(deepcopy=False)  # the copy's read of what others wrote
        t2 = time.perf_counter()
        PublishFinished(study, frozen, claim=uuid.uuid4().hex, budget=False)()
        t3 = time.perf_counter()
        asks += [local_s + (t2 - t1) / batch] * batch
        tells += [local_s + (t3 - t2) / batch] * batch
    return asks, tells


def measure(url: str, n_workers: int, duration: float, batch: int = 1) -> dict[str, float]:
    study_name = f"scaling-{uuid.uuid4().hex[:8]}"
    optuna.create_study(storage=open_storage(url), study_name=study_name)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n_workers + 1, timeout=600)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, study_name, duration, i, barrier, out, batch))
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
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="trials per storage write: > 1 runs one-shot mode's batches (run._batches)",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    protocol = (
        "ask/tell per trial"
        if args.batch == 1
        else f"batches of {args.batch} (one read and one write of {args.batch} trials)"
    )
    print(
        f"trivial objective, RandomSampler, {protocol}, {args.duration:g} s per cell, gRPC "
        f"proxy over {args.proxy_over}; {multiprocessing.cpu_count()} CPU cores shared by "
        "workers and servers (CPU-bound figures)\n"
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
                    m = measure(url, n, args.duration, args.batch)
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
