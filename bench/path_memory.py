"""Benchmark 3 of the supernet issue: peak memory of k-path gradient accumulation through the
weight-sharing supernet vs k separate candidate models.

Each configuration runs in a fresh subprocess and reports its peak resident memory above the
memory it had before building any model (``ru_maxrss`` minus the RSS after imports):

* ``supernet``: one SuperNet, each step samples k paths and accumulates their gradients
  (one path's activations alive at a time).
* ``separate``: k stand-alone candidate models with their own optimizers, trained together
  (all k graphs alive, as k candidates evaluated side by side on one device).
* ``separate-sequential``: the same k models, one backward after each forward.

Peak RSS depends on the allocator as well as on the live tensors: glibc's malloc keeps freed
large blocks once its adaptive mmap threshold has grown, so each child runs twice, with the
default allocator and with ``MALLOC_MMAP_THRESHOLD_=131072`` (every block over 128 KiB is
mapped on its own and returned when freed, so the peak is that of the live tensors, the
figure ``torch.cuda.max_memory_allocated`` gives on a GPU).

    python bench/path_memory.py --paths 10
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def child(mode: str, paths: int, batch: int, image: int, width: int, cells: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import layer_recipes
    from optuna_hpcnas.supernet import SuperNet
    from optuna_hpcnas.supernet import train_step

    torch.set_num_threads(1)
    space = HierarchicalSearchSpace(
        num_cells=cells,
        operators=("conv3x3", "sepconv3x3", "dilconv3x3", "maxpool3x3", "identity"),
        topologies=("chain", "residual", "dense"),
        widths=(width // 2, width),
    )
    shape = (3, image, image)
    rng = np.random.default_rng(0)
    archs = [space.sample(rng) for _ in range(paths)]
    x = torch.randn(batch, *shape)
    y = torch.randint(0, 10, (batch,))
    # Load what the first optimizer and convolution pull in (torch._dynamo, oneDNN) before
    # the baseline, so the figure is the models' and activations' memory.
    warm = torch.nn.Conv2d(3, 4, 3)
    torch.optim.Adam(warm.parameters()).step()
    F.cross_entropy(warm(x[:2]).mean((2, 3)), y[:2] % 4).backward()
    base = _rss_kib()
    steps = 2
    if mode == "supernet":
        net = SuperNet(space, input_shape=shape, num_classes=10)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(steps):
            train_step(net, opt, x, y, archs)
        params = sum(p.numel() for p in net.parameters())
    else:
        models = [
            torch.nn.Sequential(
                *(r.build() for r in layer_recipes(space, a, input_shape=shape, num_classes=10))
            )
            for a in archs
        ]
        opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in models]
        for _ in range(steps):
            for o in opts:
                o.zero_grad()
            if mode == "separate":
                loss = sum(F.cross_entropy(m(x), y) for m in models)
                loss.backward()  # type: ignore[union-attr]
            else:
                for m in models:
                    F.cross_entropy(m(x), y).backward()
            for o in opts:
                o.step()
        params = sum(p.numel() for m in models for p in m.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "peak_mib": (peak - base) / 1024, "params": params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--paths", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--cells", type=int, default=8)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    sizes = (args.paths, args.batch, args.image, args.width, args.cells)
    if args.child:
        print(json.dumps(child(args.child, *sizes)))
        return
    results: dict[str, dict[str, dict]] = {"default": {}, "live": {}}
    for allocator, extra in (("default", {}), ("live", {"MALLOC_MMAP_THRESHOLD_": "131072"})):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | extra
        for mode in ("supernet", "separate", "separate-sequential"):
            flags = zip(("paths", "batch", "image", "width", "cells"), sizes)
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode] + [f"--{k}={v}" for k, v in flags],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            results[allocator][mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"\nPeak memory, {args.paths} paths, {args.cells} cells x {args.width} channels, "
        f"{args.image}x{args.image} images, batch {args.batch} (RSS above the pre-model baseline)"
    )
    print(
        f"{'method':<44} {'params':>9} {'glibc default':>19} {'live tensors':>19}"
        f"\n{'':<44} {'':>9} {'MiB':>8} {'vs sep.':>10} {'MiB':>8} {'vs sep.':>10}"
    )
    labels = {
        "supernet": f"supernet, {args.paths}-path accumulation",
        "separate": f"{args.paths} separate models, trained together",
        "separate-sequential": f"{args.paths} separate models, one at a time",
    }
    for mode, label in labels.items():
        cells = []
        for allocator in ("default", "live"):
            peak = results[allocator][mode]["peak_mib"]
            ratio = peak / results[allocator]["separate"]["peak_mib"]
            cells.append(f"{peak:>8.1f} {ratio:>9.2f}x")
        params = results["default"][mode]["params"]
        print(f"{label:<44} {params:>9,} {' '.join(cells)}")


if __name__ == "__main__":
    main()
