"""Benchmark 2: the real scheduling code on a simulated clock, 1,024 evaluation groups.

Candidates have heavy-tailed evaluation times (log-normal; a second run with a Pareto tail);
the cost-aware scheduler sees a noisy prediction of each time (FLOPs predict run time only
roughly). Peers in the same run: static round-robin assignment (a fixed rank-to-candidate
mapping), dynamic pull (an idle group takes the next candidate at once: what ``run_search``
does), and dynamic pull with cost-aware pairing (largest predicted cost first).

    python bench/distributed_scheduler.py [--groups 1024] [--per-group 16] [--seeds 3]
    python bench/distributed_scheduler.py --storage-latency storage.json [--mean-duration 126]

With ``--storage-latency`` (the JSON ``bench/storage_scaling.py --json`` writes: per backend the
measured ask/tell latencies and the highest trials/s), it predicts utilisation at ``--groups``
per storage backend instead: the dynamic scheduler on the simulated clock with that backend's
ask + tell latency as the dispatch overhead, times the storage's throughput bound (a closed
system of G groups: at most C trials/s complete, so util <= C x (D + o) / G). The JSON holds,
per backend, ``ask_p50``, ``ask_p99``, ``tell_p50``, ``tell_p99`` (s) and
``capacity_trials_per_s``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _scheduler_simulation import RoundRobinScheduler
from _scheduler_simulation import simulate
import numpy as np

from optuna_hpcnas.distributed import DynamicScheduler
from optuna_hpcnas.distributed import Task


def durations(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "lognormal":
        return rng.lognormal(mean=0.0, sigma=1.0, size=n)
    return (rng.pareto(2.5, size=n) + 1.0) * 0.6  # Pareto, alpha 2.5, finite variance


def predict_storage_utilisation(
    latencies: dict[str, dict[str, float]],
    *,
    groups: int = 1024,
    per_group: int = 16,
    seeds: int = 3,
    mean_duration: float = 126.0,
) -> list[dict[str, float | str]]:
    """Predicted utilisation at ``groups`` per backend from measured storage latencies.

    ``latencies[backend]`` holds ``ask_p50``, ``tell_p50``, ``ask_p99``, ``tell_p99`` (seconds)
    and ``capacity_trials_per_s`` (the storage's trials/s under contention). Trial times are
    log-normal (sigma 1) scaled to ``mean_duration``.
    """
    rows: list[dict[str, float | str]] = []
    scale = mean_duration / float(np.exp(0.5))  # mean of lognormal(0, 1)
    n = groups * per_group
    for backend, lat in latencies.items():
        row: dict[str, float | str] = {"backend": backend}
        for q in ("p50", "p99"):
            overhead = float(lat[f"ask_{q}"] + lat[f"tell_{q}"])
            utils, steady = [], []
            for seed in range(seeds):
                rng = np.random.default_rng(seed)
                d = durations("lognormal", n, rng) * scale
                predicted = d * rng.lognormal(0.0, 0.3, size=n)
                tasks = [Task(key=i, cost=float(c)) for i, c in enumerate(predicted)]
                r = simulate(
                    DynamicScheduler(num_groups=groups), tasks, d, dispatch_overhead=overhead
                )
                utils.append(r.utilisation)
                steady.append(r.steady_utilisation)
            row[f"overhead_{q}"] = overhead
            row[f"util_{q}"] = float(np.mean(utils))
            row[f"steady_{q}"] = float(np.mean(steady))
        demand = groups / (mean_duration + float(row["overhead_p50"]))
        capacity = float(lat["capacity_trials_per_s"])
        row["demand"] = demand
        row["capacity"] = capacity
        row["bound"] = min(1.0, capacity / demand)
        row["predicted"] = float(row["steady_p50"]) * float(row["bound"])
        rows.append(row)
    return rows


def print_storage_prediction(
    rows: list[dict[str, float | str]], *, groups: int, mean: float
) -> None:
    print(
        f"Predicted utilisation at {groups} groups, mean trial {mean:g} s (log-normal), dynamic "
        "scheduler:"
    )
    header = (
        f"{'backend':<14} {'ask+tell p50':>12} {'p99':>8} {'util@p50':>8} {'steady@p50':>10} "
        f"{'steady@p99':>10} {'demand/s':>8} {'C trials/s':>10} {'bound':>6} {'predicted':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['backend']:<14} {1e3 * float(r['overhead_p50']):10.1f}ms "
            f"{1e3 * float(r['overhead_p99']):6.1f}ms {float(r['util_p50']):8.1%} "
            f"{float(r['steady_p50']):10.1%} {float(r['steady_p99']):10.1%} "
            f"{float(r['demand']):8.1f} {float(r['capacity']):10.1f} "
            f"{float(r['bound']):6.2f} {float(r['predicted']):9.1%}"
        )
    print(
        "util / steady @q = simulated with the ask+tell latency at quantile q as the per-trial "
        "dispatch cost (util includes the drain at the end of the budget, steady stops at the "
        "last dispatch: a search that keeps asking); demand = groups / (mean trial + overhead); "
        "C = the storage's trials/s measured under contention; bound = min(1, C / demand); "
        "predicted = steady@p50 "
        "x bound."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--per-group", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--overhead", type=float, default=0.01, help="ask+tell seconds per task")
    parser.add_argument(
        "--storage-latency",
        type=Path,
        default=None,
        help="JSON of bench/storage_scaling.py --json: predict utilisation per storage backend",
    )
    parser.add_argument(
        "--mean-duration",
        type=float,
        nargs="+",
        default=[10.0, 126.0],
        help="mean trial seconds for --storage-latency (126 s: the quick stage of the articles)",
    )
    args = parser.parse_args()
    if args.storage_latency is not None:
        latencies = json.loads(args.storage_latency.read_text())["latency"]
        for mean in args.mean_duration:
            rows = predict_storage_utilisation(
                latencies,
                groups=args.groups,
                per_group=args.per_group[0],
                seeds=args.seeds,
                mean_duration=mean,
            )
            print_storage_prediction(rows, groups=args.groups, mean=mean)
            print()
        return
    print(
        f"{args.groups} groups, dispatch overhead {args.overhead} s per candidate, "
        f"{args.seeds} seeds (mean); cost-aware sees a prediction with 30% log-normal error "
        f"and a window of 2 x groups waiting candidates\n"
    )
    header = (
        f"{'times':<10} {'per grp':>7} {'scheduler':<24} {'util':>6} {'steady':>6} "
        f"{'makespan':>8} {'p50 lat':>8} {'p99 lat':>8} {'max lat':>8}"
    )
    print(header)
    print("-" * len(header))
    for kind, per_group in [(k, p) for p in args.per_group for k in ("lognormal", "pareto")]:
        n = args.groups * per_group
        rows: dict[str, list[tuple[float, float, float, float, float]]] = {}
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            d = durations(kind, n, rng)
            predicted = d * rng.lognormal(0.0, 0.3, size=n)  # noisy cost prediction
            tasks = [Task(key=i, cost=float(c)) for i, c in enumerate(predicted)]
            schedulers = {
                "static round-robin": RoundRobinScheduler(num_groups=args.groups),
                "dynamic": DynamicScheduler(num_groups=args.groups),
                "dynamic + cost-aware": DynamicScheduler(
                    num_groups=args.groups, cost_aware=True, lookahead=2 * args.groups
                ),
            }
            for name, scheduler in schedulers.items():
                r = simulate(scheduler, tasks, d, dispatch_overhead=args.overhead)
                rows.setdefault(name, []).append(
                    (
                        r.utilisation,
                        r.steady_utilisation,
                        r.makespan,
                        r.latency_quantile(0.5),
                        r.latency_quantile(0.99),
                        float(r.latencies.max()),
                    )
                )
        means = {k: np.mean(np.array(v), axis=0) for k, v in rows.items()}
        for name, (u, st, m, p50, p99, mx) in means.items():
            print(
                f"{kind:<10} {per_group:>7} {name:<24} {u:6.1%} {st:6.1%} {m:8.2f} "
                f"{p50:8.2f} {p99:8.2f} {mx:8.2f}"
            )
        base = means["static round-robin"]
        for label, key in (("dynamic", "dynamic"), ("cost-aware", "dynamic + cost-aware")):
            r = means[key] / base
            print(
                f"{kind:<10} {per_group:>7} {'ratio ' + label + '/static':<24} {r[0]:5.2f}x "
                f"{r[1]:5.2f}x {r[2]:7.2f}x {r[3]:7.2f}x {r[4]:7.2f}x {r[5]:7.2f}x"
            )
        print()
    print(
        "util = busy group-seconds / (groups x makespan), drain at the end included; steady = "
        "the same up to the last dispatch (a search that keeps asking); latency = finish - "
        "submit (all submitted at t=0, so it includes queueing)."
    )


if __name__ == "__main__":
    main()
