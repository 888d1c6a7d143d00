"""Search a space with your own operator (``own_ops.py``) beside the built-in ones.

The operator is registered with its metadata (family, domains, which micro parameters it
has) and a factory that builds its weight-sharing module; the ``sequence`` preset then offers
it to every cell. Each candidate trains from scratch for ``--steps`` steps (as
``sequence_attention.py``); the summary prints each operator's mean accuracy. The same search
from a TOML file: ``own_operator.toml``.

    python examples/own_operator.py --trials 20 --steps 36
"""

from __future__ import annotations

from _common import parse_args
from _common import print_next_steps
import optuna
from own_ops import make_squeeze_excite

from optuna_hpcnas import Architecture
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas import OperatorRegistry
from optuna_hpcnas import OperatorSpec
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial
from optuna_hpcnas.data import make_sequence_task
from optuna_hpcnas.evaluation import train_from_scratch


def main() -> None:
    args = parse_args("A search with your own operator", trials=20, steps=36)
    registry = OperatorRegistry.default()
    registry.register(
        OperatorSpec("se", family="se", domains={"sequence"}, factory=make_squeeze_excite)
    )
    space = HierarchicalSearchSpace.preset(
        "sequence",
        operators=("transformer", "attention", "conv1d", "identity", "se"),
        registry=registry,
        data_parallel=(1,), pipeline_stages=(1,), micro_batch_sizes=(32,),
    )  # fmt: skip
    data = make_sequence_task(num_samples=600, seed=args.seed)
    study = optuna.create_study(
        study_name=args.study_name or "own-operator",
        storage=args.storage,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=args.seed, multivariate=True, group=True),
        load_if_exists=True,
    )
    prepare_study(study, ["accuracy"])
    # the first trial uses the new operator, so it is surely tried
    study.enqueue_trial(
        {"node.topology": "residual", "node.cell0.op": "se", "node.cell1.op": "conv1d",
         "node.cell1.kernel": 5, "node.cell1.width": 64, "node.cell2.op": "se",
         "node.cell3.op": "attention", "node.cell3.heads": 2},
        skip_if_exists=True,
    )  # fmt: skip

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
    ops: dict[str, list[float]] = {}
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        for cell in Architecture.from_json(t.user_attrs["arch"]).cells:
            ops.setdefault(cell.op, []).append(float(t.value))
    print("mean accuracy of trials using each operator:")
    for op, values in sorted(ops.items(), key=lambda kv: -sum(kv[1]) / len(kv[1])):
        print(f"  {op:12s} {sum(values) / len(values):.3f}  ({len(values)} cells)")
    print_next_steps(study, args.storage)


if __name__ == "__main__":
    main()
