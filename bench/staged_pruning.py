"""Benchmark 4 of the supernet issue: steps spent by the StagedPruner vs evaluating every
candidate through all stages, on the same candidates (enqueued in the same order) and the
same trained supernet. ``--seeds`` repeats it on other candidate sets and supernets.

    python bench/staged_pruning.py --candidates 30 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidates", type=int, default=30)
    parser.add_argument("--supernet-epochs", type=int, default=8)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, one run each")
    parser.add_argument(
        "--plan",
        default="demo",
        choices=("demo", "articles"),
        help="demo: make demo's plan (quick 34 / medium 100 / full 270 steps of 32 images, "
        "Adam); articles: the articles' stages (1 / 5 / 50 epochs, lr 1e-3 / 1e-2 / 1e-1) cut "
        "to 1 / 2 / 15 passes over digits' 1,078 training images (34 / 68 / 510 steps, "
        "patience 102), with the SGD fine-tuning those rates are meant for",
    )
    parser.add_argument(
        "--promote", type=float, default=None, help="override the share every stage promotes"
    )
    parser.add_argument(
        "--finetune-lr", type=float, default=None, help="override the medium and full stages' lr"
    )
    parser.add_argument("--stage-schedule", default="cosine", choices=("constant", "cosine"))
    parser.add_argument(
        "--min-top-fidelity",
        type=float,
        default=None,
        help="add a row: StagedPruner(min_top_fidelity=...) (a stage weak within the top "
        "cuts only its bottom half)",
    )
    parser.add_argument("--fidelity-trials", type=int, default=10)
    args = parser.parse_args()
    totals: dict[str, Any] = {"steps": [0, 0], "same best": 0, "gap": []}
    seeds = [int(s) for s in args.seeds.split(",")]
    for seed in seeds:
        full, staged, gap = run(
            args.candidates,
            args.supernet_epochs,
            seed,
            args.plan,
            args.promote,
            args.stage_schedule,
            args.finetune_lr,
            args.min_top_fidelity,
            args.fidelity_trials,
        )
        totals["steps"][0] += full
        totals["steps"][1] += staged
        totals["same best"] += gap == 0.0
        totals["gap"].append(gap)
    if len(seeds) > 1:
        full, staged = totals["steps"]
        print(
            f"\nOver {len(seeds)} seeds: {staged} of {full} steps ({1 - staged / full:.0%} "
            f"saved); the StagedPruner's best equals the full evaluation's best in "
            f"{totals['same best']} of {len(seeds)}; largest accuracy gap "
            f"{max(totals['gap']):.4f}"
        )


def run(
    n_candidates: int,
    supernet_epochs: int,
    seed: int,
    plan_name: str,
    promote: float | None = None,
    stage_schedule: str = "cosine",
    finetune_lr: float | None = None,
    min_top_fidelity: float | None = None,
    fidelity_trials: int = 10,
) -> tuple[int, int, float]:
    """One comparison; returns (fine-tuning steps of the full evaluation, steps of the
    StagedPruner, best accuracy of the full evaluation minus the StagedPruner's)."""
    from _supernet_common import sample_architectures
    import optuna
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.demo import demo_plan
    from optuna_hpcnas.evaluation import ObjectiveConfig
    from optuna_hpcnas.evaluation import SupernetObjective
    from optuna_hpcnas.pruners import Stage
    from optuna_hpcnas.pruners import StagedPruner
    from optuna_hpcnas.pruners import StagePlan
    from optuna_hpcnas.supernet import SupernetTrainingConfig

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=seed)
    batch_size = 32
    if plan_name == "demo":
        plan = demo_plan()
    else:
        # the articles' 1 / 5 / 50 epochs scaled by 0.3, in passes over the training images
        # (34 steps each): early stopping after 3 passes without improvement, a validation
        # every pass
        per_pass = math.ceil(data.sizes[0] / batch_size)
        plan = StagePlan(
            stages=(
                Stage("quick", per_pass, 1e-3, promote=1 / 3),
                Stage("medium", 2 * per_pass, 1e-2, promote=1 / 3),
                Stage("full", 15 * per_pass, 1e-1),
            ),
            patience=3 * per_pass,
            eval_every=per_pass,
        )
    optimizer = "adam" if plan_name == "demo" else "sgd"
    stages = list(plan.stages)
    if promote is not None:
        stages = [dataclasses.replace(s, promote=promote) for s in stages]
    if finetune_lr is not None:
        stages[1:] = [dataclasses.replace(s, lr=finetune_lr) for s in stages[1:]]
    plan = dataclasses.replace(plan, stages=tuple(stages))
    last = plan.stages[-1].name
    objective = SupernetObjective(
        space,
        data,
        training=SupernetTrainingConfig(
            paths_per_batch=5,
            sampling="fair",
            epochs=supernet_epochs,
            batch_size=32,
            lr=0.01,
            weight_decay=0.0,
            seed=seed,
        ),
        plan=plan,
        config=ObjectiveConfig(
            latency_repeats=3,
            batch_size=batch_size,
            optimizer=optimizer,
            last_stage=last,
            stage_schedule=stage_schedule,
        ),
        threads=None,  # set above
    )
    objective.train_supernet()
    candidates = sample_architectures(space, n_candidates, seed)

    rows = {}
    pruners: list[tuple[str, optuna.pruners.BasePruner]] = [
        ("every candidate, all stages", optuna.pruners.NopPruner()),
        ("StagedPruner", StagedPruner(plan)),
    ]
    if min_top_fidelity is not None:
        weak = StagedPruner(
            plan, min_top_fidelity=min_top_fidelity, fidelity_trials=fidelity_trials
        )
        pruners.append((f"StagedPruner, top tau < {min_top_fidelity:g}", weak))
    for name, pruner in pruners:
        study = optuna.create_study(direction="maximize", pruner=pruner)
        for arch in candidates:
            study.enqueue_trial(space.to_params(arch))
        t0 = time.perf_counter()
        study.optimize(objective, n_trials=len(candidates))
        seconds = time.perf_counter() - t0
        steps = sum(int(t.user_attrs.get("steps", 0)) for t in study.trials)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = max(done, key=lambda t: t.value or 0.0)
        rows[name] = (steps, seconds, best.value, best.user_attrs["arch"], study)

    full_name = "every candidate, all stages"
    full_steps, full_seconds, _, _, full_study = rows[full_name]
    ranking = sorted(full_study.trials, key=lambda t: -(t.value or 0.0))
    rank_of = {t.user_attrs["arch"]: i + 1 for i, t in enumerate(ranking)}
    print(
        f"\nStaged pruning on {len(candidates)} digits-small candidates "
        f"(stages {[(s.name, s.steps, s.lr) for s in plan.stages]} in steps, patience "
        f"{plan.patience}, a validation every {plan.eval_every})"
    )
    print(
        f"{'method':<28} {'steps':>7} {'saved':>7} {'seconds':>8} {'best acc':>9} {'its rank*':>9}"
    )
    for name, (steps, seconds, best, arch, _) in rows.items():
        saved = 1 - steps / full_steps
        print(
            f"{name:<28} {steps:>7} {saved:>6.0%} {seconds:>8.1f} {best:>9.4f} {rank_of[arch]:>9}"
        )
    print("* rank of the chosen architecture when every candidate runs every stage")
    from optuna_hpcnas import _keys

    for name, (*_, study) in rows.items():
        taus: dict[str, list[float]] = {}
        for t in study.trials:
            for key, value in t.system_attrs.items():
                if key.startswith(_keys.PRUNER_TOP_FIDELITY):
                    stage = key[len(_keys.PRUNER_TOP_FIDELITY) :]
                    taus.setdefault(stage, []).append(float(value))
        for stage, read in taus.items():
            weak = sum(v < (min_top_fidelity or 0.0) for v in read)
            print(
                f"{name}: stage {stage!r} fidelity within the top read {len(read)} times, "
                f"tau {min(read):+.2f} to {max(read):+.2f}, weak {weak} times"
            )
    staged_steps, _, staged_best, _, _ = rows["StagedPruner"]
    return full_steps, staged_steps, rows[full_name][2] - staged_best


if __name__ == "__main__":
    main()
