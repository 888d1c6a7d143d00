"""Hardware-aware multi-objective search: accuracy against measured latency, with a limit.

Two objectives (maximise accuracy, minimise latency on this machine) searched by NSGA-II;
architectures slower than ``--latency-limit-ms`` are infeasible through
``trial.set_constraint``, so the Pareto front only holds candidates that fit the budget.

    python examples/hardware_aware.py --trials 40 --latency-limit-ms 0.5
"""

from __future__ import annotations

import argparse
import os

import optuna

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.evaluation import train_from_scratch

LATENCY = "latency_limit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--latency-limit-ms", type=float, default=0.5)
    parser.add_argument(
        "--storage", default=os.environ.get("OPTUNA_STORAGE", "sqlite:///examples.db")
    )
    parser.add_argument("--study-name", default="hardware-aware")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    limit_s = args.latency_limit_ms / 1000.0
    study = optuna.create_study(
        study_name=args.study_name,
        storage=args.storage,
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.NSGAIISampler(seed=args.seed, population_size=8),
        load_if_exists=True,
    )
    prepare_study(study, ["accuracy", "latency_s"])

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        arch = space.suggest(trial)
        result = train_from_scratch(
            space, arch, data, epochs=args.epochs, seed=args.seed, latency_repeats=15
        )
        latency = float(result["latency_s"])
        # Feasible when <= 0: the sampler prefers feasible trials, the front ignores others.
        trial.set_constraint(LATENCY, latency - limit_s)
        record_trial(
            trial, arch, flops=result["flops"], params=result["params"], latency_s=latency,
            stage=f"{args.epochs} epochs",
        )  # fmt: skip
        return float(result["valid_accuracy"]), latency

    study.optimize(objective, n_trials=args.trials)
    save_dashboard_plots(study)
    front = sorted(study.best_trials, key=lambda t: -t.values[0])
    print(f"Pareto front within {args.latency_limit_ms} ms ({len(front)} architectures):")
    for t in front:
        print(
            f"  trial {t.number:3d}  accuracy {t.values[0]:.4f}  latency "
            f"{1000 * t.values[1]:.3f} ms  {t.user_attrs['architecture_summary']}"
        )
    print(f"\n  hpcnas best --storage {args.storage} --study-name {study.study_name}")


if __name__ == "__main__":
    main()
