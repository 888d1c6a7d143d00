"""EvolutionarySampler against Optuna's samplers on the digits-small tabular NAS benchmark.

Prints four tables (markdown): mean regret with 95% intervals after 50/100/200 trials without
and with a FLOPs budget, two-objective hypervolume (log-loss vs FLOPs), and ms per ask at 200
and 5,000 trials. Objective: validation log-loss (minimised). Regret: best-so-far log-loss
minus the table's best (x100), and the test accuracy (points) the incumbent misses.

    python bench/evolution_vs_peers.py                     # the real table, 30 seeds
    python bench/evolution_vs_peers.py --synthetic --seeds 5 --gp-seeds 2
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
import math
import multiprocessing
import os
from pathlib import Path
import sys
import time
from typing import Any
import warnings

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).parent))

from nas_table import DIGITS_TABLE
from nas_table import HypervolumeScale
from nas_table import load_table
from nas_table import mean_ci
from nas_table import ms_per_ask
from nas_table import ms_per_ask_on_space
from nas_table import NASTable
from nas_table import regret_curve
from nas_table import run_multi
from nas_table import run_single
from nas_table import synthetic_table

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import EvolutionarySampler

CHECKPOINTS = (50, 100, 200)
SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "Evolution": lambda s: EvolutionarySampler(seed=s),
    "Random": lambda s: optuna.samplers.RandomSampler(seed=s),
    "TPE (multivariate)": lambda s: optuna.samplers.TPESampler(
        multivariate=True, group=True, seed=s
    ),
    "NSGA-II": lambda s: optuna.samplers.NSGAIISampler(seed=s),
    "GP": lambda s: optuna.samplers.GPSampler(seed=s, warn_independent_sampling=False),
}
MO_SAMPLERS = ("Evolution", "NSGA-II", "TPE (multivariate)", "Random")

_TABLE: NASTable | None = None  # set before the worker pool forks


def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")


def _task(args: tuple[str, str, int, int, float | None]) -> tuple[Any, ...]:
    _quiet()
    setting, name, seed, n_trials, budget = args
    assert _TABLE is not None
    sampler = SAMPLERS[name](seed)
    if setting == "multi":
        run = run_multi(_TABLE, sampler, n_trials)
        scale = HypervolumeScale(_TABLE)
        return setting, name, seed, [scale.ratio(run, n) for n in CHECKPOINTS], run.seconds
    run = run_single(_TABLE, sampler, n_trials, flops_budget=budget)
    regret, test_regret = regret_curve(_TABLE, run, flops_budget=budget)
    picks = [(float(regret[n - 1]), float(test_regret[n - 1])) for n in CHECKPOINTS]
    return setting, name, seed, picks, run.seconds


def load_stored(path: Path | str) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
    """The runs and the ``ask...`` figures of a stored ``--out`` file."""
    stored = json.loads(Path(path).read_text())
    asks = {k: v for k, v in stored.items() if k.startswith("ask")}
    return [tuple(r) for r in stored["runs"]], asks


def picks_by_cell(results: list[tuple[Any, ...]]) -> dict[tuple[str, str], list[Any]]:
    """Checkpoint picks of each run, keyed by (setting, sampler)."""
    by: dict[tuple[str, str], list[Any]] = {}
    for setting, name, _seed, picks, _secs in results:
        by.setdefault((setting, name), []).append(picks)
    return by


def ask_groups(summary: dict[str, Any]) -> dict[str, dict[str, dict[int, float]]]:
    """ms per ask as {group: {sampler: {finished trials: ms}}} ("ask", "ask-<space>")."""
    groups: dict[str, dict[str, dict[int, float]]] = {}
    for key, ms in summary.items():
        if not key.startswith("ask"):
            continue
        group, rest = key.split("/", 1)
        name, n = rest.rsplit("@", 1)
        groups.setdefault(group, {}).setdefault(name, {})[int(n)] = ms
    return groups


def _fmt(samples: list[float], scale: float = 1.0) -> str:
    mean, half = mean_ci([scale * s for s in samples])
    return f"{mean:.2f} ± {half:.2f}"


def _print_tables(results: list[tuple[Any, ...]], budget: float) -> None:
    by = picks_by_cell(results)

    for setting, title in (("plain", "no budget"), ("budget", f"FLOPs <= {budget:.3g}")):
        if not any(key[0] == setting for key in by):
            continue
        print(f"## Regret, {title} (log-loss x100, mean ± 95% CI; test-accuracy points)\n")
        head = " | ".join(f"@{n} log-loss" for n in CHECKPOINTS)
        print(f"| sampler | seeds | {head} | @100 test acc | @200 test acc | vs Evo @200 |")
        print("|---|---|" + "---|" * (len(CHECKPOINTS) + 3))
        evo = by.get((setting, "Evolution"))
        evo200 = float(np.mean([p[2][0] for p in evo])) if evo else math.nan
        for name in SAMPLERS:
            picks = by.get((setting, name))
            if not picks:
                continue
            cells = [_fmt([p[k][0] for p in picks], 100.0) for k in range(len(CHECKPOINTS))]
            tests = [_fmt([p[k][1] for p in picks], 100.0) for k in (1, 2)]
            mean200 = float(np.mean([p[2][0] for p in picks]))
            ratio = f"{mean200 / evo200:.2f}x" if evo200 > 0 else "-"
            print(f"| {name} | {len(picks)} | {' | '.join(cells + tests)} | {ratio} |")
        print()

    if any(key[0] == "multi" for key in by):
        print(
            "## Two objectives (log-loss, FLOPs): hypervolume regret, % of the table front's"
            " hypervolume (lower is better; mean ± 95% CI)\n"
        )
        print(
            "| sampler | seeds | " + " | ".join(f"@{n}" for n in CHECKPOINTS) + " | vs Evo @200 |"
        )
        print("|---|---|" + "---|" * (len(CHECKPOINTS) + 1))
        evo = by.get(("multi", "Evolution"))
        evo200 = float(np.mean([1 - p[2] for p in evo])) if evo else math.nan
        for name in MO_SAMPLERS:
            picks = by.get(("multi", name))
            if not picks:
                continue
            cells = [_fmt([100 * (1 - p[k]) for p in picks]) for k in range(len(CHECKPOINTS))]
            mean200 = float(np.mean([1 - p[2] for p in picks]))
            ratio = f"{mean200 / evo200:.2f}x" if evo200 > 0 else "-"
            print(f"| {name} | {len(picks)} | {' | '.join(cells)} | {ratio} |")
        print()


def main() -> None:
    global _TABLE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=DIGITS_TABLE)
    parser.add_argument("--synthetic", action="store_true", help="use a synthetic table")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--gp-seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--asks", type=int, default=30, help="timed asks per cell (GP: 3)")
    parser.add_argument("--trials", type=int, default=max(CHECKPOINTS))
    parser.add_argument("--budget-quantile", type=float, default=0.3)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--ask-trials", type=int, nargs="*", default=[200, 1000, 5000])
    parser.add_argument("--ask-skip", nargs="*", default=["GP@5000"], help="sampler@n to skip")
    parser.add_argument("--large-space", default="cifar-like", help="'' to skip")
    parser.add_argument("--only", nargs="*", default=None, help="plain, budget and/or multi")
    parser.add_argument("--samplers", nargs="*", default=None, help="sampler names to run")
    parser.add_argument("--merge", nargs="*", default=[], help="earlier --out files to add")
    parser.add_argument("--out", type=Path, default=Path("bench/results/evolution_vs_peers.json"))
    args = parser.parse_args()
    _quiet()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    _TABLE = synthetic_table() if args.synthetic else load_table(args.table)
    table = _TABLE
    flops = table.column("flops")
    budget = float(np.quantile(flops, args.budget_quantile))
    best, best_b = table.best(), table.best(flops_budget=budget)
    print(
        f"# Table {table.name}: {len(table.rows)} architectures; objective valid"
        f" log-loss, best {best['valid_logloss']:.4f} (test acc {best['test_accuracy']:.4f},"
        f" {best['flops']:.3g} FLOPs)"
    )
    print(
        f"# FLOPs budget {budget:.3g} (quantile {args.budget_quantile}): "
        f"{int((flops <= budget).sum())} feasible, best feasible "
        f"{best_b['valid_logloss']:.4f} ({best_b['flops']:.3g} FLOPs)"
    )
    tasks = []
    for setting in args.only or ("plain", "budget", "multi"):
        names = MO_SAMPLERS if setting == "multi" else tuple(SAMPLERS)
        for name in names:
            if args.samplers and name not in args.samplers:
                continue
            n_seeds = args.gp_seeds if name == "GP" else args.seeds
            for seed in range(args.first_seed, args.first_seed + n_seeds):
                tasks.append(
                    (setting, name, seed, args.trials, budget if setting == "budget" else None)
                )
    start = time.perf_counter()
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(_task, tasks, chunksize=1)
    else:
        results = [_task(t) for t in tasks]
    print(f"# {len(tasks)} studies in {time.perf_counter() - start:.0f} s")
    summary: dict[str, Any] = {"table": table.name, "budget": budget, "runs": results}
    for path in args.merge:
        runs, stored_asks = load_stored(path)
        results = results + runs
        summary.update(stored_asks)
        print(f"# merged {len(runs)} studies from {path}")
    print()
    _print_tables(results, budget)

    for n in args.ask_trials:
        for name in SAMPLERS:
            if f"{name}@{n}" in args.ask_skip:
                continue
            asks = 3 if name == "GP" else args.asks
            make = lambda name=name: SAMPLERS[name](0)  # noqa: E731
            summary[f"ask/{name}@{n}"] = ms_per_ask(table, make, n, n_asks=asks)
        if args.large_space:
            space = HierarchicalSearchSpace.preset(args.large_space)
            for name in ("Evolution", "Random", "NSGA-II", "TPE (multivariate)"):
                if name.startswith("TPE") and n > 1000:
                    continue  # minutes per ask
                make = lambda name=name: SAMPLERS[name](0)  # noqa: E731
                summary[f"ask-{args.large_space}/{name}@{n}"] = ms_per_ask_on_space(
                    space, make, n, n_asks=args.asks
                )
    _print_ask(summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary))


def _print_ask(summary: dict[str, Any]) -> None:
    for group, by_name in ask_groups(summary).items():
        sizes = sorted({n for cells in by_name.values() for n in cells})
        where = "digits-small" if group == "ask" else group.split("-", 1)[1] + " (random history)"
        print(
            f"## ms per ask on {where}: ask + suggest after N finished trials (mean of 30; GP 3)\n"
        )
        print("| sampler | " + " | ".join(f"@{n}" for n in sizes) + " | vs Evolution |")
        print("|---|" + "---|" * (len(sizes) + 1))
        evo = by_name.get("Evolution", {})
        for name in SAMPLERS:
            if name not in by_name:
                continue
            cells = [f"{by_name[name][n]:.2f}" if n in by_name[name] else "-" for n in sizes]
            last = max(by_name[name])
            ratio = f"{by_name[name][last] / evo[last]:.1f}x @{last}" if last in evo else "-"
            print(f"| {name} | {' | '.join(cells)} | {ratio} |")
        print()


if __name__ == "__main__":
    main()
