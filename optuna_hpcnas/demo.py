"""``make demo``: a complete weight-sharing search on scikit-learn's digits, on a laptop.

Trains a supernet of the ``digits-small`` space, searches it with Optuna (EvolutionarySampler
by default) and the ``StagedPruner`` into a SQLite file, prints the best architectures with
accuracy, FLOPs and latency, retrains the best one from scratch and reports its test accuracy,
and prints the command that opens optuna-dashboard on the result.

Run ``python -m optuna_hpcnas.demo --help`` for the options.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
import json
import logging
import os
from pathlib import Path
import sys
import time
from typing import Any

import optuna

_logger = logging.getLogger(__name__)


def demo_plan() -> Any:
    """The stages used on digits (1,078 training images, 34 batches of 32 a pass): the
    articles' plan, shortened, with learning rates for Adam fine-tuning.
    """
    from optuna_hpcnas.pruners import Stage
    from optuna_hpcnas.pruners import StagePlan

    return StagePlan(
        stages=(
            Stage("quick", 34, 1e-3, promote=1 / 3),
            Stage("medium", 100, 1e-2, promote=1 / 3),
            Stage("full", 270, 1e-2),
        ),
        patience=100,
        eval_every=34,
    )


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """The sampler ``name`` (``SamplerConfig``'s names); ``tpe`` is multivariate and grouped."""
    from optuna_hpcnas.samplers import SamplerConfig

    kwargs = {"multivariate": True, "group": True, "constant_liar": False} if name == "tpe" else {}
    return SamplerConfig(name=name, seed=seed, kwargs=kwargs).build()


def _objective(
    space: Any,
    data: Any,
    seed: int,
    supernet_epochs: int,
    paths_per_batch: int,
) -> Any:
    """The demo's evaluation core: a fair k-path supernet, Adam fine-tuning."""
    from optuna_hpcnas.evaluation import ObjectiveConfig
    from optuna_hpcnas.evaluation import SupernetObjective
    from optuna_hpcnas.supernet import SupernetTrainingConfig

    return SupernetObjective(
        space,
        data,
        training=SupernetTrainingConfig(
            paths_per_batch=paths_per_batch,
            sampling="fair",
            epochs=supernet_epochs,
            batch_size=32,
            lr=0.01,
            weight_decay=0.0,
            seed=seed,
        ),
        config=ObjectiveConfig(latency_repeats=5, batch_size=32, optimizer="adam"),
        seed=seed,
        threads=None,  # run_demo set them (--threads)
    )


@dataclass(frozen=True)
class DemoResult:
    """What the demo found and how long it took."""

    storage: str
    study_name: str
    best_architecture: str
    best_valid_accuracy: float
    retrained_test_accuracy: float
    trials: int
    complete_trials: int
    pruned_trials: int
    test_images: int
    supernet_seconds: float
    search_seconds: float
    retrain_seconds: float
    total_seconds: float


def run_demo(
    *,
    storage: str = "sqlite:///hpcnas-demo.db",
    study_name: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    n_trials: int = 300,
    timeout: float = 75.0,
    supernet_epochs: int = 8,
    paths_per_batch: int = 5,
    retrain_steps: int = 1000,
    threads: int = 1,
    seed: int = 0,
    top: int = 5,
    plan: Any = None,
    warmup_max_batches: int | None = None,
    out: Any = print,
) -> DemoResult:
    """Run the whole demo; ``out`` receives the lines to show (``print`` by default).

    ``plan`` (a ``StagePlan``, ``demo_plan()`` by default), ``warmup_max_batches`` (supernet
    batches per epoch) and ``retrain_steps`` shrink it further, e.g. for a smoke test.
    """
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.search_space import Architecture

    start = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=seed)
    out(
        "digits: {} train / {} valid / {} test images; ".format(*data.sizes)
        + f"space digits-small ({space.cardinality():,} architectures)"
    )
    objective = _objective(space, data, seed, supernet_epochs, paths_per_batch)
    supernet_seconds = _warm_up(
        objective, supernet_epochs, paths_per_batch, warmup_max_batches, out
    )

    name = study_name or f"digits-demo-{int(time.time())}"
    study, search_seconds = _search(
        storage, name, sampler or make_sampler("evolutionary", seed), plan, objective,
        n_trials, timeout,
    )  # fmt: skip
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    out(
        f"search: {len(trials)} trials in {search_seconds:.1f} s "
        f"({len(done)} complete, {len(pruned)} pruned by the StagedPruner)"
    )
    if not done:
        raise RuntimeError("No trial completed; raise --timeout.")
    ranked = sorted(done, key=lambda t: t.value or 0.0, reverse=True)[:top]
    _print_top(ranked, out)
    best = ranked[0]
    arch = Architecture.from_json(best.user_attrs["arch"])
    result, retrain_seconds = _retrain(space, arch, data, retrain_steps, seed, out)
    total = time.perf_counter() - start
    out(f"total wall time {total:.1f} s")
    out(f"open the study: optuna-dashboard {storage}")
    return DemoResult(
        storage=storage,
        study_name=name,
        best_architecture=arch.describe(),
        best_valid_accuracy=float(best.value or 0.0),
        retrained_test_accuracy=float(result["test_accuracy"]),
        trials=len(trials),
        complete_trials=len(done),
        pruned_trials=len(pruned),
        test_images=data.sizes[2],
        supernet_seconds=supernet_seconds,
        search_seconds=search_seconds,
        retrain_seconds=retrain_seconds,
        total_seconds=total,
    )


def _warm_up(objective: Any, epochs: int, paths: int, max_batches: int | None, out: Any) -> float:
    """Train the supernet (k fair paths per batch); its seconds."""
    t0 = time.perf_counter()
    losses = objective.train_supernet(max_batches=max_batches)
    seconds = time.perf_counter() - t0
    out(
        f"supernet: {epochs} epochs x {paths} paths per batch in "
        f"{seconds:.1f} s (loss {losses[0]:.2f} -> {losses[-1]:.2f})"
    )
    return seconds


def _search(
    storage: str,
    name: str,
    sampler: optuna.samplers.BaseSampler,
    plan: Any,
    objective: Any,
    n_trials: int,
    timeout: float,
) -> tuple[optuna.Study, float]:
    """The study (EvolutionarySampler, StagedPruner) after the search, and its seconds."""
    from optuna_hpcnas.pruners import StagedPruner

    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction="maximize",
        sampler=sampler,
        pruner=StagedPruner(plan if plan is not None else demo_plan()),
    )
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=n_trials, timeout=timeout)
    return study, time.perf_counter() - t0


def _retrain(
    space: Any, arch: Any, data: Any, steps: int, seed: int, out: Any
) -> tuple[dict[str, Any], float]:
    """The best architecture trained from scratch (Adam 2e-2, batches of 32), and the
    seconds it took."""
    from optuna_hpcnas.evaluation import train_from_scratch

    t0 = time.perf_counter()
    result = train_from_scratch(space, arch, data, steps=steps, lr=2e-2, batch_size=32, seed=seed)
    seconds = time.perf_counter() - t0
    verdict = "meets" if result["test_accuracy"] >= 0.97 else "MISSES"
    out("")
    out(
        f"best architecture retrained from scratch ({steps} steps, "
        f"{seconds:.1f} s): test accuracy {result['test_accuracy']:.4f} "
        f"({verdict} the 0.97 target), valid accuracy {result['valid_accuracy']:.4f}"
    )
    return result, seconds


def _print_top(ranked: Sequence[optuna.trial.FrozenTrial], out: Any) -> None:
    """The best trials with accuracy, FLOPs, parameters and latency."""
    out("")
    out(f"{'#':>3} {'valid acc':>9} {'kFLOPs':>8} {'params':>7} {'latency':>9}  architecture")
    for t in ranked:
        ua = t.user_attrs
        out(
            f"{t.number:>3} {t.value:>9.4f} {ua['flops'] / 1e3:>8.1f} {int(ua['params']):>7} "
            f"{ua['latency_s'] * 1e3:>7.3f}ms  {ua['arch_description']}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optuna_hpcnas.demo", description=__doc__)
    parser.add_argument("--storage", default="sqlite:///hpcnas-demo.db")
    parser.add_argument("--study-name", default=None)
    parser.add_argument(
        "--sampler", default="evolutionary", choices=("tpe", "random", "nsga2", "evolutionary")
    )
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=75.0, help="search seconds")
    parser.add_argument("--supernet-epochs", type=int, default=8)
    parser.add_argument("--paths", type=int, default=5, help="paths per supernet batch")
    parser.add_argument("--retrain-steps", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("HPCNAS_THREADS", 1)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the result as JSON to this file"
    )
    args = parser.parse_args(argv)
    from optuna_hpcnas._openmp import passive_openmp

    passive_openmp()  # before torch loads (in run_demo)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = run_demo(
        storage=args.storage,
        study_name=args.study_name,
        sampler=make_sampler(args.sampler, args.seed),
        n_trials=args.trials,
        timeout=args.timeout,
        supernet_epochs=args.supernet_epochs,
        paths_per_batch=args.paths,
        retrain_steps=args.retrain_steps,
        threads=args.threads,
        seed=args.seed,
    )
    if args.json is not None:
        record = {
            **dataclasses.asdict(result),
            "timeout_s": args.timeout,
            "threads": args.threads,
            "date": time.strftime("%Y-%m-%d"),
            "command": "python -m optuna_hpcnas.demo "
            + " ".join(sys.argv[1:] if argv is None else argv),
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if result.retrained_test_accuracy >= 0.97 else 1


if __name__ == "__main__":
    raise SystemExit(main())
