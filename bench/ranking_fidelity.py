"""Benchmarks 1 and 2 of the supernet issue, on the same candidates in one run.

1. Ranking fidelity: Kendall tau and Spearman rho between the supernet scores of N
   ``digits-small`` architectures at each stage (inherited weights; after the quick stage;
   after the medium stage) and stand-alone training from scratch as long as the medium stage
   (``--scratch-epochs``); ``--full-epochs N`` adds a reference of N-epoch trainings (the
   full stage: the source articles measure their stages against the final ranking).
   Each reference is the mean validation log-loss of ``--reference-seeds`` trainings (as
   NAS-Bench-201 averages seeds); one more seed, scored against the same reference, is the
   peer: what training every candidate from scratch once would reach.
2. Search cost: wall time of the weight-sharing evaluation (supernet training once, then each
   candidate's stages) vs training every candidate from scratch once. ``search_cost.py`` does
   the same over the whole space, with screening.

    python bench/ranking_fidelity.py --archs 50
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import sys
import time

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", type=int, default=50)
    parser.add_argument("--supernet-epochs", type=int, default=24)
    parser.add_argument("--paths", type=int, default=5)
    parser.add_argument("--sampling", default="fair", choices=("uniform", "fair"))
    parser.add_argument("--scratch-epochs", type=int, default=5)
    parser.add_argument(
        "--full-epochs",
        type=int,
        default=0,
        help="also rank against stand-alone training this long (the full stage; 0: skip)",
    )
    parser.add_argument("--quick-epochs", type=int, default=1)
    parser.add_argument("--medium-epochs", type=int, default=4)
    parser.add_argument("--medium-lr", type=float, default=3e-3)
    parser.add_argument("--reference-seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--through-core",
        action="store_true",
        help="score the stages with the evaluation core that the API, `hpcnas run` and MPI "
        "groups use (TrialEvaluator: a study with the candidates queued, every epoch "
        "reported), instead of this script's own fine-tuning loop",
    )
    args = parser.parse_args()

    from _supernet_common import FineTuning
    from _supernet_common import sample_architectures
    from _supernet_common import train_supernet
    from scipy import stats
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import train_from_scratch

    torch.set_num_threads(1)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    archs = sample_architectures(space, args.archs, args.seed)

    t0 = time.perf_counter()
    trainer = train_supernet(
        space,
        data,
        epochs=args.supernet_epochs,
        paths=args.paths,
        seed=args.seed,
        sampling=args.sampling,
    )
    supernet_seconds = time.perf_counter() - t0

    scores: dict[str, list[float]] = {"inherited": [], "quick": [], "medium": []}
    seconds = {"inherited": 0.0, "fine-tuning": 0.0}
    if args.through_core:
        scores, seconds = _core_scores(trainer, data, archs, args)
    for arch in archs if not args.through_core else []:
        t0 = time.perf_counter()
        model = trainer.calibrated_subnet(arch, data.train)
        scores["inherited"].append(evaluate(model, data.valid)[1])
        t1 = time.perf_counter()
        tuning = FineTuning(model, data, seed=args.seed)
        scores["quick"].append(tuning.stage(args.quick_epochs, 1e-3, anneal=False)[1])
        scores["medium"].append(tuning.stage(args.medium_epochs, args.medium_lr, anneal=True)[1])
        seconds["inherited"] += t1 - t0
        seconds["fine-tuning"] += time.perf_counter() - t1

    def scratch_runs(epochs: int) -> tuple[list[list[float]], float]:
        """Validation log-losses of every candidate for each of the reference seeds and the
        peer seed; and the seconds of the first seed."""
        runs, first_seconds = [], 0.0
        for k in range(args.reference_seeds + 1):
            t0 = time.perf_counter()
            runs.append(
                [
                    train_from_scratch(
                        space, a, data, epochs=epochs, seed=args.seed + k, latency_repeats=0
                    )["valid_loss"]
                    for a in archs
                ]
            )
            if k == 0:
                first_seconds = time.perf_counter() - t0
        return runs, first_seconds

    short_runs, scratch_seconds = scratch_runs(args.scratch_epochs)
    references = [(args.scratch_epochs, short_runs)]
    if args.full_epochs:
        references.insert(0, (args.full_epochs, scratch_runs(args.full_epochs)[0]))

    n = len(archs)
    print(
        f"\nsupernet: {args.supernet_epochs} epochs, {args.paths} paths per batch "
        f"({args.sampling}); fine-tuning with Adam, the same batch order for every "
        f"candidate: quick lr 1e-3, medium lr {args.medium_lr:g} annealed to 0"
    )
    epochs_of = {
        "inherited": 0,
        "quick": args.quick_epochs,
        "medium": args.quick_epochs + args.medium_epochs,
    }
    for epochs, runs in references:
        reference = np.mean(runs[: args.reference_seeds], axis=0)
        first = runs[0]
        print(
            f"\nRanking fidelity on {n} digits-small architectures vs stand-alone training "
            f"for {epochs} epochs: validation log-loss; reference = mean of "
            f"{args.reference_seeds} seeds (one seed in the last column)"
        )
        print(
            f"{'stage':<26} {'epochs':>6} {'kendall tau':>11} {'spearman rho':>12} "
            f"{'tau, 1 seed':>11} {'target':>8}"
        )
        rows = [(stage, epochs_of[stage], values) for stage, values in scores.items()]
        peer_seed = args.seed + args.reference_seeds
        for peer_epochs, peer_runs in references[::-1]:
            rows.append((f"from scratch, seed {peer_seed}*", peer_epochs, peer_runs[-1]))
        for label, stage_epochs, values in rows:
            target = "tau>=0.6" if label == "medium" else ""
            print(
                f"{label:<26} {stage_epochs:>6} "
                f"{stats.kendalltau(values, reference).statistic:>11.3f} "
                f"{stats.spearmanr(values, reference).statistic:>12.3f} "
                f"{stats.kendalltau(values, first).statistic:>11.3f} {target:>8}"
            )
    print(
        "* a seed not in the references: the peer (training every candidate from scratch "
        "once), and the noise ceiling of any one training"
    )

    print(f"\nSearch cost for the same {n} candidates (one CPU thread)")
    print(f"{'method':<46} {'seconds':>8} {'vs scratch':>10}")
    print(f"{'train every candidate from scratch once':<46} {scratch_seconds:>8.1f} {1.0:>9.1f}x")
    cumulative = supernet_seconds
    for stage in ("inherited", "fine-tuning"):
        cumulative += seconds[stage]
        what = "inherited scores" if stage == "inherited" else "quick + medium for all"
        label = f"supernet ({supernet_seconds:.0f} s) + {what}"
        print(f"{label:<46} {cumulative:>8.1f} {scratch_seconds / cumulative:>9.1f}x")
    per_scratch = scratch_seconds / n
    per_inherited = seconds["inherited"] / n
    print(
        f"per candidate: scratch {per_scratch:.2f} s, inherited {per_inherited:.3f} s "
        f"({per_scratch / per_inherited:.0f}x), quick + medium "
        f"{seconds['fine-tuning'] / n:.2f} s; the supernet pays off after "
        f"{supernet_seconds / max(per_scratch - per_inherited, 1e-9):.0f} candidates"
    )


def _core_scores(
    trainer: object, data: object, archs: list, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Validation log-loss of each candidate inherited, after the quick and after the medium
    stage, through ``TrialEvaluator`` (each trial's own batch order, cosine lr per stage)."""
    import optuna

    from optuna_hpcnas.evaluation import ObjectiveConfig
    from optuna_hpcnas.evaluation import OptunaTrialLink
    from optuna_hpcnas.evaluation import TrialEvaluator
    from optuna_hpcnas.evaluation import TrialPlan
    from optuna_hpcnas.pruners import Stage
    from optuna_hpcnas.pruners import StagePlan

    config = ObjectiveConfig(
        objectives=("loss",), optimizer="adam", batch_size=32, latency_repeats=1
    )
    core = TrialEvaluator(data, trainer, config, seed=args.seed)  # type: ignore[arg-type]
    stages = StagePlan(
        stages=(
            Stage("quick", args.quick_epochs, 1e-3),
            Stage("medium", args.medium_epochs, args.medium_lr),
        )
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    plan = TrialPlan(stages, stages.total_epochs, report=True, maximize=False)
    from optuna_hpcnas.evaluation import evaluate

    scores: dict[str, list[float]] = {"inherited": [], "quick": [], "medium": []}
    seconds = {"inherited": 0.0, "fine-tuning": 0.0}
    for arch in archs:
        t0 = time.perf_counter()
        model = trainer.calibrated_subnet(arch, data.train)  # type: ignore[attr-defined]
        scores["inherited"].append(evaluate(model, data.valid)[1])  # type: ignore[attr-defined]
        t1 = time.perf_counter()
        trial = study.ask()
        outcome = core.evaluate(arch, OptunaTrialLink(trial, plan))
        study.tell(trial, outcome.values)
        frozen = study.trials[-1]
        scores["quick"].append(frozen.intermediate_values[args.quick_epochs])
        scores["medium"].append(frozen.intermediate_values[stages.total_epochs])
        seconds["inherited"] += t1 - t0
        seconds["fine-tuning"] += time.perf_counter() - t1
    return scores, seconds


if __name__ == "__main__":
    main()
