"""QUBOSampler against Random, TPE and EvolutionarySampler on small discrete spaces.

Problems (all with a known optimum):

* ``quadratic``: a random quadratic black box over 6 one-hot groups of 4 values (4,096 codes;
  a new instance per seed, optimum by enumeration).
* ``quadratic-flops``: the same with a FLOPs cost per value and a budget that rules out about
  half of the codes; an over-budget evaluation scores the worst value of the instance (the
  peers cannot know the budget, QUBOSampler gets it as ``qubo.LinearBudget``). Regret counts
  feasible trials only.
* ``digits-small``: the tabular benchmark ``bench/data/digits_small.parquet`` (every
  architecture of ``preset("digits-small")`` trained once), validation log-loss minimised
  through ``space.suggest`` (as ``bench/evolution_vs_peers.py``).

Prints mean regret (and standard error) after 25, 50 and 100 trials over the seeds, the ratio
to RandomSampler, the share of feasible annealing samples and of feasible trials, and
milliseconds per ask with 50 and 200 finished trials.

    python bench/qubo_regret.py --seeds 20            # full run
    python bench/qubo_regret.py --seeds 3 --trials 50 # smoke
"""

from __future__ import annotations

import abc
import argparse
from collections.abc import Callable
import itertools
import json
import math
from pathlib import Path
import time
from typing import Any
import warnings

import numpy as np
import optuna

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler
from qubo import BayesianQuadratic
from qubo import FactorizationMachine
from qubo import LinearBudget

TABLE = Path(__file__).parent / "data" / "digits_small.parquet"
# As bench/nas_table.py: validation log-loss, minimised (accuracy ties many top architectures).
OBJECTIVE = "valid_logloss"
CHECKPOINTS = (25, 50, 100)
Factory = Callable[[int, tuple[LinearBudget, ...]], optuna.samplers.BaseSampler]


class Problem(abc.ABC):
    """A minimised black box with ``objective(trial)``, ``optimum`` and feasibility."""

    name: str
    optimum: float
    budgets: tuple[LinearBudget, ...] = ()
    worst: float = math.inf

    @abc.abstractmethod
    def objective(self, trial: optuna.Trial) -> float:
        """The value of the trial's point (suggested through ``trial``)."""

    def feasible(self, params: dict[str, Any]) -> bool:
        return True


class Quadratic(Problem):
    def __init__(self, seed: int, flops: bool, groups: int = 6, values: int = 4) -> None:
        rng = np.random.default_rng(10_000 + seed)
        self.name = "quadratic-flops" if flops else "quadratic"
        self.names = [f"g{i}" for i in range(groups)]
        self.values = list(range(values))
        self.lin = rng.normal(0, 1, (groups, values))
        # Pairwise interactions between different groups only (strictly upper triangle).
        self.quad = (
            rng.normal(0, 1, (groups, groups, values, values))
            * np.triu(np.ones((groups, groups)), 1)[:, :, None, None]
        )
        self.cost = rng.uniform(1, 10, (groups, values))
        codes = np.array(list(itertools.product(self.values, repeat=groups)))
        energy = np.array([self._energy(c) for c in codes])
        costs = self.cost[np.arange(groups), codes].sum(axis=1)
        self.limit = float(np.median(costs)) if flops else math.inf
        ok = costs <= self.limit
        self.optimum = float(energy[ok].min())
        self.worst = float(energy.max())
        if flops:
            table = {
                (n, v): float(self.cost[g, v])
                for g, n in enumerate(self.names)
                for v in self.values
            }
            self.budgets = (LinearBudget("flops", costs=table, limit=self.limit),)

    def _energy(self, code: Any) -> float:
        g = np.arange(len(code))
        out = self.lin[g, code].sum()
        out += self.quad[
            g[:, None], g[None, :], np.asarray(code)[:, None], np.asarray(code)[None, :]
        ].sum()
        return float(out)

    def objective(self, trial: optuna.Trial) -> float:
        code = [trial.suggest_categorical(n, self.values) for n in self.names]
        if not self.feasible(dict(zip(self.names, code))):
            return self.worst
        return self._energy(code)

    def feasible(self, params: dict[str, Any]) -> bool:
        code = [params[n] for n in self.names]
        return float(self.cost[np.arange(len(code)), code].sum()) <= self.limit


class Digits(Problem):
    name = "digits-small"

    def __init__(self, paths: list[Path]) -> None:
        import pyarrow.parquet as pq

        self.space = HierarchicalSearchSpace.preset("digits-small")
        self.table: dict[str, float] = {}
        for path in paths:  # the table, or the shards it is built from
            rows = pq.read_table(path, columns=["arch_json", OBJECTIVE]).to_pylist()
            self.table.update({r["arch_json"]: float(r[OBJECTIVE]) for r in rows})
        if len(self.table) != self.space.cardinality():
            raise RuntimeError(
                f"{[str(p) for p in paths]} hold {len(self.table)} architectures, "
                f"the space {self.space.cardinality()}."
            )
        self.optimum = min(self.table.values())

    def objective(self, trial: optuna.Trial) -> float:
        # One space object per study (see nas_table.fresh_space): a shared one may not record
        # itself in a new in-memory study whose storage reuses a freed id.
        study = getattr(trial, "study", None)
        if study is not getattr(self, "_study", None):
            self._study = study
            self._space = HierarchicalSearchSpace.from_json(self.space.to_json())
        return self.table[self._space.suggest(trial).to_json()]


def samplers() -> dict[str, Factory]:
    """Every sampler of the comparison; QUBOSampler settings are spelled out, so a row keeps
    its meaning when a default changes."""

    def qubo(surrogate: Any, startup: int = 10, **kw: Any) -> Factory:
        return lambda s, b: QUBOSampler(
            seed=s, budgets=b, surrogate=surrogate, n_startup_trials=startup, **kw
        )

    return {
        "QUBO-default": lambda s, b: QUBOSampler(seed=s, budgets=b),
        "QUBO-bayes-TS": qubo(BayesianQuadratic(exploration=1.0)),
        "QUBO-bayes-mean": qubo(BayesianQuadratic(exploration=0.0)),
        "QUBO-bayes-TS-s5": qubo(BayesianQuadratic(exploration=1.0), startup=5),
        "QUBO-bayes-mean-s5": qubo(BayesianQuadratic(exploration=0.0), startup=5),
        "QUBO-bayes-half": qubo(BayesianQuadratic(exploration=0.5)),
        "QUBO-bayes-half-s5": qubo(BayesianQuadratic(exploration=0.5), startup=5),
        "QUBO-fm": qubo(FactorizationMachine()),
        "QUBO-penalty0": qubo(BayesianQuadratic(), evaluated_penalty=0.0),
        "QUBO-penalty1": qubo(BayesianQuadratic(), evaluated_penalty=1.0),
        "Random": lambda s, b: optuna.samplers.RandomSampler(seed=s),
        "TPE": lambda s, b: optuna.samplers.TPESampler(seed=s),
        "Evolution": lambda s, b: EvolutionarySampler(seed=s),
    }


DEFAULT_ROWS = "QUBO-default,QUBO-bayes-TS,QUBO-bayes-mean,QUBO-fm,Random,TPE,Evolution"


def run(problem: Problem, make: Factory, seed: int, n: int) -> dict[str, Any]:
    sampler = make(seed, problem.budgets)  # only QUBOSampler can use the budgets
    study = optuna.create_study(sampler=sampler)
    study.optimize(problem.objective, n_trials=n)
    best, regrets, feasible = math.inf, [], []
    for t in study.trials:
        ok = problem.feasible(t.params)
        feasible.append(ok)
        if ok and t.value is not None:
            best = min(best, t.value)
        regrets.append(best - problem.optimum)
    rates = [
        t.system_attrs[_keys.QUBO_INFO]["feasible_rate"]
        for t in study.trials
        if _keys.QUBO_INFO in t.system_attrs
    ]
    return {
        "regret": {k: regrets[k - 1] for k in CHECKPOINTS if k <= n},
        "feasible_trials": float(np.mean(feasible)),
        "anneal_feasible": float(np.mean(rates)) if rates else None,
    }


def ms_per_ask(problem: Problem, make: Factory, n: int, repeats: int = 5) -> float:
    sampler = make(0, problem.budgets)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(problem.objective, n_trials=n)
    study.sampler = sampler
    elapsed = 0.0
    for k in range(repeats + 1):
        start = time.perf_counter()
        trial = study.ask()
        value = problem.objective(trial)  # suggestions of relative params are cheap
        if k:  # the first ask pays one-off imports (dimod)
            elapsed += time.perf_counter() - start
        study.tell(trial, value)
    return 1000.0 * elapsed / repeats


def _fmt(values: list[float], digits: int = 3) -> str:
    mean = float(np.mean(values))
    sem = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f}±{sem:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--problems", default="quadratic,quadratic-flops,digits-small")
    parser.add_argument("--samplers", default=DEFAULT_ROWS, help=f"from {list(samplers())}")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--timing-only", action="store_true", help="only ms per ask")
    parser.add_argument("--json", type=Path, default=None, help="also write raw results here")
    parser.add_argument(
        "--table", type=Path, nargs="+", default=[TABLE], help="digits-small table (or shards)"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    known = samplers()
    chosen = {k: known[k] for k in args.samplers.split(",")}
    raw: dict[str, Any] = {}
    for pname in args.problems.split(","):
        if pname == "digits-small" and not all(p.exists() for p in args.table):
            print(f"\n## {pname}: skipped, {args.table} missing")
            continue
        instances = [
            Digits(args.table)
            if pname == "digits-small"
            else Quadratic(s, flops=pname.endswith("flops"))
            for s in (range(args.seeds) if pname != "digits-small" else [0])
        ]
        if args.timing_only:
            print(f"\n## {pname}: ms per ask (fit + anneal) with 50 and 200 finished trials")
            print("| sampler | ms/ask@50 | ms/ask@200 |\n|---|---|---|")
            timings = {
                sname: [ms_per_ask(instances[0], make, n) for n in (50, 200)]
                for sname, make in chosen.items()
            }
            for sname, (t50, t200) in timings.items():
                ratio = ""
                if "Random" in timings:
                    ratio = f" ({t200 / timings['Random'][1]:.0f}x Random)"
                print(f"| {sname} | {t50:.1f} | {t200:.1f}{ratio} |", flush=True)
            continue
        results: dict[str, list[dict[str, Any]]] = {}
        for sname, make in chosen.items():
            results[sname] = [
                run(instances[s % len(instances)], make, s, args.trials) for s in range(args.seeds)
            ]
        raw[pname] = results
        checkpoints = [k for k in CHECKPOINTS if k <= args.trials]
        print(f"\n## {pname}: regret (mean±sem over {args.seeds} seeds), ratio to Random")
        header = (
            ["sampler"] + [f"@{k}" for k in checkpoints] + [f"/Random@{k}" for k in checkpoints]
        )
        header += ["feasible trials", "anneal feasible"]
        if not args.no_timing:
            header += ["ms/ask@50", "ms/ask@200"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        base = (
            {k: np.mean([r["regret"][k] for r in results["Random"]]) for k in checkpoints}
            if "Random" in results
            else {}
        )
        for sname, rs in results.items():
            digits = 4 if pname == "digits-small" else 3  # accuracy regrets are small
            cells = [sname] + [_fmt([r["regret"][k] for r in rs], digits) for k in checkpoints]
            for k in checkpoints:
                mine = np.mean([r["regret"][k] for r in rs])
                cells.append(f"{mine / base[k]:.2f}" if base.get(k) else "-")
            cells.append(f"{np.mean([r['feasible_trials'] for r in rs]):.2f}")
            rates = [r["anneal_feasible"] for r in rs if r["anneal_feasible"] is not None]
            cells.append(f"{np.mean(rates):.3f}" if rates else "-")
            if not args.no_timing:
                cells += [f"{ms_per_ask(instances[0], chosen[sname], n):.1f}" for n in (50, 200)]
            print("| " + " | ".join(cells) + " |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
