"""Build the project's ground-truth tables: architectures trained alone, several seeds each,
to the budget where the best of them stop improving.

Three steps per task (``--task digits``: the ``digits-small`` space on scikit-learn's digits;
``mnist1d-elastic`` / ``mnist1d-mixed``: the ``signal-elastic`` / ``signal-1d`` spaces on
MNIST-1D, generator seed 42, with the published models of the space added):

1. ``budget``: ``--archs`` architectures (uniform) trained once at each budget of ``--passes``
   (passes over the training split, cosine learning rate to the end of each); prints the mean
   validation log-loss of the best 10 % at each budget and the first budget after which
   doubling gains less than ``--tolerance`` (the "plateau"); rows in
   ``bench/data/ground_truth_<task>_budget.parquet``.
2. ``build``: ``--archs`` architectures x ``--seeds`` training seeds at ``--passes`` (the
   plateau), rows flushed as they come and on SIGINT / SIGTERM (a killed build resumes;
   ``--shard i --num-shards n`` splits the work between processes, ``merge`` folds the
   shards in).
3. ``report``: the table's size, CPU time, content hash and noise ceiling; ``plot``: the
   budget curve of step 1 as ``docs/images/ground_truth_budget_<task>.png``.

Every training is ``optuna_hpcnas.evaluation.train_from_scratch`` on the training split alone
(Adam, cosine, weight decay 1e-4, one thread); the validation split is the reference and the
test split is reported. The table's metadata records the command, recipe, CPU seconds and a
content hash (``bench/_ground_truth.py`` reads it back and checks the hash).

    python bench/ground_truth.py budget --task digits --archs 30 --passes 2 4 8 16 32 64
    nohup python bench/ground_truth.py build --task digits --archs 300 --seeds 5 --passes 16 &
    python bench/ground_truth.py report --task digits
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
import os
from pathlib import Path
import shlex
import signal
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ground_truth import DATA
from _ground_truth import ground_truth
from _ground_truth import held_out_top_ceiling
from _ground_truth import noise_ceiling
from _ground_truth import read_table
from _ground_truth import read_with_shards
from _ground_truth import table_path
from _ground_truth import TOP_SHARE
from _ground_truth import write_table

# Per task: the space (one process's cluster layout), the data and the stand-alone recipe.
TASKS: dict[str, dict[str, Any]] = {
    "digits": {"preset": "digits-small", "data": "digits", "batch_size": 32, "lr": 1e-2},
    "mnist1d-elastic": {
        "preset": "signal-elastic",
        "data": "mnist1d",
        "batch_size": 64,
        "lr": 4e-3,
    },
    "digits-elastic": {"preset": "digits-elastic", "data": "digits", "batch_size": 32, "lr": 1e-2},
    "mnist1d-mixed": {"preset": "signal-1d", "data": "mnist1d", "batch_size": 64, "lr": 4e-3},
}
ARCH_SEED = 0  # which architectures a table holds
DATA_SEED = 0  # the train / validation split
MNIST1D_GENERATOR_SEED = 42


def load_task(task: str) -> tuple[Any, Any]:
    """The space of ``task`` (cluster level fixed: one process trains each model) and its data."""
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.data import load_mnist1d_task

    spec = TASKS[task]
    if spec["data"] == "digits":
        return HierarchicalSearchSpace.preset(spec["preset"]), load_digits_task(seed=DATA_SEED)
    space = HierarchicalSearchSpace.preset(
        spec["preset"], data_parallel=(1,), pipeline_stages=(1,), micro_batch_sizes=(32,)
    )
    return space, load_mnist1d_task(seed=DATA_SEED, generator_seed=MNIST1D_GENERATOR_SEED)


def architectures(task: str, space: Any, n: int) -> list[tuple[Any, str]]:
    """``n`` distinct architectures drawn uniformly (the whole space in order when it has at
    most ``n``), then the space's published models not drawn already: ``(arch, name)``."""
    from _supernet_common import sample_architectures

    from optuna_hpcnas.search_space import reference_models

    drawn = [(a, "") for a in sample_architectures(space, n, ARCH_SEED)]
    seen = {a for a, _ in drawn}
    for name, params in reference_models(TASKS[task]["preset"]).items():
        arch = space.from_params(params)
        if arch not in seen:
            drawn.append((arch, name))
            seen.add(arch)
    return drawn


def train_row(
    task: str, space: Any, data: Any, index: int, arch: Any, name: str, seed: int, passes: int
) -> dict[str, Any]:
    """One architecture trained alone with ``seed`` for ``passes`` passes: one table row."""
    from _supernet_common import steps_per_pass

    from optuna_hpcnas.evaluation import train_from_scratch

    spec = TASKS[task]
    steps = passes * steps_per_pass(data, spec["batch_size"])
    cpu = time.process_time()
    result = train_from_scratch(
        space, arch, data, steps=steps, lr=spec["lr"], batch_size=spec["batch_size"],
        seed=seed, latency_repeats=0, holdout=True,
    )  # fmt: skip
    return {
        "arch_index": index,
        "arch_json": arch.to_json(),
        "reference": name,
        "seed": seed,
        "passes": passes,
        "steps": int(result["steps"]),
        "batch_size": int(result["batch_size"]),
        "lr": spec["lr"],
        "valid_accuracy": float(result["valid_accuracy"]),
        "valid_logloss": float(result["valid_loss"]),
        "test_accuracy": float(result["test_accuracy"]),
        "test_logloss": float(result["test_loss"]),
        "flops": int(result["flops"]),
        "params": int(result["params"]),
        "cpu_seconds": time.process_time() - cpu,
    }


def _metadata(task: str, args: argparse.Namespace, rows: Sequence[dict[str, Any]]) -> dict:
    return {
        "task": task,
        "command": "python bench/ground_truth.py " + shlex.join(sys.argv[1:]),
        "recipe": {**TASKS[task], "optimizer": "adam", "schedule": "cosine", "wd": 1e-4},
        "passes": getattr(args, "passes", None),
        "arch_seed": ARCH_SEED,
        "data_seed": DATA_SEED,
        "cpu_seconds": float(sum(r["cpu_seconds"] for r in rows)),
    }


def _existing(path: Path) -> list[dict[str, Any]]:
    return read_table(path)[0] if path.exists() else []


def plateau(curve: Sequence[tuple[int, float]], tolerance: float) -> int:
    """The first budget after which doubling lowers the loss by less than ``tolerance`` (a
    share of it), or the largest budget when every step still gains."""
    for (budget, loss), (_, next_loss) in zip(curve, curve[1:]):
        if next_loss > loss * (1 - tolerance):
            return budget
    return curve[-1][0]


def top_curve(rows: Sequence[dict[str, Any]], share: float = TOP_SHARE) -> list[tuple[int, float]]:
    """Mean validation log-loss of the best ``share`` of the architectures at each budget."""
    curve = []
    for passes in sorted({int(r["passes"]) for r in rows}):
        losses = np.sort([r["valid_logloss"] for r in rows if r["passes"] == passes])
        n = max(2, round(share * len(losses)))
        curve.append((passes, float(losses[:n].mean())))
    return curve


def budget(args: argparse.Namespace) -> None:
    space, data = load_task(args.task)
    path = args.data_dir / f"ground_truth_{args.task}_budget.parquet"
    rows = _existing(path)
    done = {(r["arch_index"], r["passes"]) for r in rows}
    archs = architectures(args.task, space, args.archs)[: args.archs]
    for passes in args.passes:
        for index, (arch, name) in enumerate(archs):
            if (index, passes) in done:
                continue
            rows.append(train_row(args.task, space, data, index, arch, name, 0, passes))
        write_table(rows, path, _metadata(args.task, args, rows))
        print(f"{passes} passes: {len(archs)} trained", flush=True)
    curve = top_curve(rows)
    print("passes  top-10% mean valid log-loss")
    for passes, loss in curve:
        print(f"{passes:6d}  {loss:.4f}")
    print(plateau_line(curve, args.tolerance))


def plateau_line(curve: Sequence[tuple[int, float]], tolerance: float) -> str:
    """Where the curve plateaus, or that it has not yet at its largest budget."""
    chosen = plateau(curve, tolerance)
    if len(curve) > 1 and chosen == curve[-1][0] and curve[-1][1] < curve[-2][1] * (1 - tolerance):
        gain = 1 - curve[-1][1] / curve[-2][1]
        return f"no plateau up to {chosen} passes: the last doubling still gains {gain:.0%}"
    return f"plateau (doubling gains < {tolerance:.0%}): {chosen} passes"


def build(args: argparse.Namespace) -> None:
    space, data = load_task(args.task)
    out = table_path(args.task, args.data_dir)
    if args.num_shards > 1:
        out = out.with_name(f"{out.stem}.shard{args.shard}.parquet")
    rows = _existing(out)
    # rows of the table and of every shard are done, whichever process trained them
    done = {(r["arch_index"], r["seed"]) for r in read_with_shards(args.task, args.data_dir)[0]}
    archs = architectures(args.task, space, args.archs)
    todo = [
        (i, s)
        for s in range(args.seeds)
        for i in range(len(archs))
        if (i, s) not in done and (i * args.seeds + s) % args.num_shards == args.shard
    ]
    print(f"{len(done)} rows present, {len(todo)} to train -> {out}", flush=True)
    # SIGTERM unwinds as SIGINT does, so that the rows trained since the last flush are written
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    written = len(rows)
    start = time.perf_counter()
    try:
        for k, (index, seed) in enumerate(todo, 1):
            arch, name = archs[index]
            rows.append(train_row(args.task, space, data, index, arch, name, seed, args.passes))
            rate = (time.perf_counter() - start) / k
            print(f"{k}/{len(todo)} trained, {rate:.1f} s each", flush=True)
            if k % args.flush == 0 or k == len(todo):
                write_table(rows, out, _metadata(args.task, args, rows))
                written = len(rows)
    finally:
        if len(rows) > written:
            write_table(rows, out, _metadata(args.task, args, rows))
            print(f"stopped: {len(rows) - written} row(s) trained since the last flush written")


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def unsharded(command: str) -> str:
    """``command`` without its ``--shard`` / ``--num-shards`` options: the build the merged
    table is the result of, whichever shard wrote its metadata last."""
    words = shlex.split(command)
    kept = [
        w
        for i, w in enumerate(words)
        if w not in ("--shard", "--num-shards")
        and (i == 0 or words[i - 1] not in ("--shard", "--num-shards"))
    ]
    return shlex.join(kept)


def merge(args: argparse.Namespace) -> None:
    out = table_path(args.task, args.data_dir)
    shards = sorted(out.parent.glob(f"{out.stem}.shard*.parquet"))
    merged, meta = read_with_shards(args.task, args.data_dir)
    meta["cpu_seconds"] = float(sum(r["cpu_seconds"] for r in merged))
    meta["command"] = unsharded(meta.get("command", ""))
    write_table(merged, out, {k: v for k, v in meta.items() if k not in ("content_hash", "rows")})
    for path in shards:
        path.unlink()
    print(f"merged {len(merged)} rows into {out}")


def report(args: argparse.Namespace) -> None:
    rows, meta = read_with_shards(args.task, args.data_dir)
    truth = ground_truth(rows)
    overall, within = noise_ceiling(truth)
    held_out = held_out_top_ceiling(truth) if len(truth.seeds) >= 3 else None
    best = np.argsort(truth.mean_loss)[:5]
    accuracy = truth.accuracy.mean(axis=0)
    print(
        json.dumps(
            {
                "task": args.task,
                "architectures": len(truth.archs),
                "seeds": len(truth.seeds),
                "rows": len(rows),
                "passes": meta.get("passes"),
                "cpu_hours": round(sum(r["cpu_seconds"] for r in rows) / 3600, 2),
                "cpu_seconds_per_training": round(float(truth.cpu_seconds.mean()), 2),
                "content_hash": meta.get("content_hash"),
                "noise_ceiling_tau": round(overall, 3),
                "noise_ceiling_tau_top10": round(within, 3),
                # the top chosen on a held-out seed (no selection bias; 3 seeds at least)
                "noise_ceiling_tau_top10_held_out": (
                    None if held_out is None else round(held_out, 3)
                ),
                "best_mean_valid_accuracy": [round(float(accuracy[i]), 4) for i in best],
                "command": meta.get("command"),
            },
            indent=2,
        )
    )


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, meta = read_table(args.data_dir / f"ground_truth_{args.task}_budget.parquet")
    curve = top_curve(rows)
    passes = sorted({int(r["passes"]) for r in rows})
    median = [
        float(np.median([r["valid_logloss"] for r in rows if r["passes"] == p])) for p in passes
    ]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot([p for p, _ in curve], [v for _, v in curve], "o-", label="best 10 % (mean)")
    ax.plot(passes, median, "s--", label="median")
    ax.axvline(args.chosen, color="grey", lw=0.8, ls=":", label=f"table budget ({args.chosen})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("passes over the training split (cosine schedule to the end)")
    ax.set_ylabel("validation log-loss")
    n = len({r["arch_index"] for r in rows})
    ax.set_title(f"{args.task}: {n} architectures trained alone, one seed", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(__file__).resolve().parents[1] / "docs" / "images"
    path = out / f"ground_truth_budget_{args.task}.png"
    fig.savefig(path, dpi=110)
    print(f"wrote {path} ({meta.get('command')})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("budget", "build", "merge", "report", "plot"):
        sub = commands.add_parser(name)
        sub.add_argument("--task", choices=sorted(TASKS), default="digits")
        sub.add_argument("--data-dir", type=Path, default=DATA, help="where the tables live")
        if name == "budget":
            sub.add_argument("--archs", type=int, default=30)
            sub.add_argument("--passes", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
            sub.add_argument("--tolerance", type=float, default=0.02)
        if name == "build":
            sub.add_argument("--archs", type=int, default=300)
            sub.add_argument("--seeds", type=int, default=5)
            sub.add_argument("--passes", type=int, required=True)
            sub.add_argument("--flush", type=int, default=20)
            sub.add_argument("--shard", type=int, default=0)
            sub.add_argument("--num-shards", type=int, default=1)
        if name == "plot":
            sub.add_argument("--chosen", type=int, default=32, help="the table's passes")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    commands_ = {"budget": budget, "build": build, "merge": merge, "report": report, "plot": plot}
    commands_[args.command](args)


if __name__ == "__main__":
    main()
