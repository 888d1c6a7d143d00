"""Transformer / self-attention / conv1d search on a synthetic sequence task, one process.

The task plants one of four motifs at a random position of a noisy sequence; the class is the
motif. The space mixes transformer blocks, self-attention, 1-D convolutions and identity cells
with searched widths, heads, expansion ratios and kernels.

Each candidate trains from scratch for ``--steps`` steps of Adam at batch 32 (36 by default:
three passes over the 361 training sequences).

    python examples/sequence_attention.py --trials 20 --steps 36
"""

from __future__ import annotations

from _common import parse_args
from _common import print_next_steps
import optuna

from optuna_hpcnas import Architecture
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.data import make_sequence_task
from optuna_hpcnas.evaluation import train_from_scratch


def main() -> None:
    # 36 steps of 32 sequences: three passes over the 361 training sequences
    args = parse_args("Attention search on a sequence task", trials=20, steps=36)
    # One process: the cluster layout (data parallel x pipeline) is fixed, not searched.
    space = HierarchicalSearchSpace.preset(
        "sequence", data_parallel=(1,), pipeline_stages=(1,), micro_batch_sizes=(32,)
    )
    data = make_sequence_task(num_samples=600, seed=args.seed)
    study = optuna.create_study(
        study_name=args.study_name or "sequence-attention",
        storage=args.storage,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=args.seed, multivariate=True, group=True),
        load_if_exists=True,
    )
    prepare_study(study, ["accuracy"])

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        result = train_from_scratch(
            space, arch, data, steps=args.steps, lr=2e-2, batch_size=32, seed=args.seed,
            latency_repeats=5,
        )  # fmt: skip
        record_trial(
            trial, arch, flops=result["flops"], params=result["params"],
            latency_s=result["latency_s"], stage=f"{args.steps} steps",
        )  # fmt: skip
        return float(result["valid_accuracy"])

    study.optimize(objective, n_trials=args.trials)
    save_dashboard_plots(study)
    ops = {}
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            for cell in Architecture.from_json(t.user_attrs["arch"]).cells:
                ops.setdefault(cell.op, []).append(t.value)
    print("mean accuracy of trials using each operator:")
    for op, values in sorted(ops.items(), key=lambda kv: -sum(kv[1]) / len(kv[1])):
        print(f"  {op:12s} {sum(values) / len(values):.3f}  ({len(values)} cells)")
    print(f"best: {study.best_value:.4f} {study.best_trial.user_attrs['arch_description']}")
    print_next_steps(study, args.storage)


if __name__ == "__main__":
    main()
