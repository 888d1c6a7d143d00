"""Hardware-aware multi-objective search: accuracy against measured latency, with a limit.

Two objectives (maximise accuracy, minimise the latency measured on this machine) searched by
NSGA-II on weight-sharing evaluations. Architectures slower than ``--latency-limit-ms`` are
infeasible (``SupernetObjective`` records the limit through ``trial.set_constraint``), so the
Pareto front only holds candidates that fit the budget.

    python examples/hardware_aware.py --trials 40 --latency-limit-ms 0.5
"""

from __future__ import annotations

import argparse
import os

import optuna

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.evaluation import ObjectiveConfig
from optuna_hpcnas.evaluation import SupernetObjective
from optuna_hpcnas.pruners import Stage
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.supernet import SupernetTrainingConfig


def main() -> None:
    parser = argparse.ArgumentParser(description="Accuracy vs latency on digits")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=5, help="supernet training epochs")
    parser.add_argument(
        "--max-batches",
        type=int,
        default=None,
        help="cap batches per supernet epoch and scale the stages down (quick runs)",
    )
    parser.add_argument("--latency-limit-ms", type=float, default=0.5)
    parser.add_argument(
        "--storage", default=os.environ.get("OPTUNA_STORAGE", "sqlite:///examples.db")
    )
    parser.add_argument("--study-name", default="hardware-aware")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    # Each candidate is fine-tuned through a quick and a medium stage (a multi-objective study
    # runs no pruner): 17 and 85 steps at batch 64 (17 are a pass over digits' 1,078 training
    # images), SGD at lr 1e-3 then 1e-2. `--max-batches` scales it down for a smoke test.
    batch_size = 64
    scale = 1.0 if args.max_batches is None else min(1.0, args.max_batches / 17)
    plan = StagePlan(
        stages=(Stage("quick", 17, 1e-3), Stage("medium", 85, 1e-2)),
        scale=scale,
        eval_every=17,
    )
    objective = SupernetObjective(
        space,
        data,
        training=SupernetTrainingConfig(paths_per_batch=4, epochs=args.epochs, seed=args.seed),
        plan=plan,
        config=ObjectiveConfig(
            objectives=("accuracy", "latency"),
            max_latency_s=args.latency_limit_ms / 1000.0,
            batch_size=batch_size,
            latency_repeats=15,
        ),
        seed=args.seed,
    )
    objective.train_supernet(max_batches=args.max_batches)
    study = optuna.create_study(
        study_name=args.study_name,
        storage=args.storage,
        directions=objective.directions,
        sampler=optuna.samplers.NSGAIISampler(seed=args.seed, population_size=8),
        load_if_exists=True,
    )
    prepare_study(study, ["accuracy", "latency_s"])
    study.optimize(objective, n_trials=args.trials)
    save_dashboard_plots(study)
    front = sorted(study.best_trials, key=lambda t: -t.values[0])
    print(f"Pareto front within {args.latency_limit_ms} ms ({len(front)} architectures):")
    for t in front:
        print(
            f"  trial {t.number:3d}  accuracy {t.values[0]:.4f}  latency "
            f"{1000 * t.values[1]:.3f} ms  {t.user_attrs['arch_description']}"
        )
    print(f"\n  hpcnas best --storage {args.storage} --study-name {study.study_name}")


if __name__ == "__main__":
    main()
