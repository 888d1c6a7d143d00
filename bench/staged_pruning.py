"""Benchmark 4 of the supernet issue: epochs spent by the StagedPruner vs evaluating every
candidate through all stages, on the same candidates (enqueued in the same order) and the
same trained supernet.

    python bench/staged_pruning.py --candidates 30
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidates", type=int, default=30)
    parser.add_argument("--supernet-epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import numpy as np
    import optuna
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.demo import demo_plan
    from optuna_hpcnas.evaluation import ObjectiveConfig
    from optuna_hpcnas.evaluation import SupernetObjective
    from optuna_hpcnas.pruners import StagedPruner
    from optuna_hpcnas.supernet import SupernetTrainingConfig

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    plan = demo_plan()
    last = plan.stages[-1].name
    objective = SupernetObjective(
        space,
        data,
        training=SupernetTrainingConfig(
            paths_per_batch=5,
            sampling="fair",
            epochs=args.supernet_epochs,
            batch_size=32,
            lr=0.01,
            weight_decay=0.0,
            seed=args.seed,
        ),
        plan=plan,
        config=ObjectiveConfig(
            latency_repeats=3, batch_size=32, optimizer="adam", last_stage=last
        ),
    )
    objective.train_supernet()
    rng = np.random.default_rng(args.seed)
    candidates = []
    while len(candidates) < args.candidates:
        arch = space.sample(rng)
        if arch not in candidates:
            candidates.append(arch)

    rows = {}
    for name, pruner in (
        ("every candidate, all stages", optuna.pruners.NopPruner()),
        ("StagedPruner", StagedPruner(plan)),
    ):
        study = optuna.create_study(direction="maximize", pruner=pruner)
        for arch in candidates:
            study.enqueue_trial(space.to_params(arch))
        t0 = time.perf_counter()
        study.optimize(objective, n_trials=len(candidates))
        seconds = time.perf_counter() - t0
        epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in study.trials)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = max(done, key=lambda t: t.value or 0.0)
        rows[name] = (epochs, seconds, best.value, best.user_attrs["arch"], study)

    full_name = "every candidate, all stages"
    full_epochs, full_seconds, _, _, full_study = rows[full_name]
    ranking = sorted(full_study.trials, key=lambda t: -(t.value or 0.0))
    rank_of = {t.user_attrs["arch"]: i + 1 for i, t in enumerate(ranking)}
    print(
        f"\nStaged pruning on {len(candidates)} digits-small candidates "
        f"(stages {[(s.name, s.epochs) for s in plan.stages]}, patience {plan.patience})"
    )
    print(
        f"{'method':<28} {'epochs':>7} {'saved':>7} {'seconds':>8} {'best acc':>9} "
        f"{'its rank*':>9}"
    )
    for name, (epochs, seconds, best, arch, _) in rows.items():
        saved = 1 - epochs / full_epochs
        print(
            f"{name:<28} {epochs:>7} {saved:>6.0%} {seconds:>8.1f} {best:>9.4f} {rank_of[arch]:>9}"
        )
    print("* rank of the chosen architecture when every candidate runs every stage")


if __name__ == "__main__":
    main()
