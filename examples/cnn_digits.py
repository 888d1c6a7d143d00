"""CNN architecture search on scikit-learn's digits (8x8 images), one process.

Every trial trains its candidate from scratch for a few epochs and reports the validation
accuracy; FLOPs, parameters and latency go to the trial's user attributes (optuna-dashboard
shows them), and Prometheus metrics are served while it runs.

    python examples/cnn_digits.py --trials 30 --epochs 3
    hpcnas dashboard --storage sqlite:///examples.db
"""

from __future__ import annotations

from _common import parse_args
from _common import print_next_steps
import optuna

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.dashboard import DashboardCallback
from optuna_hpcnas.dashboard import prepare_study
from optuna_hpcnas.dashboard import record_trial
from optuna_hpcnas.dashboard import save_dashboard_plots
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.evaluation import train_from_scratch
from optuna_hpcnas.metrics import MetricsCallback
from optuna_hpcnas.metrics import SearchMetrics
from optuna_hpcnas.metrics import serve_metrics
from optuna_hpcnas.metrics import TimedSampler
from optuna_hpcnas.samplers import EvolutionarySampler


def main() -> None:
    args = parse_args("CNN search on digits", trials=30, epochs=3)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    metrics = SearchMetrics()
    study = optuna.create_study(
        study_name=args.study_name or "cnn-digits",
        storage=args.storage,
        direction="maximize",
        sampler=TimedSampler(EvolutionarySampler(seed=args.seed), metrics=metrics),
        load_if_exists=True,
    )
    prepare_study(study, ["accuracy"])

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        result = train_from_scratch(
            space, arch, data, epochs=args.epochs, seed=args.seed, latency_repeats=5
        )
        record_trial(
            trial,
            arch,
            flops=result["flops"],
            params=result["params"],
            latency_s=result["latency_s"],
            stage=f"{args.epochs} epochs",
        )
        return float(result["valid_accuracy"])

    with serve_metrics(metrics, port=0) as server:
        print(f"Prometheus metrics on {server.url}")
        study.optimize(
            objective,
            n_trials=args.trials,
            callbacks=[MetricsCallback(metrics, n_trials=args.trials), DashboardCallback(every=5)],
        )
    save_dashboard_plots(study)
    best = study.best_trial
    print(f"best accuracy {best.value:.4f}: {best.user_attrs['architecture_summary']}")
    print(f"  {best.user_attrs['flops']:.0f} FLOPs, {best.user_attrs['params']} parameters")
    print_next_steps(study, args.storage)


if __name__ == "__main__":
    main()
