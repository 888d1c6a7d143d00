"""Milliseconds per ask as a study grows: EvolutionarySampler against TPE in the same process.

Issue 22: a long study (8 categorical parameters of 5 values and one float, a cheap black box)
asked in 100-trial batches. Every sampler advances one batch in turn, so a neighbour's load
falls on all of them alike; the time is the CPU time of ``ask`` plus the suggestions
(``time.process_time``, one BLAS/OpenMP thread: the time on an idle core). TPE
(multivariate, as ``bench/sampler_suite.py``) and plain aging evolution
(``surrogate=None``) are the peers; TPE stops at ``--peer-trials`` (its asks grow with the
study), EvolutionarySampler goes on to ``--trials``.

    python bench/ask_growth.py                       # 5,000 trials, TPE to 2,000
    python bench/ask_growth.py --trials 600 --peer-trials 600 --batch 100   # smoke
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import math
import time
import warnings

import numpy as np
import optuna
from threadpoolctl import threadpool_limits

from optuna_hpcnas.samplers import EvolutionarySampler

N_CATEGORICAL = 8
CHOICES = list(range(5))


def make_objective(seed: int) -> Callable[[optuna.Trial], float]:
    """A fixed random function of 8 categorical parameters (with pairwise terms) and a float."""
    rng = np.random.default_rng(seed)
    linear = rng.normal(0.0, 1.0, (N_CATEGORICAL, len(CHOICES)))
    pairs = rng.normal(0.0, 0.5, (N_CATEGORICAL, N_CATEGORICAL, len(CHOICES), len(CHOICES)))

    def objective(trial: optuna.Trial) -> float:
        code = [trial.suggest_categorical(f"c{i}", CHOICES) for i in range(N_CATEGORICAL)]
        x = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        value = sum(linear[i, c] for i, c in enumerate(code))
        value += sum(pairs[i, i + 1, code[i], code[i + 1]] for i in range(N_CATEGORICAL - 1))
        return float(value + (math.log10(x) + 2.5) ** 2)

    return objective


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "Evolution": lambda s: EvolutionarySampler(seed=s),
    "Evolution plain": lambda s: EvolutionarySampler(seed=s, surrogate=None),
    "TPE": lambda s: optuna.samplers.TPESampler(multivariate=True, seed=s),
}


def advance(study: optuna.Study, objective: Callable[[optuna.Trial], float], n: int) -> float:
    """CPU seconds of ``n`` asks (with their suggestions); each trial is told at once."""
    spent = 0.0
    for _ in range(n):
        start = time.process_time()
        trial = study.ask()
        value = objective(trial)  # the suggestions: relative samples are handed out here
        spent += time.process_time() - start
        study.tell(trial, value)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--peer-trials", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    objective = make_objective(args.seed)
    studies = {
        name: optuna.create_study(sampler=make(args.seed)) for name, make in SAMPLERS.items()
    }
    names = list(studies)
    print(f"## ms per ask by trial batch (CPU time, one thread; batch {args.batch})\n")
    print("| trials | " + " | ".join(names) + " | Evolution / TPE |")
    print("|---|" + "---|" * (len(names) + 1))
    for start in range(0, args.trials, args.batch):
        ms: dict[str, float] = {}
        for name, study in studies.items():
            limit = args.trials if name.startswith("Evolution") else args.peer_trials
            if start < limit:
                ms[name] = 1000.0 * advance(study, objective, args.batch) / args.batch
        cells = [f"{ms[n]:.1f}" if n in ms else "-" for n in names]
        ratio = f"{ms['Evolution'] / ms['TPE']:.2f}" if "TPE" in ms else "-"
        print(f"| {start + 1}-{start + args.batch} | {' | '.join(cells)} | {ratio} |", flush=True)


if __name__ == "__main__":
    with threadpool_limits(1):
        main()
