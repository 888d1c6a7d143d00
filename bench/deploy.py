"""Deployment benchmark: FP32 vs INT8 onnxruntime (and torch eager as a second peer).

Two models go through ``optuna_hpcnas.deploy.deploy_model``:

* digits: the digits demo's best architecture (``--digits-arch``), trained from scratch
  (``--steps`` of Adam at batch 32 with a cosine learning rate on the train split; by default
  30 passes over its 1,078 images, 1,020 steps), verified on the test
  split (359 images, never used for training), INT8 calibrated on the train split;
* cifar-like: one sampled architecture of ``preset("cifar-like")`` (``--cifar-seed``) and
  a convolution-only one (``--cifar-conv-arch``), random weights, 3x32x32 inputs; their
  "accuracy" is the top-1 agreement with the FP32 model on random inputs (labels = FP32
  argmax), so FP32 is 1 by construction.

Printed per model: batch-1 latency p50/p99 (ms), throughput at batch 64 (samples/s), bytes,
accuracy; then the whole ``deploy_model`` wall time and its steps. One thread everywhere. The
speed columns are timed after ``deploy_model``, in ``--rounds`` alternating rounds of the
three runtimes (median of the rounds), so that a busy shared machine slows all of them alike;
``report.json`` holds ``deploy_model``'s own one-pass figures.

    python bench/deploy.py
    python bench/deploy.py --steps 1020 --repeats 300 --cifar-seed 3
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
import tempfile
import time
from typing import Any

from _stored import store_result

os.environ.setdefault("OMP_NUM_THREADS", "1")

DEMO_BEST = "dense[conv3x3/w32 > conv3x3/w32 > dilconv3x3/w32]"
BATCH_SIZE = 32  # of the digits model's training
# A convolution-only architecture of cifar-like: where INT8 has most to win (the sampled one
# spends most of its time in attention over 1,024 positions, which stays in float).
CIFAR_CONV = (
    "residual[conv3x3/w64 > sepconv3x3/w64 > conv3x3/w128 > maxpool3x3 > conv5x5/w128 > "
    "sepconv5x5/w128 > conv3x3/w128 > identity]"
)


def parse_arch(text: str) -> Any:
    """``topology[op/wN > op > ...]`` (``Architecture.describe`` without the cluster part)."""
    from optuna_hpcnas import Architecture
    from optuna_hpcnas import CellConfig
    from optuna_hpcnas import ClusterConfig

    topology, _, rest = text.partition("[")
    cells = []
    for part in rest.rstrip("]").split(">"):
        op, *micro = part.strip().split("/")
        widths = [int(m[1:]) for m in micro if m.startswith("w")]
        cells.append(CellConfig(op, width=widths[0] if widths else None))
    return Architecture(topology.strip(), tuple(cells), ClusterConfig(1, 1, 64))


def train(space: Any, arch: Any, data: Any, *, steps: int, seed: int) -> Any:
    import torch
    import torch.nn.functional as F

    from optuna_hpcnas.data import stream_batches
    from optuna_hpcnas.supernet import SuperNet

    net = SuperNet(space, input_shape=data.input_shape, num_classes=10, seed=seed).subnet(arch)
    net.train()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(steps, 1))
    generator = torch.Generator().manual_seed(seed)
    batches = stream_batches(data.train, BATCH_SIZE, generator=generator)
    for _, (x, y) in zip(range(steps), batches):
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
        schedule.step()
    return net.eval()


def interleaved(
    net: Any, out: Path, shape: tuple[int, ...], *, repeats: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Batch-1 p50/p99 (ms) and batch-64 throughput of torch eager, ORT FP32 and ORT INT8,
    measured in alternating rounds so that all three see the same load on a shared machine.
    """
    import numpy as np
    import torch

    from optuna_hpcnas.evaluation._onnx import latency
    from optuna_hpcnas.evaluation._onnx import session
    from optuna_hpcnas.evaluation._onnx import throughput

    sessions = {
        "ort FP32": session(out / "model.onnx"),
        "ort INT8": session(out / "model.int8.onnx"),
    }
    x1, x64 = torch.randn(1, *shape), torch.randn(64, *shape)
    samples: dict[str, list[float]] = {k: [] for k in ("torch eager", *sessions)}
    tputs: dict[str, list[float]] = {k: [] for k in samples}
    per_round = max(repeats // rounds, 5)
    with torch.no_grad():
        for _ in range(rounds):
            for _ in range(5):
                net(x1)
            for _ in range(per_round):
                start = time.perf_counter()
                net(x1)
                samples["torch eager"].append(time.perf_counter() - start)
            runs, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.3 or runs < 2:
                net(x64)
                runs += 1
            tputs["torch eager"].append(runs * 64 / (time.perf_counter() - start))
            for key, sess in sessions.items():
                p50, p99 = latency(sess, shape, repeats=per_round, warmup=5)
                samples[key].extend([p50, p99])  # per-round percentiles, pooled below
                tputs[key].append(throughput(sess, shape, batch_size=64, min_seconds=0.3))
    rows = {}
    for key in samples:
        values = np.asarray(samples[key])
        if key == "torch eager":
            p50, p99 = np.percentile(values, 50), np.percentile(values, 99)
        else:  # alternating (p50, p99) pairs of each round: median of each
            p50, p99 = np.median(values[0::2]), np.median(values[1::2])
        rows[key] = {"p50": float(p50) * 1e3, "p99": float(p99) * 1e3}
        rows[key]["tput"] = float(np.median(tputs[key]))
    return rows


def agreement_holdout(net: Any, shape: tuple[int, ...], n: int, seed: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    x = torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = net(x).argmax(1)
    return TensorDataset(x, y)


def run_one(label: str, net: Any, shape: tuple[int, ...], calib: Any, hold: Any, args: Any):
    from optuna_hpcnas.deploy import deploy_model

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / label
        start = time.perf_counter()
        report = deploy_model(
            net,
            out=out,
            input_shape=shape,
            calibration=calib,
            holdout=hold,
            name=label,
            latency_repeats=args.repeats,
        )
        wall = time.perf_counter() - start
        rows = interleaved(net, out, shape, repeats=args.repeats, rounds=args.rounds)
    return report, wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--digits-arch", default=DEMO_BEST)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps of the digits model (default: 30 passes over the train split, 1020)",
    )
    parser.add_argument("--cifar-seed", type=int, default=3)
    parser.add_argument("--cifar-conv-arch", default=CIFAR_CONV)
    parser.add_argument("--repeats", type=int, default=300, help="timed batch-1 runs")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also store the results as JSON here")
    args = parser.parse_args()

    import numpy as np
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.supernet import SuperNet

    torch.set_num_threads(1)
    results = []

    digits = load_digits_task(seed=args.seed)
    space = HierarchicalSearchSpace.preset("digits-small")
    arch = parse_arch(args.digits_arch)
    if args.steps is None:
        args.steps = 30 * math.ceil(digits.sizes[0] / BATCH_SIZE)
    start = time.perf_counter()
    net = train(space, arch, digits, steps=args.steps, seed=args.seed)
    train_s = time.perf_counter() - start
    torch_acc, _ = evaluate(net, digits.test)
    report, wall, timed = run_one("digits", net, (1, 8, 8), digits.train, digits.test, args)
    accuracy = {"torch eager": torch_acc, "ort FP32": report.fp32.accuracy}
    accuracy["ort INT8"] = report.int8.accuracy
    results.append(("digits", arch.describe(), report, wall, timed, accuracy))
    print(f"digits: trained {args.steps} steps in {train_s:.1f} s")

    cifar = HierarchicalSearchSpace.preset("cifar-like")
    shape = (3, 32, 32)
    sampled = cifar.sample(np.random.default_rng(args.cifar_seed))
    for label, arch in (("cifar-like", sampled), ("cifar-conv", parse_arch(args.cifar_conv_arch))):
        net = SuperNet(cifar, input_shape=shape, num_classes=10, seed=args.seed).subnet(arch)
        net.eval()
        calib = agreement_holdout(net, shape, 256, args.seed + 1)
        hold = agreement_holdout(net, shape, 512, args.seed + 2)
        report, wall, timed = run_one(label, net, shape, calib, hold, args)
        accuracy = {"torch eager": 1.0, "ort FP32": report.fp32.accuracy}
        accuracy["ort INT8"] = report.int8.accuracy
        results.append((label, arch.describe(), report, wall, timed, accuracy))

    header = (
        f"{'model':11s} {'runtime':13s} {'p50 ms':>8s} {'p99 ms':>8s} {'tput/s b64':>11s} "
        f"{'bytes':>10s} {'accuracy':>9s} {'p50 vs FP32':>12s} {'bytes vs FP32':>14s}"
    )
    print(header)
    print("-" * len(header))
    for label, _, report, _, timed, accuracy in results:
        sizes = {"torch eager": None, "ort FP32": report.fp32.bytes, "ort INT8": report.int8.bytes}
        base = timed["ort FP32"]
        for runtime, row in timed.items():
            size = sizes[runtime]
            size_text = "-" if size is None else str(size)
            size_ratio = "-" if size is None else f"{size / report.fp32.bytes:.2f}"
            print(
                f"{label:11s} {runtime:13s} {row['p50']:8.3f} {row['p99']:8.3f} "
                f"{row['tput']:11.0f} {size_text:>10s} {accuracy[runtime]:9.4f} "
                f"{row['p50'] / base['p50']:12.2f} {size_ratio:>14s}"
            )
    print()
    for label, described, report, wall, timed, _ in results:
        drop = (report.fp32.accuracy - report.int8.accuracy) * 100
        tput = timed["ort INT8"]["tput"] / timed["ort FP32"]["tput"]
        print(
            f"{label}: {described}; deploy_model wall {wall:.1f} s "
            f"({', '.join(f'{k} {v:.1f}' for k, v in report.timings.items())}); "
            f"INT8 accuracy change {-drop:+.2f} points; INT8 bytes "
            f"{report.int8.bytes / report.fp32.bytes:.2f}x; INT8 throughput {tput:.2f}x FP32"
        )
    print(f"onnxruntime {results[0][2].versions['onnxruntime']}, 1 intra-op thread")
    if args.out is not None:
        record = {
            "onnxruntime": results[0][2].versions["onnxruntime"],
            "models": [
                {
                    "model": label,
                    "architecture": described,
                    "bytes": {"ort FP32": report.fp32.bytes, "ort INT8": report.int8.bytes},
                    "accuracy": accuracy,
                    "timed_ms": timed,
                }
                for label, described, report, _, timed, accuracy in results
            ],
        }
        store_result(args.out, record)


if __name__ == "__main__":
    main()
