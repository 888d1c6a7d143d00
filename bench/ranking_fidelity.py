"""Benchmarks 1 and 2 of the supernet issue, on the same candidates in one run.

1. Ranking fidelity: Kendall tau and Spearman rho between the supernet scores of N
   ``digits-small`` architectures at each stage (inherited weights; after the quick stage;
   after the medium stage) and their stand-alone training from scratch.
2. Search cost: wall time of the weight-sharing evaluation (supernet training once, then
   each candidate's stages) vs training every candidate from scratch.

    python bench/ranking_fidelity.py --archs 50
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", type=int, default=50)
    parser.add_argument("--supernet-epochs", type=int, default=12)
    parser.add_argument("--paths", type=int, default=5)
    parser.add_argument("--sampling", default="fair", choices=("uniform", "fair"))
    parser.add_argument("--finetune-optimizer", default="adam", choices=("adam", "sgd"))
    parser.add_argument("--scratch-epochs", type=int, default=5)
    parser.add_argument("--quick-epochs", type=int, default=1)
    parser.add_argument("--medium-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--medium-schedule",
        default="cosine",
        choices=("constant", "cosine"),
        help="medium-stage lr: constant, or the reference's recipe (cosine to 0, weight decay)",
    )
    args = parser.parse_args()

    from scipy import stats
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import iterate_batches
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import train_from_scratch
    from optuna_hpcnas.supernet import SuperNet
    from optuna_hpcnas.supernet import SupernetTrainer
    from optuna_hpcnas.supernet import SupernetTrainingConfig
    from optuna_hpcnas.supernet import train_step

    torch.set_num_threads(1)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    archs = []
    seen = set()
    while len(archs) < args.archs:
        arch = space.sample(rng)
        if arch not in seen:
            seen.add(arch)
            archs.append(arch)

    t0 = time.perf_counter()
    net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
    trainer = SupernetTrainer(
        net,
        SupernetTrainingConfig(
            paths_per_batch=args.paths,
            sampling=args.sampling,
            epochs=args.supernet_epochs,
            batch_size=32,
            lr=0.01,
            weight_decay=0.0,
            seed=args.seed,
        ),
    )
    trainer.fit(data.train)
    supernet_seconds = time.perf_counter() - t0

    scores: dict[str, list[float]] = {"inherited": [], "quick": [], "medium": []}
    accuracies: dict[str, list[float]] = {"inherited": [], "quick": [], "medium": []}
    stage_seconds = {"inherited": 0.0, "quick": 0.0, "medium": 0.0}
    for i, arch in enumerate(archs):
        t0 = time.perf_counter()
        model = trainer.calibrated_subnet(arch, data.train)
        acc, loss = evaluate(model, data.valid)
        scores["inherited"].append(loss)
        accuracies["inherited"].append(acc)
        stage_seconds["inherited"] += time.perf_counter() - t0
        optimizer: torch.optim.Optimizer
        if args.finetune_optimizer == "adam":
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
        generator = torch.Generator().manual_seed(i)
        for stage, epochs, lr in (
            ("quick", args.quick_epochs, 1e-3),
            ("medium", args.medium_epochs, 1e-2),
        ):
            t0 = time.perf_counter()
            cosine = stage == "medium" and args.medium_schedule == "cosine"
            for group in optimizer.param_groups:
                group["lr"] = lr
                # The stand-alone recipe: weight decay 1e-4 and the lr annealed to 0, so that
                # the score is read at a converged point rather than mid-step noise.
                group["weight_decay"] = 1e-4 if cosine else 0.0
            steps = epochs * -(-len(data.train) // 32)
            step = 0
            for _ in range(epochs):
                model.train()
                for x, y in iterate_batches(data.train, 32, shuffle=True, generator=generator):
                    if cosine:
                        for group in optimizer.param_groups:
                            group["lr"] = 0.5 * lr * (1.0 + np.cos(np.pi * step / steps))
                    train_step(model, optimizer, x, y, [None], grad_clip=5.0)
                    step += 1
            acc, loss = evaluate(model, data.valid)
            scores[stage].append(loss)
            accuracies[stage].append(acc)
            stage_seconds[stage] += time.perf_counter() - t0

    t0 = time.perf_counter()
    reference = []
    reference_acc = []
    for arch in archs:
        r = train_from_scratch(
            space, arch, data, epochs=args.scratch_epochs, seed=args.seed, latency_repeats=0
        )
        reference.append(r["valid_loss"])
        reference_acc.append(r["valid_accuracy"])
    scratch_seconds = time.perf_counter() - t0
    # The reference is itself noisy: the same training with another seed bounds the fidelity
    # any cheaper estimate can reach.
    second = [
        train_from_scratch(
            space, arch, data, epochs=args.scratch_epochs, seed=args.seed + 1, latency_repeats=0
        )
        for arch in archs
    ]

    n = len(archs)
    print(
        f"\nsupernet: {args.supernet_epochs} epochs, {args.paths} paths per batch "
        f"({args.sampling}); fine-tuning: {args.finetune_optimizer}, quick lr 1e-3, "
        f"medium lr 1e-2 ({args.medium_schedule})"
    )
    print(
        f"Ranking fidelity on {n} digits-small architectures vs stand-alone training "
        f"({args.scratch_epochs} epochs); validation log-loss (accuracy in brackets)"
    )
    print(f"{'stage':<10} {'epochs':>6} {'kendall tau':>16} {'spearman rho':>16} {'target':>8}")
    epochs_of = {"inherited": 0, "quick": args.quick_epochs}
    epochs_of["medium"] = args.quick_epochs + args.medium_epochs
    for stage, values in scores.items():
        tau = stats.kendalltau(values, reference).statistic
        rho = stats.spearmanr(values, reference).statistic
        tau_a = stats.kendalltau(accuracies[stage], reference_acc).statistic
        rho_a = stats.spearmanr(accuracies[stage], reference_acc).statistic
        target = "tau>=0.6" if stage == "medium" else ""
        print(
            f"{stage:<10} {epochs_of[stage]:>6} {tau:>7.3f} ({tau_a:>6.3f}) "
            f"{rho:>7.3f} ({rho_a:>6.3f}) {target:>8}"
        )
    second_loss = [r["valid_loss"] for r in second]
    second_acc = [r["valid_accuracy"] for r in second]
    print(
        f"{'scratch*':<10} {args.scratch_epochs:>6} "
        f"{stats.kendalltau(second_loss, reference).statistic:>7.3f} "
        f"({stats.kendalltau(second_acc, reference_acc).statistic:>6.3f}) "
        f"{stats.spearmanr(second_loss, reference).statistic:>7.3f} "
        f"({stats.spearmanr(second_acc, reference_acc).statistic:>6.3f})"
    )
    print("* the reference training again with another seed: the noise ceiling")
    print(
        f"(reference accuracy: min {min(reference_acc):.3f}, median "
        f"{float(np.median(reference_acc)):.3f}, max {max(reference_acc):.3f})"
    )

    print(f"\nSearch cost for the same {n} candidates (one CPU thread)")
    print(f"{'method':<42} {'seconds':>8} {'vs scratch':>10}")
    print(f"{'train every candidate from scratch':<42} {scratch_seconds:>8.1f} {1.0:>9.1f}x")
    cumulative = supernet_seconds
    for stage in ("inherited", "quick", "medium"):
        cumulative += stage_seconds[stage]
        label = f"supernet ({supernet_seconds:.0f} s) + {stage} stage"
        print(f"{label:<42} {cumulative:>8.1f} {scratch_seconds / cumulative:>9.1f}x")
    per_scratch = scratch_seconds / n
    per_inherited = stage_seconds["inherited"] / n
    size = space.cardinality()
    whole = supernet_seconds + size * per_inherited
    print(
        f"{'extrapolated to all ' + str(size) + ': scratch':<42} {size * per_scratch:>8.0f}"
        f" {1.0:>9.1f}x"
    )
    print(
        f"{'extrapolated: supernet + inherited':<42} {whole:>8.0f} "
        f"{size * per_scratch / whole:>9.1f}x"
    )
    print(
        f"per candidate: scratch {per_scratch:.2f} s, inherited {per_inherited:.3f} s "
        f"({per_scratch / per_inherited:.0f}x); the supernet pays off after "
        f"{supernet_seconds / max(per_scratch - per_inherited, 1e-9):.0f} candidates"
    )


if __name__ == "__main__":
    main()
