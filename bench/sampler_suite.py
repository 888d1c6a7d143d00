"""EvolutionarySampler and QUBOSampler against Optuna's samplers on the tuning benchmarks.

Problems (every one minimised, with a known optimum):

* ``digits``: ``bench/data/digits_small.parquet`` (1,536 architectures of
  ``preset("digits-small")``), validation log-loss; cost: FLOPs.
* ``nb201-cifar10``: NAS-Bench-201 (15,625 cells, 6 edges x 5 operations as categorical
  parameters), validation error in % (100 - mean accuracy of the 3 seeds); cost: model size.
  ``nb201-cifar100`` and ``nb201-imagenet16-120`` are the out-of-sample check (never tuned on).
* ``quadratic``: the synthetic QUBO problems of ``bench/qubo_regret.py`` (a random quadratic
  over 6 one-hot groups of 4 values, a new instance per seed); cost: its FLOPs table.

Modes: ``plain``; ``constraint`` (cost <= budget through ``trial.set_constraint``; the budget
is the 0.3 quantile of the cost, the median for ``quadratic``); ``penalty`` (the same budget,
but the black box returns ``value + 1000`` for an infeasible point and tells the sampler
nothing else). Regret at N trials: best feasible value among the first N minus the feasible
optimum (the worst feasible value before the first feasible trial).

Every run is cached under ``bench/results/suite/`` (one JSON per problem, mode, sampler and
seed), so peers run once and the samplers are tuned against the cache:

    python bench/sampler_suite.py run --samplers Random,TPE,NSGA-II --seeds 30
    python bench/sampler_suite.py run --samplers GP --seeds 10
    python bench/sampler_suite.py run --samplers Evolution,QUBO --seeds 30 --fresh
    python bench/sampler_suite.py table --seeds 30
    python bench/sampler_suite.py summary --seeds 30
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
import heapq
import json
import math
import os
from pathlib import Path
import sys
import time
from typing import Any
import warnings

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).parent))

from _stored import store_result

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler

RESULTS = Path(__file__).parent / "results" / "suite"
PENALTY = 1000.0
CHECKPOINTS = (50, 100, 200)
TUNING = ("digits", "nb201-cifar10", "quadratic")
OUT_OF_SAMPLE = ("nb201-cifar100", "nb201-imagenet16-120")
MODES = ("plain", "constraint", "penalty")
# Run only when named (``--modes async,two-objective``): the settings of clusters and of
# trade-offs.
CLUSTER_MODES = ("async", "two-objective")
ASYNC_WORKERS = 16
# Mean seconds of a simulated evaluation: a cheap candidate's (docs/distributed.md's 10 s
# class), against which each sampler's own measured seconds per ask and tell count.
ASYNC_TRIAL_SECONDS = 10.0

SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "Evolution": lambda s: EvolutionarySampler(seed=s),
    "QUBO": lambda s: QUBOSampler(seed=s),
    "Random": lambda s: optuna.samplers.RandomSampler(seed=s),
    "TPE": lambda s: optuna.samplers.TPESampler(multivariate=True, seed=s),
    "NSGA-II": lambda s: optuna.samplers.NSGAIISampler(seed=s),
    "GP": lambda s: optuna.samplers.GPSampler(seed=s),
    # what an expert sets for asynchronous workers
    "TPE-CL": lambda s: optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=s),
}


@dataclass
class Problem:
    """A lookup black box: ``suggest(trial) -> key``; ``value[key]``, ``cost[key]``."""

    name: str
    suggest: Callable[[optuna.Trial], Any]
    value: dict[Any, float]
    cost: dict[Any, float]
    limit: float
    # A new ``suggest`` for each study, where it must not share state between studies.
    fresh: Callable[[], Callable[[optuna.Trial], Any]] | None = None

    def suggest_for_new_study(self) -> Callable[[optuna.Trial], Any]:
        return self.fresh() if self.fresh is not None else self.suggest

    def optimum(self, budget: bool) -> tuple[float, float]:
        """(best, worst) value, among feasible keys with a budget."""
        vals = [v for k, v in self.value.items() if not budget or self.cost[k] <= self.limit]
        return min(vals), max(vals)


def _digits() -> Problem:
    from nas_table import load_table

    table = load_table()
    space = table.space
    value = {k: float(r["valid_logloss"]) for k, r in table.rows.items()}
    cost = {k: float(r["flops"]) for k, r in table.rows.items()}
    limit = float(np.quantile(list(cost.values()), 0.3))
    text = space.to_json()

    def fresh() -> Callable[[optuna.Trial], Any]:
        # One space object per study: a space remembers the studies it recorded itself in by
        # (id(storage), study_id), and a new in-memory storage can reuse a freed id, so a
        # shared space would skip recording and the samplers would not see it.
        own = HierarchicalSearchSpace.from_json(text)
        return lambda t: own.suggest(t).to_json()

    return Problem("digits", fresh(), value, cost, limit, fresh)


def _nb201(dataset: str) -> Problem:
    import nasbench201

    table = nasbench201.load(dataset)

    def suggest(trial: optuna.Trial) -> tuple[str, ...]:
        return tuple(
            trial.suggest_categorical(e, nasbench201.OPERATIONS) for e in nasbench201.EDGES
        )

    value = {k: 100.0 - a for k, a in table.accuracy.items()}
    limit = float(np.quantile(list(table.model_size.values()), 0.3))
    return Problem(f"nb201-{dataset}", suggest, value, dict(table.model_size), limit)


def _quadratic(seed: int) -> Problem:
    import itertools

    from qubo_regret import Quadratic

    q = Quadratic(seed, flops=True)
    value, cost = {}, {}
    for code in itertools.product(q.values, repeat=len(q.names)):
        value[code] = q._energy(code)
        cost[code] = float(q.cost[np.arange(len(code)), code].sum())

    def suggest(trial: optuna.Trial) -> tuple[int, ...]:
        return tuple(trial.suggest_categorical(n, q.values) for n in q.names)

    return Problem("quadratic", suggest, value, cost, q.limit)


def make_problem(name: str, seed: int) -> Problem:
    if name == "digits":
        return _digits()
    if name.startswith("nb201-"):
        return _nb201(name[len("nb201-") :])
    if name == "quadratic":
        return _quadratic(seed)
    raise ValueError(f"unknown problem {name!r}")


def run_one(problem: Problem, mode: str, sampler: optuna.samplers.BaseSampler, n: int) -> dict:
    keys: list[Any] = []
    suggest = problem.suggest_for_new_study()

    def objective(trial: optuna.Trial) -> float:
        key = suggest(trial)
        keys.append(key)
        value = problem.value[key]
        excess = problem.cost[key] - problem.limit
        if mode == "constraint":
            trial.set_constraint("cost", excess)
        elif mode == "penalty" and excess > 0:
            value += PENALTY
        return value

    study = optuna.create_study(sampler=sampler)
    start = time.perf_counter()
    study.optimize(objective, n_trials=n)
    seconds = time.perf_counter() - start
    budget = mode != "plain"
    best, worst = problem.optimum(budget)
    incumbent, curve = math.inf, []
    for key in keys:
        if not budget or problem.cost[key] <= problem.limit:
            incumbent = min(incumbent, problem.value[key])
        curve.append((incumbent if math.isfinite(incumbent) else worst) - best)
    repeats = len(keys) - len(set(keys))
    return {"curve": curve, "seconds": seconds, "repeats": repeats}


def _lognormal_durations(seed: int, n: int) -> np.ndarray:
    """Evaluation seconds of the ``n`` trials of a seed's studies, in ask order (lognormal,
    sigma 0.5, mean ``ASYNC_TRIAL_SECONDS``): every sampler of a seed meets the same ones."""
    sigma = 0.5
    rng = np.random.default_rng([seed, ASYNC_WORKERS])
    return ASYNC_TRIAL_SECONDS * rng.lognormal(-(sigma**2) / 2, sigma, n)


def reference_clock(durations: np.ndarray, workers: int) -> float:
    """Simulated seconds ``workers`` workers take for every trial of ``durations`` when asking
    costs nothing: the equal time at which the samplers are compared."""
    free = [0.0] * workers
    for duration in durations:
        heapq.heappush(free, heapq.heappop(free) + float(duration))
    return max(free)


def run_async(
    problem: Problem, sampler: optuna.samplers.BaseSampler, n: int, seed: int
) -> dict[str, Any]:
    """``ASYNC_WORKERS`` simulated workers on one study (an event simulation, no threads):
    each asks as soon as its last result is told, so every ask sees the other workers' trials
    RUNNING, and results arrive out of order. A worker's clock advances by its ask's and
    tell's measured seconds plus the drawn evaluation time. Regret by completed trials
    (``curve``) and at ``reference_clock`` (``regret_at_time``: what finished by then)."""
    durations = _lognormal_durations(seed, n)
    suggest = problem.suggest_for_new_study()
    study = optuna.create_study(sampler=sampler)
    running: list[tuple[float, int, optuna.Trial, Any]] = []
    start = time.perf_counter()

    def ask(now: float) -> None:
        t0 = time.perf_counter()
        trial = study.ask()
        key = suggest(trial)  # the sampler proposes as the parameters are suggested
        ready = now + time.perf_counter() - t0
        heapq.heappush(running, (ready + durations[trial.number], trial.number, trial, key))

    for _ in range(min(ASYNC_WORKERS, n)):
        ask(0.0)
    told: list[Any] = []
    finished: list[float] = []
    while running:
        now, _, trial, key = heapq.heappop(running)
        t0 = time.perf_counter()
        study.tell(trial, problem.value[key])
        now += time.perf_counter() - t0
        told.append(key)
        finished.append(now)
        if len(study.trials) < n:
            ask(now)
    best, worst = problem.optimum(False)
    values = np.array([problem.value[k] for k in told])
    curve = np.minimum.accumulate(values) - best
    deadline = reference_clock(durations, ASYNC_WORKERS)
    in_time = values[np.asarray(finished) <= deadline]
    return {
        "curve": [float(v) for v in curve],
        "regret_at_time": float((in_time.min() if len(in_time) else worst) - best),
        "finished_by_time": int(len(in_time)),
        "seconds": time.perf_counter() - start,
        "repeats": len(told) - len(set(told)),
    }


def hypervolume_regret(problem: Problem, keys: list[Any]) -> list[float]:
    """1 - the hypervolume of the first ``i`` points over that of the problem's exact front,
    for every ``i``; (value, cost) scaled to [0, 1] (the value from its best to its 90th
    percentile: worse points are no trade-off anyone wants), reference point (1, 1)."""
    from nas_table import hypervolume_2d

    every = np.array([(problem.value[k], problem.cost[k]) for k in problem.value])
    low = every.min(axis=0)
    high = np.array([np.quantile(every[:, 0], 0.9), every[:, 1].max()])
    front = hypervolume_2d((every - low) / (high - low), (1.0, 1.0))
    points = (np.array([(problem.value[k], problem.cost[k]) for k in keys]) - low) / (high - low)
    return [1.0 - hypervolume_2d(points[: i + 1], (1.0, 1.0)) / front for i in range(len(keys))]


def run_two_objective(
    problem: Problem, sampler: optuna.samplers.BaseSampler, n: int
) -> dict[str, Any]:
    """One study minimising (value, cost): hypervolume regret against the exact front."""
    keys: list[Any] = []
    suggest = problem.suggest_for_new_study()

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        key = suggest(trial)
        keys.append(key)
        return problem.value[key], problem.cost[key]

    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    start = time.perf_counter()
    study.optimize(objective, n_trials=n)
    seconds = time.perf_counter() - start
    return {
        "curve": hypervolume_regret(problem, keys),
        "seconds": seconds,
        "repeats": len(keys) - len(set(keys)),
    }


def run_mode(
    problem: Problem, mode: str, sampler: optuna.samplers.BaseSampler, n: int, seed: int
) -> dict[str, Any]:
    """One study of ``mode`` (``MODES`` and ``CLUSTER_MODES``)."""
    if mode == "async":
        return run_async(problem, sampler, n, seed)
    if mode == "two-objective":
        return run_two_objective(problem, sampler, n)
    return run_one(problem, mode, sampler, n)


def _path(problem: str, mode: str, sampler: str, seed: int, tag: str) -> Path:
    return RESULTS / problem / mode / f"{sampler}{tag}" / f"{seed}.json"


def cmd_run(args: argparse.Namespace) -> None:
    problems = args.problems.split(",")
    for name in args.samplers.split(","):
        if name not in SAMPLERS:
            raise SystemExit(f"unknown sampler {name!r}; known: {list(SAMPLERS)}")
    for mode in args.modes.split(","):
        if mode not in MODES + CLUSTER_MODES:
            raise SystemExit(f"unknown mode {mode!r}; known: {list(MODES + CLUSTER_MODES)}")
    for pname in problems:
        fixed = None if pname == "quadratic" else make_problem(pname, 0)
        for mode in args.modes.split(","):
            for sname in args.samplers.split(","):
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    path = _path(pname, mode, sname, seed, args.tag)
                    if path.exists() and not args.fresh:
                        continue
                    problem = fixed or make_problem(pname, seed)
                    out = run_mode(problem, mode, SAMPLERS[sname](seed), args.trials, seed)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(out))
                    print(
                        f"{pname} {mode} {sname}{args.tag} seed {seed}: regret@100 "
                        f"{out['curve'][min(99, len(out['curve']) - 1)]:.4f} "
                        f"{out['seconds']:.1f} s",
                        flush=True,
                    )


def _load(problem: str, mode: str, sampler: str, seeds: int, tag: str = "") -> list[dict]:
    out = []
    for seed in range(seeds):
        path = _path(problem, mode, sampler, seed, tag)
        if path.exists():
            out.append(json.loads(path.read_text()))
    return out


def _mean_se(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=float)
    se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan
    return float(a.mean()), se


def cmd_table(args: argparse.Namespace) -> None:
    rows = args.samplers.split(",")
    tags = dict(item.split("=", 1) for item in args.tags.split(",")) if args.tags else {}
    at = args.at
    for pname in args.problems.split(","):
        for mode in args.modes.split(","):
            runs = {
                s: _load(pname, mode, s.split("=")[0], args.seeds, tags.get(s, "")) for s in rows
            }
            if not any(runs.values()):
                continue
            unit = {"digits": "log-loss", "quadratic": "energy"}.get(pname, "accuracy points")
            print(f"\n## {pname}, {mode}: regret ({unit}), mean ± standard error\n")
            head = f"@{at // 2} | @{at} | repeats@{at} | s per study | vs Random@{at}"
            print(f"| sampler | seeds | {head} |")
            print("|---|---|---|---|---|---|---|")
            base = [r["curve"][at - 1] for r in runs.get("Random", []) if len(r["curve"]) >= at]
            base_mean = float(np.mean(base)) if base else math.nan
            for sname, rs in runs.items():
                rs = [r for r in rs if len(r["curve"]) >= at]
                if not rs:
                    continue
                cells = []
                for n in (at // 2, at):
                    m, se = _mean_se([r["curve"][n - 1] for r in rs])
                    cells.append(f"{m:.4f} ± {se:.4f}")
                secs = float(np.mean([r["seconds"] for r in rs]))
                rep = float(np.mean([r.get("repeats", 0) for r in rs]))
                mine = float(np.mean([r["curve"][at - 1] for r in rs]))
                ratio = f"{mine / base_mean:.2f}" if base_mean > 0 else "-"
                label = sname + (f" [{tags[sname]}]" if sname in tags else "")
                cells += [f"{rep:.1f}", f"{secs:.1f}", ratio]
                print(f"| {label} | {len(rs)} | {' | '.join(cells)} |")


def regret_summary(
    samplers: list[str], problems: list[str], modes: list[str], seeds: int, at: int
) -> dict[str, Any]:
    """The cached runs as one record: per problem and mode, each sampler's regret at ``at``
    trials (mean, standard error, seeds found) and each sampler's mean seconds per study."""
    rows: list[dict[str, Any]] = []
    seconds: dict[str, list[float]] = {n: [] for n in samplers}
    for pname in problems:
        for mode in modes:
            # the asynchronous mode is read twice: by completed trials, and at equal
            # simulated time (what each sampler had finished when asking cost nothing)
            reads = [(mode, "curve")] + (
                [("async, equal time", "regret_at_time")] if mode == "async" else []
            )
            for label, field in reads:
                cells: dict[str, dict[str, float] | None] = {}
                for name in samplers:
                    rs = [r for r in _load(pname, mode, name, seeds) if len(r["curve"]) >= at]
                    if not rs:
                        cells[name] = None
                        continue
                    read = [r["curve"][at - 1] if field == "curve" else r[field] for r in rs]
                    m, se = _mean_se(read)
                    if field == "curve":
                        seconds[name] += [r["seconds"] for r in rs]
                    cells[name] = {"mean": m, "se": se, "seeds": len(rs)}
                rows.append({"problem": pname, "mode": label, "regret": cells})
    return {
        "at": at,
        "seeds": seeds,
        "samplers": samplers,
        "rows": rows,
        "seconds": {n: float(np.mean(v)) if v else None for n, v in seconds.items()},
    }


def regret_cell(cell: dict[str, float] | None, seeds: int, *, errors: bool = True) -> str:
    """One cell of ``regret_summary``: the mean (± standard error), the seeds in brackets
    where fewer than ``seeds`` ran, ``-`` where none did."""
    if cell is None:
        return "-"
    error = f" ± {cell['se']:.3f}" if errors else ""
    fewer = "" if cell["seeds"] == seeds else f" [{cell['seeds']:.0f}]"
    return f"{cell['mean']:.3f}{error}{fewer}"


def cmd_summary(args: argparse.Namespace) -> None:
    """One row per problem and mode, one column per sampler: regret at ``--at`` trials
    (mean ± standard error, seeds in brackets where fewer than ``--seeds``) and, last, the
    mean seconds per study of each sampler; ``--out`` also stores it as JSON (the README's
    sampler table is written from that file by ``bench/readme_figures.py``)."""
    names = args.samplers.split(",")
    result = regret_summary(
        names, args.problems.split(","), args.modes.split(","), args.seeds, args.at
    )
    print(f"| problem | mode | {' | '.join(names)} |")
    print("|---|---|" + "---|" * len(names))
    for row in result["rows"]:
        cells = [regret_cell(row["regret"][name], args.seeds) for name in names]
        print(f"| {row['problem']} | {row['mode']} | {' | '.join(cells)} |")
    secs = [f"{v:.2f}" if v is not None else "-" for v in result["seconds"].values()]
    print(f"| s per study | (mean) | {' | '.join(secs)} |")
    if args.out is not None:
        store_result(args.out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run and cache studies")
    run.add_argument("--samplers", default="Evolution,QUBO")
    run.add_argument("--problems", default=",".join(TUNING))
    run.add_argument("--modes", default=",".join(MODES))
    run.add_argument("--seeds", type=int, default=30)
    run.add_argument("--first-seed", type=int, default=0)
    run.add_argument("--trials", type=int, default=100)
    run.add_argument("--tag", default="", help="suffix of the cache folder (a variant)")
    run.add_argument("--fresh", action="store_true", help="rerun cached studies")
    table = sub.add_parser("table", help="print tables from the cache")
    table.add_argument("--samplers", default=",".join(SAMPLERS))
    table.add_argument("--problems", default=",".join(TUNING))
    table.add_argument("--modes", default=",".join(MODES))
    table.add_argument("--seeds", type=int, default=30)
    table.add_argument("--at", type=int, default=100)
    table.add_argument("--tags", default="", help="sampler=tag,... to show a variant's cache")
    summary = sub.add_parser("summary", help="one side-by-side table from the cache")
    summary.add_argument("--samplers", default=",".join(SAMPLERS))
    summary.add_argument("--problems", default=",".join(TUNING))
    summary.add_argument("--modes", default=",".join(MODES))
    summary.add_argument("--seeds", type=int, default=30)
    summary.add_argument("--at", type=int, default=100)
    summary.add_argument("--out", type=Path, help="also store the summary as JSON here")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"run": cmd_run, "table": cmd_table, "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    main()
