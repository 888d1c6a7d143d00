"""Ranking fidelity of the supernet against a ground-truth table (``bench/ground_truth.py``),
as a share of the table's own noise ceiling.

One run trains one supernet on the table's space (``--set field=value`` adds any
``SupernetTrainingConfig`` field: ``sandwich``, ``distillation``, ``progressive_epochs``,
``few_shot``, ``bn_recalibration_batches``) and scores every architecture of the table:
inherited (BatchNorm recalibrated, no fine-tuning), after a quick stage and after a medium stage
of fine-tuning (``--quick-passes``, ``--medium-passes``; ``--inherited-only`` skips them).
``--recalibration-batches 1 2 4`` scores the same trained supernet once more per count of
recalibration batches (one result row each, inherited only): the speed of one-shot scoring
against its fidelity, the supernet's training left out of the comparison.
``--score-variants`` ranks the same subnets once more by their error rate and by their
temperature-scaled log-loss (one row each). Each
score is the validation log-loss; Kendall tau against the table's mean over seeds, overall and
within the table's top 10 %, beside the noise ceiling (two disjoint halves of the seeds).
Every architecture the table will hold is scored (``ground_truth.architectures``), so a run
may start while the table is still being built; rows accumulate in
``bench/results/fidelity_truth_<task>.jsonl`` (ignored by git) and the table of every run so
far is printed against the table as it is.

    python bench/fidelity_vs_truth.py --task digits-elastic --label sandwich+kd \\
        --set sandwich=true --set distillation=0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ground_truth import DATA
from _ground_truth import ground_truth
from _ground_truth import held_out_top_ceiling
from _ground_truth import noise_ceiling
from _ground_truth import read_with_shards
from _ground_truth import taus
from _supernet_common import parse_value
from ground_truth import load_task
from ground_truth import TASKS

RESULTS = Path(__file__).resolve().parent / "results"


def score(args: argparse.Namespace, options: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the supernet and score every architecture of the table: one result row, and one
    more per count of ``--recalibration-batches`` (inherited scores only)."""
    from _supernet_common import FineTuning
    from _supernet_common import steps_per_pass
    from _supernet_common import train_supernet
    from ground_truth import architectures

    from optuna_hpcnas.evaluation import evaluate

    space, data = load_task(args.task)
    archs = [a for a, _ in architectures(args.task, space, args.archs)]
    batch_size = TASKS[args.task]["batch_size"]
    per_pass = steps_per_pass(data, batch_size)
    cpu = time.process_time()
    trainer = train_supernet(
        space, data, epochs=args.supernet_epochs, paths=args.paths, seed=args.seed,
        sampling=args.sampling, batch_size=batch_size, **options,
    )  # fmt: skip
    supernet_cpu = time.process_time() - cpu
    cpu = time.process_time()
    scores: dict[str, dict[str, float]] = {"inherited": {}, "quick": {}, "medium": {}}
    inherited_cpu = 0.0
    for arch in archs:
        key = arch.to_json()
        started = time.process_time()
        model = trainer.calibrated_subnet(arch, data.train)
        scores["inherited"][key] = evaluate(model, data.valid)[1]
        inherited_cpu += time.process_time() - started
        if args.inherited_only:
            continue
        tuning = FineTuning(model, data, seed=args.seed, batch_size=batch_size)
        quick = tuning.stage(args.quick_passes * per_pass, 1e-3, anneal=False)
        scores["quick"][key] = quick[1]
        medium = tuning.stage(args.medium_passes * per_pass, args.medium_lr, anneal=True)
        scores["medium"][key] = medium[1]
    scoring_cpu = time.process_time() - cpu
    rows = [
        _row(
            args, args.label, options, scores, supernet_cpu, scoring_cpu, inherited_cpu, len(archs)
        )
    ]
    default = trainer.config
    for batches in args.recalibration_batches:
        trainer.config = dataclasses.replace(default, bn_recalibration_batches=batches)
        cpu = time.process_time()
        inherited = {
            arch.to_json(): evaluate(trainer.calibrated_subnet(arch, data.train), data.valid)[1]
            for arch in archs
        }
        spent = time.process_time() - cpu
        rows.append(
            _inherited_row(
                args,
                f"{args.label}, BN {batches}",
                {**options, "bn_recalibration_batches": batches},
                inherited,
                supernet_cpu,
                spent,
            )  # fmt: skip
        )
    trainer.config = default
    if args.score_variants:
        variants: dict[str, dict[str, float]] = {"accuracy": {}, "calibrated log-loss": {}}
        cpu = time.process_time()
        for arch in archs:
            model = trainer.calibrated_subnet(arch, data.train)
            errors, calibrated = score_variants(model, data.valid)
            variants["accuracy"][arch.to_json()] = errors
            variants["calibrated log-loss"][arch.to_json()] = calibrated
        spent = time.process_time() - cpu
        for name, inherited in variants.items():
            rows.append(
                _inherited_row(
                    args,
                    f"{args.label}, {name}",
                    {**options, "score": name},
                    inherited,
                    supernet_cpu,
                    spent,
                )  # fmt: skip
            )
    return rows


def score_variants(model: Any, dataset: Any) -> tuple[float, float]:
    """Two other inherited scores of one subnet on ``dataset``: its error rate (ties broken by
    the log-loss, a thousandth of a sample's weight) and its log-loss after temperature
    scaling (Guo et al. 2017: the one temperature that minimises it), which leaves out how
    (mis)calibrated the shared weights leave a subnet's confidence."""
    import torch
    import torch.nn.functional as F

    from optuna_hpcnas.data import iterate_batches

    model.eval()
    with torch.no_grad():
        pairs = [(model(x).float(), y) for x, y in iterate_batches(dataset, 512)]
    logits = torch.cat([p[0] for p in pairs])
    labels = torch.cat([p[1] for p in pairs])
    loss = float(F.cross_entropy(logits, labels))
    error = float((logits.argmax(1) != labels).float().mean())
    temperatures = torch.logspace(-1.5, 1.5, 61)
    calibrated = min(float(F.cross_entropy(logits / t, labels)) for t in temperatures)
    return error + 1e-3 * loss / len(labels), calibrated


def _inherited_row(
    args: argparse.Namespace,
    label: str,
    options: dict[str, Any],
    inherited: dict[str, float],
    supernet_cpu: float,
    spent: float,
) -> dict[str, Any]:
    """A row of inherited scores alone, the scoring of every architecture ``spent`` CPU s."""
    return _row(
        args, label, options, {"inherited": inherited}, supernet_cpu, spent, spent, len(inherited)
    )


def _row(
    args: argparse.Namespace,
    label: str,
    options: dict[str, Any],
    scores: dict[str, dict[str, float]],
    supernet_cpu: float,
    scoring_cpu: float,
    inherited_cpu: float,
    n_archs: int,
) -> dict[str, Any]:
    return {
        "label": label,
        "options": options,
        "supernet_epochs": args.supernet_epochs,
        "paths": args.paths,
        "sampling": args.sampling,
        "seed": args.seed,
        "scores": {stage: values for stage, values in scores.items() if values},
        "supernet_cpu_seconds": supernet_cpu,
        "scoring_cpu_seconds": scoring_cpu,
        "inherited_cpu_seconds": inherited_cpu,
        "per_architecture_ms": 1000 * scoring_cpu / n_archs,
    }


def print_table(task: str, truth: Any, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    nan = float("nan")
    ceiling = noise_ceiling(truth) if len(truth.seeds) > 1 else (nan, nan)
    held_out = held_out_top_ceiling(truth) if len(truth.seeds) > 2 else nan
    once = float(truth.cpu_seconds.sum(axis=1).mean())  # training every architecture once
    print(
        f"\nRanking fidelity on {task}: {len(truth.archs)} architectures x {len(truth.seeds)} "
        f"seeds trained alone ({meta.get('passes')} passes, {once:.0f} CPU s a seed); Kendall "
        f"tau overall / within the top 10 %, and as a share of the noise ceiling "
        f"({ceiling[0]:.3f} / {ceiling[1]:.3f}; within a top chosen on a held-out seed "
        f"{held_out:.3f}); the inherited pick's rank by the table's mean and the CPU of "
        "supernet + inherited scoring against training the table once"
    )
    header = f"{'remedy':<28} {'supernet':>9} {'ms/arch':>8}"
    for stage in ("inherited", "quick", "medium"):
        header += f" {stage:>22}"
    print(header + f" {'pick':>5} {'x less':>7}")
    for row in rows:
        line = (
            f"{row['label']:<28} {row['supernet_cpu_seconds']:>8.0f}s "
            f"{row['per_architecture_ms']:>8.0f}"
        )
        complete = True
        for stage in ("inherited", "quick", "medium"):
            values = row["scores"].get(stage, {})
            if not all(a in values for a in truth.archs):
                line += f" {'-':>22}"
                complete = complete and stage != "inherited"
                continue
            overall, within = taus([values[a] for a in truth.archs], truth)
            share = overall / ceiling[0] if ceiling[0] > 0 else nan
            line += f" {overall:>6.3f}/{within:>6.3f} ({share:>4.0%})"
        inherited = row["scores"].get("inherited", {})
        if complete and "inherited_cpu_seconds" in row:
            pick = min(truth.archs, key=lambda a: inherited[a])
            cost = row["supernet_cpu_seconds"] + row["inherited_cpu_seconds"] * len(
                truth.archs
            ) / len(inherited)
            line += f" {truth.rank_of(pick):>5} {once / cost:>6.1f}x"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="digits-elastic")
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--supernet-epochs", type=int, default=24)
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--sampling", default="uniform", choices=("uniform", "fair"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--archs", type=int, default=300, help="as the table was built")
    parser.add_argument("--quick-passes", type=int, default=1)
    parser.add_argument("--medium-passes", type=int, default=4)
    parser.add_argument("--medium-lr", type=float, default=3e-3)
    parser.add_argument("--inherited-only", action="store_true")
    parser.add_argument(
        "--recalibration-batches", type=int, nargs="*", default=[], metavar="N",
        help="also score the same supernet with N BatchNorm recalibration batches",
    )  # fmt: skip
    parser.add_argument(
        "--score-variants", action="store_true",
        help="also rank by inherited error rate and by temperature-scaled log-loss",
    )  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--label", default="one-shot")
    parser.add_argument("--table-only", action="store_true", help="print the earlier runs")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    options = {k: parse_value(v) for k, v in (item.split("=", 1) for item in args.set)}
    path = RESULTS / f"fidelity_truth_{args.task}.jsonl"
    if not args.table_only:
        new_rows = score(args, options)
        RESULTS.mkdir(exist_ok=True)
        with path.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in new_rows)
    rows_, meta = read_with_shards(args.task, args.data_dir)
    truth = ground_truth(rows_)
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    print_table(args.task, truth, meta, rows)


if __name__ == "__main__":
    main()
