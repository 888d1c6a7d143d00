"""Ranking fidelity of the supernet against stand-alone training, per task and remedy.

The candidates: ``--archs`` architectures drawn uniformly plus the search's top ``--top``
(the best inherited scores of the plain supernet among ``--pool`` more draws: the region a
search ends in). The ground truth: each candidate trained alone from scratch on the training
split with ``--gt-seeds`` seeds (``train_from_scratch``: Adam lr 2e-2, cosine, weight decay
1e-4; digits 170 steps at batch 32, MNIST-1D 100 steps at batch 64: 5 and 2 passes over the
training split, enough to separate the families), the mean validation log-loss. Candidates
and ground truth are cached under ``bench/results/`` (ignored by git) so every remedy is
ranked against the same truth; the noise ceiling is one seed's tau against the mean of the
others.

A run trains one supernet (``--set field=value`` adds any ``SupernetTrainingConfig`` field:
the remedies ``sandwich``, ``distillation``, ``progressive_epochs``, ``few_shot``,
``bn_recalibration_batches``) and scores every candidate inherited (BatchNorm recalibrated),
after the quick stage and after the medium stage (``--quick-steps``, ``--medium-steps``,
``--medium-lr``; by default 1 pass over the training split, then 4 more on digits, 1 on
MNIST-1D). It prints Kendall tau of each stage overall and within the top 10 % of the ground
truth, and the rows of earlier runs on the same ground truth
(``bench/results/fidelity_<task>_<seed>.jsonl``).

    python bench/ranking_fidelity.py --task digits
    python bench/ranking_fidelity.py --task mnist1d --label few-shot --set few_shot=auto
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"
# Per task: the space, the stand-alone recipe of the ground truth, the supernet and stages.
# Budgets in passes over the training split become optimisation steps at run time
# (``steps_per_pass``: 34 batches of 32 on digits, 50 of 64 on MNIST-1D); the supernet's
# warm-up stays in epochs.
TASKS: dict[str, dict[str, Any]] = {
    "digits": {
        "space": "digits-small",
        "scratch_passes": 5,  # 170 steps
        "batch_size": 32,
        "supernet_epochs": 24,
        "medium_passes": 4,  # 136 steps
        "medium_lr": 3e-3,
    },
    "mnist1d": {
        "space": "signal-1d",
        "scratch_passes": 2,  # 100 steps
        "batch_size": 64,
        "supernet_epochs": 10,
        "medium_passes": 1,  # 50 steps
        "medium_lr": 3e-3,
    },
}
SCRATCH_LR = 2e-2  # the stand-alone recipe's Adam learning rate


def load_task(task: str, seed: int) -> tuple[Any, Any]:
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.data import load_mnist1d_task

    if task == "digits":
        return HierarchicalSearchSpace.preset("digits-small"), load_digits_task(seed=seed)
    # One process runs every layout of the bench: the cluster level is fixed.
    space = HierarchicalSearchSpace.preset(
        "signal-1d", data_parallel=(1,), pipeline_stages=(1,), micro_batch_sizes=(32,)
    )
    return space, load_mnist1d_task(seed=seed)


def ground_truth(args: argparse.Namespace, space: Any, data: Any) -> dict[str, Any]:
    """The candidates and their stand-alone losses, read from the cache when it matches."""
    from _supernet_common import sample_architectures
    from _supernet_common import steps_per_pass
    from _supernet_common import train_supernet

    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import train_from_scratch

    task = TASKS[args.task]
    scratch_steps = task["scratch_passes"] * steps_per_pass(data, task["batch_size"])
    settings = {
        "task": args.task,
        "seed": args.seed,
        "archs": args.archs,
        "top": args.top,
        "pool": args.pool,
        "gt_seeds": args.gt_seeds,
        "scratch_steps": scratch_steps,
        "batch_size": task["batch_size"],
        "lr": SCRATCH_LR,
    }
    path = RESULTS / f"fidelity_{args.task}_{args.seed}_truth.json"
    if path.exists():
        cached = json.loads(path.read_text())
        if cached["settings"] == settings:
            return cached
    drawn = sample_architectures(space, args.archs + args.pool, args.seed)
    uniform, pool = drawn[: args.archs], drawn[args.archs :]
    t0 = time.perf_counter()
    plain = train_supernet(
        space,
        data,
        epochs=task["supernet_epochs"],
        paths=5,
        seed=args.seed,
        batch_size=task["batch_size"],
    )
    scores = [evaluate(plain.calibrated_subnet(a, data.train), data.valid)[1] for a in pool]
    top = [pool[int(i)] for i in np.argsort(scores)[: args.top]]
    print(f"top {args.top} of {args.pool} by the plain supernet: {time.perf_counter() - t0:.0f} s")
    archs = uniform + top
    losses, accuracies, seconds = [], [], []
    for k in range(args.gt_seeds):
        t0 = time.perf_counter()
        runs = [
            train_from_scratch(
                space,
                a,
                data,
                steps=scratch_steps,
                lr=SCRATCH_LR,
                batch_size=task["batch_size"],
                seed=args.seed + k,
                latency_repeats=0,
                holdout=True,  # the validation split is the reference: never trained on
            )
            for a in archs
        ]
        seconds.append(time.perf_counter() - t0)
        losses.append([r["valid_loss"] for r in runs])
        accuracies.append([r["valid_accuracy"] for r in runs])
        print(f"ground truth seed {args.seed + k}: {seconds[-1]:.0f} s")
    truth = {
        "settings": settings,
        "archs": [a.to_json() for a in archs],
        "search_top": list(range(args.archs, len(archs))),
        "loss": losses,
        "accuracy": accuracies,
        "seconds": seconds,
    }
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(truth))
    # Rows ranked against an older truth do not belong in the new table.
    path.with_name(f"fidelity_{args.task}_{args.seed}.jsonl").unlink(missing_ok=True)
    return truth


def taus(values: Any, truth: Any, top: Any) -> tuple[float, float]:
    """Kendall tau overall and within ``top`` (indices of the best ground truth)."""
    from scipy import stats

    values, truth = np.asarray(values), np.asarray(truth)
    return (
        float(stats.kendalltau(values, truth).statistic),
        float(stats.kendalltau(values[top], truth[top]).statistic),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", choices=sorted(TASKS), default="digits")
    parser.add_argument("--archs", type=int, default=50)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--pool", type=int, default=300)
    parser.add_argument("--gt-seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--supernet-epochs", type=int, default=None)
    parser.add_argument("--paths", type=int, default=5)
    parser.add_argument("--sampling", default="fair", choices=("uniform", "fair"))
    parser.add_argument(
        "--quick-steps", type=int, default=None, help="default: one pass over the training split"
    )
    parser.add_argument(
        "--medium-steps", type=int, default=None, help="default: the task's passes (4 / 1)"
    )
    parser.add_argument("--medium-lr", type=float, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--label", default="one-shot")
    parser.add_argument(
        "--inherited-only",
        action="store_true",
        help="score inherited weights only (a screening run: no quick or medium stage)",
    )
    parser.add_argument(
        "--through-core",
        action="store_true",
        help="score the stages with the evaluation core (TrialEvaluator) instead of this "
        "script's fine-tuning loop",
    )
    args = parser.parse_args()
    task = TASKS[args.task]
    for name in ("supernet_epochs", "medium_lr"):
        if getattr(args, name) is None:
            setattr(args, name, task[name])
    from _supernet_common import parse_value

    options = dict(item.split("=", 1) for item in args.set)
    options = {k: parse_value(v) for k, v in options.items()}

    from _supernet_common import FineTuning
    from _supernet_common import steps_per_pass
    from _supernet_common import train_supernet
    import torch

    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.search_space import Architecture

    torch.set_num_threads(1)
    space, data = load_task(args.task, args.seed)
    per_pass = steps_per_pass(data, task["batch_size"])
    if args.quick_steps is None:
        args.quick_steps = per_pass
    if args.medium_steps is None:
        args.medium_steps = task["medium_passes"] * per_pass
    truth = ground_truth(args, space, data)
    archs = [Architecture.from_json(a) for a in truth["archs"]]
    reference = np.mean(truth["loss"], axis=0)
    n_top = max(2, round(0.1 * len(archs)))
    top = np.argsort(reference)[:n_top]

    t0 = time.perf_counter()
    trainer = train_supernet(
        space,
        data,
        epochs=args.supernet_epochs,
        paths=args.paths,
        seed=args.seed,
        sampling=args.sampling,
        batch_size=task["batch_size"],
        **options,
    )
    supernet_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.through_core:
        scores = _core_scores(trainer, data, archs, args)
    else:
        scores = {"inherited": [], "quick": [], "medium": []}
        for arch in archs:
            model = trainer.calibrated_subnet(arch, data.train)
            scores["inherited"].append(evaluate(model, data.valid)[1])
            if args.inherited_only:
                continue
            tuning = FineTuning(model, data, seed=args.seed, batch_size=task["batch_size"])
            scores["quick"].append(tuning.stage(args.quick_steps, 1e-3, anneal=False)[1])
            scores["medium"].append(
                tuning.stage(args.medium_steps, args.medium_lr, anneal=True)[1]
            )
    stage_seconds = time.perf_counter() - t0

    row = {
        "label": args.label,
        "options": options,
        "supernet_epochs": args.supernet_epochs,
        "paths": args.paths,
        "sampling": args.sampling,
        "medium": f"{args.medium_steps} st lr {args.medium_lr:g}",
        "split": getattr(trainer.supernet, "decision", ""),
        "disagreement": trainer.disagreement,
        "taus": {
            stage: taus(values, reference, top) for stage, values in scores.items() if values
        },
        "supernet_seconds": supernet_seconds,
        "stage_seconds": stage_seconds,
        "scores": scores,
    }
    rows_path = RESULTS / f"fidelity_{args.task}_{args.seed}.jsonl"
    with rows_path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    print_table(args, truth, reference, top, rows)


def print_table(
    args: argparse.Namespace, truth: dict[str, Any], reference: Any, top: Any, rows: list
) -> None:
    task = TASKS[args.task]
    n, k = len(reference), len(truth["loss"])
    print(
        f"\nRanking fidelity on {args.task} ({task['space']}, data seed {args.seed}): {n} "
        f"candidates ({args.archs} uniform + the search's top {args.top} of {args.pool}); "
        f"ground truth: stand-alone {truth['settings']['scratch_steps']} steps, mean validation "
        "log-loss "
        f"of {k} seeds ({', '.join(f'{s:.0f}' for s in truth['seconds'])} s each); "
        f"Kendall tau overall / within the top {len(top)} (10 %)"
    )
    print(
        f"{'remedy':<30} {'split':<14} {'supernet':>8} {'stages':>7} "
        f"{'inherited':>13} {'quick':>13} {'medium':>13}"
    )
    for row in rows:
        cells = " ".join(
            f"{row['taus'][s][0]:>6.3f}/{row['taus'][s][1]:>6.3f}"
            if s in row["taus"]
            else f"{'-':>13}"
            for s in ("inherited", "quick", "medium")
        )
        label = f"{row['label']} ({row['medium']})"
        print(
            f"{label:<30} {row['split'] or '-':<14} {row['supernet_seconds']:>7.0f}s "
            f"{row['stage_seconds']:>6.0f}s {cells}"
        )
    # The peer: one more stand-alone training scored against the others (the noise ceiling).
    ceilings = []
    for i in range(k):
        others = np.mean([truth["loss"][j] for j in range(k) if j != i], axis=0)
        ceilings.append(taus(truth["loss"][i], others, top))
    mean = np.mean(ceilings, axis=0)
    print(
        f"{'one stand-alone seed vs the others (peer)':<54} "
        f"{'':>13} {'':>13} {mean[0]:>6.3f}/{mean[1]:>6.3f}"
    )
    last = rows[-1]
    if last["disagreement"]:
        ranked = sorted(last["disagreement"].items(), key=lambda kv: -kv[1])
        print(
            "gradient disagreement per decision: " + ", ".join(f"{d} {v:.3f}" for d, v in ranked)
        )


def _core_scores(
    trainer: object, data: object, archs: list, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Validation log-loss of each candidate inherited, after the quick and after the medium
    stage, through ``TrialEvaluator`` (each trial's own batch order, cosine lr per stage)."""
    from _supernet_common import steps_per_pass
    import optuna

    from optuna_hpcnas.evaluation import ObjectiveConfig
    from optuna_hpcnas.evaluation import OptunaTrialLink
    from optuna_hpcnas.evaluation import TrialEvaluator
    from optuna_hpcnas.evaluation import TrialPlan
    from optuna_hpcnas.pruners import Stage
    from optuna_hpcnas.pruners import StagePlan

    batch_size = TASKS[args.task]["batch_size"]
    config = ObjectiveConfig(
        objectives=("loss",),
        optimizer="adam",
        batch_size=batch_size,
        latency_repeats=1,
        validation="holdout",  # the ground truth's validation split, as the loop above
    )
    core = TrialEvaluator(data, trainer, config, seed=args.seed)  # type: ignore[arg-type]
    stages = StagePlan(
        stages=(
            Stage("quick", args.quick_steps, 1e-3),
            Stage("medium", args.medium_steps, args.medium_lr),
        ),
        eval_every=steps_per_pass(data, batch_size),  # a validation a pass, as before
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    plan = TrialPlan(stages, stages.total_steps, report=True, maximize=False)
    from optuna_hpcnas.evaluation import evaluate

    scores: dict[str, list[float]] = {"inherited": [], "quick": [], "medium": []}
    for arch in archs:
        model = trainer.calibrated_subnet(arch, data.train)  # type: ignore[attr-defined]
        scores["inherited"].append(evaluate(model, data.valid)[1])  # type: ignore[attr-defined]
        trial = study.ask()
        outcome = core.evaluate(arch, OptunaTrialLink(trial, plan))
        study.tell(trial, outcome.values)
        frozen = study.trials[-1]
        scores["quick"].append(frozen.intermediate_values[args.quick_steps])
        scores["medium"].append(frozen.intermediate_values[stages.total_steps])
    return scores


if __name__ == "__main__":
    main()
