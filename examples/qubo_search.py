"""QUBO search on a small space: a surrogate written as a binary quadratic model and solved
by simulated annealing (``QUBOSampler``), against random search on the same budget.

The objective is a cheap, deterministic proxy of accuracy (trained for ``--steps`` steps of
Adam at batch 32, 34 by default: one pass over digits' 1,078 training images);
on ``digits-small`` (1,536 architectures) the QUBO sampler fits its second-order surrogate on
the one-hot encoding of every finished trial and anneals for the next candidate.

    python examples/qubo_search.py --trials 40
"""

from __future__ import annotations

from _common import parse_args
from _common import print_next_steps
import optuna

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.evaluation import train_from_scratch
from optuna_hpcnas.samplers import QUBOSampler


def main() -> None:
    # 34 steps of 32 images: one pass over digits' 1,078 training images
    args = parse_args("QUBO search on digits-small", trials=40, steps=34)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    cache: dict[str, float] = {}

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        key = arch.to_json()
        if key not in cache:  # the same architecture trains to the same accuracy
            result = train_from_scratch(
                space, arch, data, steps=args.steps, lr=2e-2, batch_size=32, seed=args.seed,
                latency_repeats=0,
            )  # fmt: skip
            cache[key] = float(result["valid_accuracy"])
        record_trial(trial, arch, stage=f"{args.steps} steps")
        return cache[key]

    name = args.study_name or "qubo-search"
    results = {}
    for label, sampler in (
        ("qubo", QUBOSampler(seed=args.seed, n_startup_trials=min(10, args.trials // 2))),
        ("random", optuna.samplers.RandomSampler(seed=args.seed)),
    ):
        study = optuna.create_study(
            study_name=f"{name}-{label}", storage=args.storage, direction="maximize",
            sampler=sampler, load_if_exists=True,
        )  # fmt: skip
        prepare_study(study, ["accuracy"])
        study.optimize(objective, n_trials=args.trials)
        save_dashboard_plots(study)
        results[label] = study
    for label, study in results.items():
        print(f"{label:7s} best accuracy {study.best_value:.4f} after {len(study.trials)} trials")
    best = results["qubo"].best_trial
    print(f"QUBO best: {best.user_attrs['arch_description']}")
    print_next_steps(results["qubo"], args.storage)


if __name__ == "__main__":
    main()
