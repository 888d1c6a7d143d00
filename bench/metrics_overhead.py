"""Cost of the Prometheus instrumentation on a search, against the same search without it.

A trivial objective on in-memory storage makes the per-trial overhead visible (a real
evaluation takes seconds to minutes). Peers, same run: plain ``study.optimize``; with
``TimedSampler`` + ``MetricsCallback`` (storage re-read every 5 s, as by default, and after
every trial); the same in multiprocess mode (values in mmap files, as under MPI); and one
``/metrics`` scrape of the result.

    python bench/metrics_overhead.py [--trials 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import optuna


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -1, 1)
    y = trial.suggest_categorical("y", ["a", "b", "c"])
    return x * x + (y == "b")


def _run(n: int, mode: str) -> float:
    from optuna_hpcnas.metrics import MetricsCallback
    from optuna_hpcnas.metrics import SearchMetrics
    from optuna_hpcnas.metrics import TimedSampler

    sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=0)
    callbacks = []
    if mode != "plain":
        metrics = SearchMetrics()
        sampler = TimedSampler(sampler, metrics=metrics)
        refresh = 0.0 if mode == "refresh-every-trial" else 5.0
        callbacks.append(MetricsCallback(metrics, n_trials=n, refresh_seconds=refresh))
    study = optuna.create_study(sampler=sampler)
    start = time.perf_counter()
    study.optimize(_objective, n_trials=n, callbacks=callbacks)
    return (time.perf_counter() - start) / n * 1e3


def _multiprocess(trials: int, repeats: int) -> dict[str, float]:
    """Multiprocess mode (what MPI ranks use: values in mmap files), in this process, which
    must not have imported prometheus_client yet: the ms per trial and one scrape."""
    from optuna_hpcnas.metrics import enable_multiprocess
    from optuna_hpcnas.metrics import SearchMetrics
    from optuna_hpcnas.metrics import serve_metrics

    with tempfile.TemporaryDirectory() as d:
        enable_multiprocess(d)
        ms = statistics.median(_run(trials, "metrics") for _ in range(repeats))
        with serve_metrics(SearchMetrics(), port=0) as server:
            start = time.perf_counter()
            for _ in range(20):
                with urllib.request.urlopen(server.url) as r:
                    size = len(r.read())
            scrape_ms = (time.perf_counter() - start) / 20 * 1e3
    return {"ms": ms, "scrape_ms": scrape_ms, "size": size}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--multiprocess-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.multiprocess_only:
        print(json.dumps(_multiprocess(args.trials, args.repeats)))
        return
    modes = ["plain", "metrics", "refresh-every-trial"]
    rows = {m: statistics.median(_run(args.trials, m) for _ in range(args.repeats)) for m in modes}
    # multiprocess mode is chosen before prometheus_client's first import: a fresh process
    command = [sys.executable, __file__, "--multiprocess-only"]
    command += ["--trials", str(args.trials), "--repeats", str(args.repeats)]
    child = subprocess.run(command, capture_output=True, text=True, check=True)
    multiprocess = json.loads(child.stdout.strip().splitlines()[-1])
    rows["metrics, multiprocess files"] = multiprocess["ms"]

    base = rows["plain"]
    print(
        f"{args.trials} trials x {args.repeats} repeats, median ms per trial (in-memory storage)"
    )
    print(f"{'mode':32s} {'ms/trial':>9s} {'ratio':>7s} {'overhead ms':>12s}")
    for mode, ms in rows.items():
        print(f"{mode:32s} {ms:9.3f} {ms / base:7.2f} {ms - base:12.3f}")
    size, scrape_ms = multiprocess["size"], multiprocess["scrape_ms"]
    print(f"one /metrics scrape (multiprocess, {size:.0f} bytes): {scrape_ms:.2f} ms")


if __name__ == "__main__":
    main()
