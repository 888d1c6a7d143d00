"""QUBOSampler on its own model class: a dense random quadratic over 6 groups of 5 choices.

Issue 22. The black box is exactly what QUBOSampler's surrogate models: for one-hot codes of
6 categorical parameters with 5 values (30 bits, 15,625 codes), a value per choice and one
per pair of choices of two different groups, all standard normal (a new instance per seed,
its optimum by enumeration). Regret at 50 and 100 trials against GP, TPE (multivariate),
Random and EvolutionarySampler, every sampler on the same instances and seeds; each study
is cached under ``bench/results/quadratic/`` so peers run once.

    python bench/qubo_quadratic.py --seeds 30
    python bench/qubo_quadratic.py --seeds 30 --fresh QUBO   # after a change to QUBOSampler
    PYTHONPATH=/tmp/main python bench/qubo_quadratic.py --samplers QUBO --tag @main  # another
        # checkout's samplers (e.g. a git archive of main), cached apart
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import itertools
import json
import math
import os
from pathlib import Path
import time
from typing import Any
import warnings

import numpy as np
import optuna

from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler

RESULTS = Path(__file__).parent / "results" / "quadratic"
GROUPS, VALUES = 6, 5

SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "QUBO": lambda s: QUBOSampler(seed=s),
    "GP": lambda s: optuna.samplers.GPSampler(seed=s),
    "TPE": lambda s: optuna.samplers.TPESampler(multivariate=True, seed=s),
    "Random": lambda s: optuna.samplers.RandomSampler(seed=s),
    "Evolution": lambda s: EvolutionarySampler(seed=s),
}


class DenseQuadratic:
    """``sum_g a[g, x_g] + sum_{g<h} b[g, h, x_g, x_h]``, every coefficient N(0, 1)."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(50_000 + seed)
        self.linear = rng.normal(0.0, 1.0, (GROUPS, VALUES))
        upper = np.triu(np.ones((GROUPS, GROUPS)), 1)[:, :, None, None]
        self.pairs = rng.normal(0.0, 1.0, (GROUPS, GROUPS, VALUES, VALUES)) * upper
        codes = np.array(list(itertools.product(range(VALUES), repeat=GROUPS)))
        self.optimum = float(self.values(codes).min())

    def values(self, codes: np.ndarray) -> np.ndarray:
        g = np.arange(GROUPS)
        out = self.linear[g, codes].sum(axis=-1)
        for a in range(GROUPS):
            for b in range(a + 1, GROUPS):
                out = out + self.pairs[a, b, codes[..., a], codes[..., b]]
        return np.asarray(out)

    def objective(self, trial: optuna.Trial) -> float:
        code = [trial.suggest_categorical(f"g{i}", list(range(VALUES))) for i in range(GROUPS)]
        return float(self.values(np.array(code)))


def run_one(name: str, seed: int, trials: int) -> dict[str, Any]:
    problem = DenseQuadratic(seed)
    study = optuna.create_study(sampler=SAMPLERS[name](seed))
    start = time.perf_counter()
    study.optimize(problem.objective, n_trials=trials)
    seconds = time.perf_counter() - start
    best = np.minimum.accumulate([t.value for t in study.trials])
    return {"curve": [float(v - problem.optimum) for v in best], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--fresh", default="", help="samplers whose cached studies rerun")
    parser.add_argument("--tag", default="", help="suffix of the cache folders (a variant)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    names = args.samplers.split(",")
    results: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        results[name] = []  # a tagged variant is shown under the sampler's name
        for seed in range(args.seeds):
            path = RESULTS / f"{name}{args.tag}" / f"{seed}.json"
            if path.exists() and name not in args.fresh.split(","):
                out = json.loads(path.read_text())
            else:
                out = run_one(name, seed, args.trials)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(out))
            results[name].append(out)
    at = args.trials
    print(f"## Dense quadratic, {GROUPS} groups x {VALUES}: regret, mean ± standard error")
    print(f"\n| sampler | seeds | @{at // 2} | @{at} | optimum found@{at} | s per study |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        cells = []
        for n in (at // 2, at):
            x = np.array([r["curve"][n - 1] for r in runs])
            se = x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else math.nan
            cells.append(f"{x.mean():.3f} ± {se:.3f}")
        found = np.mean([r["curve"][at - 1] < 1e-9 for r in runs])
        secs = np.mean([r["seconds"] for r in runs])
        print(f"| {name} | {len(runs)} | {' | '.join(cells)} | {found:.2f} | {secs:.1f} |")
    if "QUBO" in results and "GP" in results:
        diff = np.array(
            [
                q["curve"][at - 1] - g["curve"][at - 1]
                for q, g in zip(results["QUBO"], results["GP"])
            ]
        )
        se = diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else math.nan
        print(f"\nQUBO - GP at {at} (paired by seed): {diff.mean():+.3f} ± {se:.3f}")


if __name__ == "__main__":
    main()
