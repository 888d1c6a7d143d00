"""Milliseconds per ask (ask + suggest, the surrogate fit included) after 100 finished trials.

Times are CPU milliseconds of the process (``time.process_time``, one thread:
``OMP_NUM_THREADS=1``), i.e. the time on an idle core, since the 2-core machine is shared.

Two tables, every sampler timed in the same process, interleaved, on the same histories:

* ``--part peers``: EvolutionarySampler and QUBOSampler against Optuna's Random, TPE
  (multivariate), NSGA-II and GP on the tuning problems of ``bench/sampler_suite.py``
  (digits, NAS-Bench-201 cifar10, quadratic), unconstrained and with a constraint.
* ``--part qubo``: QUBOSampler against GP as the one-hot encoding grows: 30, 60, 120 and 256
  binary variables (categorical parameters of 5 values; the last takes the remainder), on a
  random quadratic over the bits, unconstrained and with a linear constraint (the
  feasibility surrogate and its budget in the BQM).

    python bench/ask_time.py --part qubo
    python bench/ask_time.py --part peers --asks 10
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
import sys
import time
from typing import Any
import warnings

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).parent))

from sampler_suite import make_problem
from sampler_suite import SAMPLERS

from optuna_hpcnas.samplers import QUBOSampler


def _time_asks(
    make: Callable[[], optuna.samplers.BaseSampler],
    history: list[optuna.trial.FrozenTrial],
    suggest: Callable[[optuna.Trial], Any],
    score: Callable[[Any], tuple[float, float]],
    constrained: bool,
    asks: int,
) -> float:
    """Mean ms of ``asks`` asks (after one untimed warm-up) on a study holding ``history``."""
    study = optuna.create_study(sampler=make())
    study.add_trials(history)
    total = 0.0
    for k in range(asks + 1):
        # CPU time of this (single-threaded) process: what an idle core would take; the
        # machine these figures come from is shared, so wall time measures the neighbours.
        start = time.process_time()
        trial = study.ask()
        point = suggest(trial)
        elapsed = time.process_time() - start
        value, excess = score(point)
        if constrained:
            trial.set_constraint("cost", excess)
        study.tell(trial, value)
        if k:  # the first ask pays one-off imports and caches
            total += elapsed
    return 1000.0 * total / asks


def _history(
    dists: dict[str, optuna.distributions.CategoricalDistribution],
    to_point: Callable[[dict[str, Any]], Any],
    score: Callable[[Any], tuple[float, float]],
    constrained: bool,
    n: int,
    rng: np.random.Generator,
) -> list[optuna.trial.FrozenTrial]:
    out = []
    for _ in range(n):
        params = {k: d.choices[int(rng.integers(len(d.choices)))] for k, d in dists.items()}
        value, excess = score(to_point(params))
        attrs = {"constraints:cost": excess} if constrained else {}
        out.append(
            optuna.trial.create_trial(
                params=params, distributions=dists, value=value, system_attrs=attrs
            )
        )
    return out


def part_qubo(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    print("## QUBOSampler vs GP: ms per ask after 100 finished trials, by one-hot size\n")
    print(
        "| binary variables | constraint | QUBO ms | GP ms | QUBO / GP | QUBO ms per bit |"
        " QUBO µs per BQM term |"
    )
    print("|---|---|---|---|---|---|---|")
    for n_bits in (30, 60, 120, 256):
        sizes = [5] * (n_bits // 5)
        sizes[-1] += n_bits - sum(sizes)
        dists = {
            f"g{i:02d}": optuna.distributions.CategoricalDistribution(list(range(s)))
            for i, s in enumerate(sizes)
        }
        lin = [rng.normal(0, 1, s) for s in sizes]
        cost = [rng.uniform(1, 10, s) for s in sizes]
        pairs = rng.normal(0, 0.3, (len(sizes), len(sizes)))
        limit = float(sum(np.median(c) for c in cost))

        def score(
            point: Any, lin: Any = lin, cost: Any = cost, pairs: Any = pairs, limit: float = limit
        ) -> Any:
            idx = [point[k] for k in sorted(point)]
            value = sum(lin[g][v] for g, v in enumerate(idx))
            value += sum(pairs[a, b] * (idx[a] == idx[b]) for a in range(3) for b in range(a))
            return float(value), float(sum(cost[g][v] for g, v in enumerate(idx))) - limit

        def suggest(trial: optuna.Trial, dists: Any = dists) -> dict[str, Any]:
            return {k: trial.suggest_categorical(k, d.choices) for k, d in dists.items()}

        for constrained in (False, True):
            history = _history(dists, dict, score, constrained, args.history, rng)
            qubo = _time_asks(
                lambda: QUBOSampler(seed=0), history, suggest, score, constrained, args.asks
            )
            gp = _time_asks(
                lambda: optuna.samplers.GPSampler(seed=0),
                history,
                suggest,
                score,
                constrained,
                max(2, args.asks // 4),
            )
            terms = n_bits + n_bits * (n_bits - 1) // 2  # biases of a dense surrogate's BQM
            print(
                f"| {n_bits} | {'yes' if constrained else 'no'} | {qubo:.1f} | {gp:.1f} | "
                f"{qubo / gp:.3f} | {qubo / n_bits:.3f} | {1000 * qubo / terms:.1f} |",
                flush=True,
            )


def part_peers(args: argparse.Namespace) -> None:
    names = args.samplers.split(",")
    print("## ms per ask after 100 finished trials (mean; GP over a quarter of the asks)\n")
    print("| problem | constraint | " + " | ".join(names) + " | Evolution / GP | QUBO / GP |")
    print("|---|---|" + "---|" * (len(names) + 2))
    for pname in ("digits", "nb201-cifar10", "quadratic"):
        problem = make_problem(pname, 0)
        # The history: the problem's own suggest on a throwaway study gives the distributions.
        probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        keys: list[Any] = []
        for _ in range(args.history):
            t = probe.ask()
            keys.append(problem.suggest(t))
            probe.tell(t, problem.value[keys[-1]])
        for constrained in (False, True):
            history = []
            for t, key in zip(probe.trials, keys):
                attrs = (
                    {"constraints:cost": problem.cost[key] - problem.limit} if constrained else {}
                )
                history.append(
                    optuna.trial.create_trial(
                        params=t.params,
                        distributions=t.distributions,
                        value=problem.value[key],
                        system_attrs=attrs,
                    )
                )

            def score(key: Any, problem: Any = problem) -> tuple[float, float]:
                return problem.value[key], problem.cost[key] - problem.limit

            ms = {}
            for name in names:
                asks = max(2, args.asks // 4) if name == "GP" else args.asks
                ms[name] = _time_asks(
                    lambda name=name: SAMPLERS[name](0),
                    history,
                    problem.suggest_for_new_study(),
                    score,
                    constrained,
                    asks,
                )
            cells = [f"{ms[n]:.1f}" for n in names]
            ratios = [
                f"{ms[n] / ms['GP']:.3f}" if "GP" in ms and n in ms else "-"
                for n in ("Evolution", "QUBO")
            ]
            print(
                f"| {pname} | {'yes' if constrained else 'no'} | {' | '.join(cells + ratios)} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("qubo", "peers"), default="qubo")
    parser.add_argument("--asks", type=int, default=12)
    parser.add_argument("--history", type=int, default=100)
    parser.add_argument("--samplers", default="Evolution,QUBO,Random,TPE,NSGA-II,GP")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    {"qubo": part_qubo, "peers": part_peers}[args.part](args)


if __name__ == "__main__":
    main()
