"""W asynchronous workers on one study with a budget: QUBOSampler with and without
``fantasize_running`` beside ``TPESampler(constant_liar=True)``.

An event simulation, no threads: every trial's evaluation time is drawn from a lognormal
(sigma 0.5) by a generator of the seed, in ask order, so every sampler of a seed meets the
same durations and results arrive out of order. A worker asks as soon as its result is told,
so each ask sees the other W - 1 trials RUNNING. Problems and budgets are those of
``bench/sampler_suite.py`` (mode ``constraint``: ``trial.set_constraint("cost", cost -
limit)``, told with the value). Regret after N completed trials: the best feasible value
among the first N told minus the feasible optimum (the worst feasible value before any).

Runs are appended to a JSON-lines log (``--log``) and skipped when already there, so a run
resumes; the table is printed from the log:

    nice -n 19 python bench/async_budget.py --workers 16 --trials 100 --seeds 24
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import heapq
import json
import math
from pathlib import Path
import sys
import time
from typing import Any

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).parent))

from sampler_suite import make_problem
from sampler_suite import Problem

from optuna_hpcnas.samplers import QUBOSampler

SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "QUBO": lambda s: QUBOSampler(seed=s, fantasize_running=False),
    "QUBO-fantasize": lambda s: QUBOSampler(seed=s, fantasize_running=True),
    "TPE-constant-liar": lambda s: optuna.samplers.TPESampler(
        multivariate=True, constant_liar=True, seed=s
    ),
}
# Completed trials at which the table reads the regret (and at the last one).
CHECKPOINTS = (25, 50)


def simulate(
    problem: Problem, sampler: optuna.samplers.BaseSampler, workers: int, n: int, seed: int
) -> dict[str, Any]:
    """Regret by completed trials of one study asked by ``workers`` simulated workers."""
    durations = np.random.default_rng([seed, workers]).lognormal(0.0, 0.5, n)
    suggest = problem.suggest_for_new_study()
    study = optuna.create_study(sampler=sampler)
    running: list[tuple[float, int, optuna.Trial, Any]] = []
    start = time.perf_counter()

    def ask(now: float) -> None:
        trial = study.ask()
        key = suggest(trial)
        heapq.heappush(running, (now + durations[trial.number], trial.number, trial, key))

    for _ in range(min(workers, n)):
        ask(0.0)
    told: list[Any] = []
    while running:
        now, _, trial, key = heapq.heappop(running)
        trial.set_constraint("cost", problem.cost[key] - problem.limit)
        study.tell(trial, problem.value[key])
        told.append(key)
        if len(study.trials) < n:
            ask(now)
    best, worst = problem.optimum(True)
    feasible = [problem.value[k] if problem.cost[k] <= problem.limit else math.inf for k in told]
    incumbent = np.minimum.accumulate(feasible)
    curve = np.where(np.isfinite(incumbent), incumbent, worst) - best
    return {
        "curve": [float(v) for v in curve],
        "seconds": time.perf_counter() - start,
        "repeats": len(told) - len(set(told)),
    }


def _table(
    runs: list[dict[str, Any]], problems: list[str], samplers: list[str], trials: int
) -> None:
    at = [c for c in CHECKPOINTS if c < trials] + [trials]
    print(
        f"{'problem':<15} {'sampler':<19} {'seeds':>5} "
        + " ".join(f"{'regret@' + str(c):>17}" for c in at)
        + f" {'repeats':>7} {'s/run':>6}"
    )
    for pname in problems:
        for sname in samplers:
            mine = [r for r in runs if r["problem"] == pname and r["sampler"] == sname]
            if not mine:
                continue
            cells = []
            for c in at:
                x = np.array([r["curve"][min(c, len(r["curve"])) - 1] for r in mine])
                se = x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else math.nan
                cells.append(f"{x.mean():>8.3f} ± {se:<6.3f}")
            repeats = np.mean([r["repeats"] for r in mine])
            seconds = np.mean([r["seconds"] for r in mine])
            print(
                f"{pname:<15} {sname:<19} {len(mine):>5} "
                + " ".join(cells)
                + f" {repeats:>7.1f} {seconds:>6.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", default="digits,nb201-cifar10")
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--log", type=Path, default=Path("bench/results/async_budget.jsonl"))
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    problems, samplers = args.problems.split(","), args.samplers.split(",")
    runs = (
        [json.loads(line) for line in args.log.read_text().splitlines()]
        if (args.log.exists())
        else []
    )
    setting = {"workers": args.workers, "trials": args.trials}
    runs = [r for r in runs if all(r[k] == v for k, v in setting.items())]
    done = {(r["problem"], r["sampler"], r["seed"]) for r in runs}
    fixed = {p: make_problem(p, 0) for p in problems} if not args.table_only else {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for pname in fixed:
            for sname in samplers:
                if (pname, sname, seed) in done:
                    continue
                out = simulate(
                    fixed[pname], SAMPLERS[sname](seed), args.workers, args.trials, seed
                )
                run = {"problem": pname, "sampler": sname, "seed": seed, **setting, **out}
                args.log.parent.mkdir(parents=True, exist_ok=True)
                with args.log.open("a") as f:
                    f.write(json.dumps(run) + "\n")
                runs.append(run)
                print(
                    f"{pname} {sname} seed {seed}: regret@{args.trials} "
                    f"{out['curve'][-1]:.4f} {out['seconds']:.1f} s",
                    flush=True,
                )
    _table(runs, problems, samplers, args.trials)


if __name__ == "__main__":
    main()
