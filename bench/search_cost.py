"""Benchmark 2 of the supernet issue over a whole space: the cost of a weight-sharing search
vs training every candidate from scratch, and what each search picks.

* From scratch: every architecture of ``digits-small`` trained alone on the training split
  (the stand-alone recipe of ``ranking_fidelity.py``: 170 steps of 32 images, 5 passes over
  the 1,078, Adam lr 2e-2, cosine lr), the best validation log-loss wins.
* Weight sharing: the supernet trained once; every architecture scored with inherited weights
  (BatchNorm recalibrated); the best ``1/eta`` go through the quick stage (34 steps, one
  pass) and the best ``1/eta`` of those go on through the medium stage (136 more steps, 4
  passes, cosine); the best medium score wins.

Both are timed on one CPU thread in the same run (or the from-scratch half is read from
``--scratch-cache``); the table gives the wall time, the ratio,
and the rank of each pick among the from-scratch results (1 = the best of the space). It also
prints the rank correlation of the inherited scores with the from-scratch ones over the space.

    python bench/search_cost.py                      # all 1,536 architectures, ~30 min
    python bench/search_cost.py --archs 300 --scratch-cache scratch.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCH_SIZE = 32  # of the stages and of the stand-alone recipe
SCRATCH_LR = 2e-2  # the stand-alone recipe's Adam learning rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", type=int, default=0, help="0: the whole space")
    parser.add_argument("--supernet-epochs", type=int, default=24)
    parser.add_argument("--paths", type=int, default=5)
    parser.add_argument("--eta", type=int, default=9, help="keep 1/eta at each screening step")
    # budgets in optimisation steps of 32 images; the defaults are passes over the training
    # split (34 steps each on digits)
    parser.add_argument("--quick-steps", type=int, default=None, help="default: 1 pass (34)")
    parser.add_argument("--medium-steps", type=int, default=None, help="default: 4 passes (136)")
    parser.add_argument("--scratch-steps", type=int, default=None, help="default: 5 passes (170)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scratch-cache",
        type=Path,
        default=None,
        help="JSON file with the from-scratch results: read when it matches, else written",
    )
    args = parser.parse_args()

    from _supernet_common import FineTuning
    from _supernet_common import sample_architectures
    from _supernet_common import steps_per_pass
    from _supernet_common import train_supernet
    import numpy as np
    from scipy import stats
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import train_from_scratch

    torch.set_num_threads(1)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=args.seed)
    per_pass = steps_per_pass(data, BATCH_SIZE)
    quick_steps = per_pass if args.quick_steps is None else args.quick_steps
    medium_steps = 4 * per_pass if args.medium_steps is None else args.medium_steps
    scratch_steps = 5 * per_pass if args.scratch_steps is None else args.scratch_steps
    n_all = args.archs or space.cardinality()
    archs = sample_architectures(space, n_all, args.seed)
    names = [a.describe() for a in archs]

    # ---- weight sharing
    t0 = time.perf_counter()
    trainer = train_supernet(
        space, data, epochs=args.supernet_epochs, paths=args.paths, seed=args.seed
    )
    supernet_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    inherited = np.array(
        [evaluate(trainer.calibrated_subnet(a, data.train), data.valid)[1] for a in archs]
    )
    inherited_seconds = time.perf_counter() - t0
    keep = max(1, len(archs) // args.eta)
    quick_set = [int(i) for i in np.argsort(inherited)[:keep]]
    t0 = time.perf_counter()
    tuning, quick = {}, {}
    for i in quick_set:
        model = trainer.calibrated_subnet(archs[i], data.train)
        tuning[i] = FineTuning(model, data, seed=args.seed, batch_size=BATCH_SIZE)
        quick[i] = tuning[i].stage(quick_steps, 1e-3, anneal=False)[1]
    quick_seconds = time.perf_counter() - t0
    # The promoted candidates go on from their quick stage, as StagedPruner trials do.
    medium_set = sorted(quick, key=quick.__getitem__)[: max(1, keep // args.eta)]
    t0 = time.perf_counter()
    medium = {i: tuning[i].stage(medium_steps, 1e-2, anneal=True)[1] for i in medium_set}
    medium_seconds = time.perf_counter() - t0
    shared_pick = min(medium, key=medium.__getitem__)

    # ---- from scratch
    settings = {
        "steps": scratch_steps,
        "lr": SCRATCH_LR,
        "batch_size": BATCH_SIZE,
        "seed": args.seed,
        "archs": names,
    }
    cached = None
    if args.scratch_cache is not None and args.scratch_cache.exists():
        cached = json.loads(args.scratch_cache.read_text())
        if cached.get("settings") != settings:
            cached = None
    if cached is None:
        scratch_loss, scratch_seconds_each = [], []
        for a in archs:
            t0 = time.perf_counter()
            r = train_from_scratch(
                space, a, data, steps=scratch_steps, lr=SCRATCH_LR, batch_size=BATCH_SIZE,
                seed=args.seed, latency_repeats=0, holdout=True,
            )  # fmt: skip
            scratch_seconds_each.append(time.perf_counter() - t0)
            scratch_loss.append(r["valid_loss"])
        if args.scratch_cache is not None:
            payload = {"settings": settings, "loss": scratch_loss, "seconds": scratch_seconds_each}
            args.scratch_cache.write_text(json.dumps(payload))
        source = "measured in this run"
    else:
        scratch_loss, scratch_seconds_each = cached["loss"], cached["seconds"]
        source = f"read from {args.scratch_cache}"
    scratch = np.array(scratch_loss)
    scratch_seconds = float(np.sum(scratch_seconds_each))
    rank = {int(i): r + 1 for r, i in enumerate(np.argsort(scratch))}

    n = len(archs)
    print(f"\nSearch over {n} digits-small architectures (one CPU thread)")
    print(f"{'search':<58} {'seconds':>8} {'vs scratch':>10} {'pick rank':>9}")
    print(
        f"{'from scratch: train all ' + str(n) + f' ({scratch_steps} steps each)':<58} "
        f"{scratch_seconds:>8.0f} {1.0:>9.1f}x {1:>9}"
    )
    steps = (
        (f"supernet, {args.supernet_epochs} epochs x {args.paths} paths", supernet_seconds),
        (f"+ inherited score of all {n}", inherited_seconds),
        (f"+ quick stage ({quick_steps} steps) for the best {len(quick_set)}", quick_seconds),
        (
            f"+ medium stage ({medium_steps} more steps) for {len(medium_set)}",
            medium_seconds,
        ),
    )
    cumulative = 0.0
    for label, seconds in steps:
        cumulative += seconds
        print(f"{label:<58} {cumulative:>8.0f} {scratch_seconds / cumulative:>9.1f}x")
    print(
        f"weight sharing picks {names[shared_pick]} (rank {rank[shared_pick]} of {n} from "
        f"scratch); from-scratch times {source}"
    )
    inherited_best = int(np.argmin(inherited))
    print(
        f"inherited scores vs from scratch over all {n}: Kendall tau "
        f"{stats.kendalltau(inherited, scratch).statistic:.3f}, Spearman rho "
        f"{stats.spearmanr(inherited, scratch).statistic:.3f}; the inherited best alone "
        f"has rank {rank[inherited_best]}; the scratch best is in the quick set: "
        f"{int(np.argmin(scratch)) in quick}"
    )
    per_scratch, per_inherited = scratch_seconds / n, inherited_seconds / n
    print(
        f"per candidate: from scratch {per_scratch:.2f} s, inherited score "
        f"{per_inherited:.3f} s ({per_scratch / per_inherited:.0f}x)"
    )


if __name__ == "__main__":
    main()
