"""Benchmark 5 of the supernet issue: bf16 autocast vs fp32 supernet training throughput.

One k-path ``train_step`` per batch on an 8-cell supernet; images per second counts every
path (``batch * paths`` images per step). On a GPU also fp16 with loss scaling. The issue's
anchor on an H200 (plain PyTorch, 8 cells x 64 channels, 32x32, batch 256): 52k images/s
bf16 vs 32k fp32.

    python bench/mixed_precision.py                 # CPU, reduced sizes
    python bench/mixed_precision.py --device cuda --image 32 --batch 256 --steps 20
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--image", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--cells", type=int, default=8)
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import numpy as np
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet
    from optuna_hpcnas.supernet import train_step

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    space = HierarchicalSearchSpace(
        num_cells=args.cells,
        operators=("conv3x3", "sepconv3x3", "dilconv3x3", "maxpool3x3", "identity"),
        topologies=("residual",),
        widths=(args.width,),
    )
    shape = (3, args.image, args.image)
    x = torch.randn(args.batch, *shape, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    precisions = ["fp32", "bf16"] + (["fp16"] if device.type == "cuda" else [])
    rows = []
    for precision in precisions:
        net = SuperNet(space, input_shape=shape, num_classes=10).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        rng = np.random.default_rng(0)

        t0 = time.perf_counter()
        for i in range(args.steps + 1):
            if i == 1:  # the first step is a warm-up (kernel selection)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            archs = [space.sample(rng) for _ in range(args.paths)]
            train_step(net, opt, x, y, archs, precision=precision, scaler=scaler)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rows.append((precision, args.batch * args.paths * args.steps / seconds))
    print(
        f"\nSupernet training throughput on {args.device} ({args.threads} thread(s)): "
        f"{args.cells} cells x {args.width} ch, {args.image}x{args.image}, batch {args.batch}, "
        f"{args.paths} paths per step"
    )
    print(f"{'precision':<10} {'images/s':>10} {'vs fp32':>8}")
    fp32 = rows[0][1]
    for precision, rate in rows:
        print(f"{precision:<10} {rate:>10.1f} {rate / fp32:>7.2f}x")
    print(
        "anchor (H200, plain PyTorch, 32x32, batch 256): bf16 52.1k, fp32 32.0k images/s (1.63x)"
    )


if __name__ == "__main__":
    main()
