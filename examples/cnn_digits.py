"""Weight-sharing CNN search on scikit-learn's digits (8x8 images), one process.

A supernet of the ``digits-small`` space is trained once (several random paths per batch);
every trial inherits its subnet's weights, fine-tunes it stage by stage (quick, medium,
full: budgets of optimisation steps, here 1, 2 and 15 passes over the training images) and is
stopped early by the ``StagedPruner`` when it falls behind. The
``EvolutionarySampler`` proposes the architectures. FLOPs, parameters, latency and the stage
reached go to user attributes (optuna-dashboard shows them), Prometheus metrics are served
while it runs, and the supernet weights are saved for ``hpcnas export --weights``.

    python examples/cnn_digits.py --trials 30
    hpcnas best --storage sqlite:///examples.db --study-name cnn-digits
    hpcnas export --storage sqlite:///examples.db --study-name cnn-digits --weights supernet.pt
"""

from __future__ import annotations

import argparse
import os

import optuna
import torch

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import DashboardCallback
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.evaluation import ObjectiveConfig
from optuna_hpcnas.evaluation import SupernetObjective
from optuna_hpcnas.metrics import MetricsCallback
from optuna_hpcnas.metrics import SearchMetrics
from optuna_hpcnas.metrics import serve_metrics
from optuna_hpcnas.metrics import TimedSampler
from optuna_hpcnas.pruners import Stage
from optuna_hpcnas.pruners import StagedPruner
from optuna_hpcnas.pruners import StagePlan
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.supernet import SupernetTrainingConfig


def main() -> None:
    parser = argparse.ArgumentParser(description="Weight-sharing CNN search on digits")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=5, help="supernet training epochs")
    parser.add_argument(
        "--max-batches",
        type=int,
        default=None,
        help="cap batches per supernet epoch and scale the stages down (quick runs)",
    )
    parser.add_argument(
        "--storage", default=os.environ.get("OPTUNA_STORAGE", "sqlite:///examples.db")
    )
    parser.add_argument("--study-name", default="cnn-digits")
    parser.add_argument("--weights", default="supernet.pt", help="where to save the supernet")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    # Stage budgets are optimisation steps (17 are one pass over digits' 1,078 training
    # images at batch 64): the articles' quick / medium / full stages (SGD at lr 1e-3 / 1e-2 /
    # 1e-1), early stopping after 51 steps without improvement. `--max-batches` scales the
    # plan down for a smoke test.
    batch_size = 64
    scale = 1.0 if args.max_batches is None else min(1.0, args.max_batches / 17)
    plan = StagePlan(
        stages=(
            Stage("quick", 17, 1e-3, promote=1 / 3),
            Stage("medium", 34, 1e-2, promote=1 / 3),
            Stage("full", 255, 1e-1),
        ),
        patience=51,
        eval_every=17,
        scale=scale,
    )
    objective = SupernetObjective(
        space,
        data,
        training=SupernetTrainingConfig(paths_per_batch=4, epochs=args.epochs, seed=args.seed),
        config=ObjectiveConfig(batch_size=batch_size, latency_repeats=5),
        seed=args.seed,
    )
    losses = objective.train_supernet(max_batches=args.max_batches)
    print(f"supernet trained: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    torch.save(objective.supernet.state_dict(), args.weights)

    metrics = SearchMetrics()
    study = optuna.create_study(
        study_name=args.study_name,
        storage=args.storage,
        direction="maximize",
        sampler=TimedSampler(EvolutionarySampler(seed=args.seed), metrics=metrics),
        pruner=StagedPruner(plan),
        load_if_exists=True,
    )
    prepare_study(study, ["accuracy"])
    with serve_metrics(metrics, port=0) as server:
        print(f"Prometheus metrics on {server.url}")
        study.optimize(
            objective,
            n_trials=args.trials,
            callbacks=[MetricsCallback(metrics, n_trials=args.trials), DashboardCallback(every=5)],
        )
    save_dashboard_plots(study)
    best = study.best_trial
    print(f"best accuracy {best.value:.4f}: {best.user_attrs['arch_description']}")
    print(
        f"  {best.user_attrs['flops']:.0f} FLOPs, {best.user_attrs['params']} parameters, "
        f"stage {best.user_attrs.get('stage', '-')}"
    )
    print(f"\nstudy {study.study_name!r}: {len(study.trials)} trials in {args.storage}")
    print(f"  hpcnas best --storage {args.storage} --study-name {study.study_name}")
    print(
        f"  hpcnas export --storage {args.storage} --study-name {study.study_name} "
        f"--weights {args.weights}"
    )
    print(f"  hpcnas dashboard --storage {args.storage}")


if __name__ == "__main__":
    main()
