"""GPU readiness: the checks no CPU can make, as one table of ratios (``bench/gpu_check.sh``).

1. Training throughput (images/s) of the evaluation core's engine (``LocalEngine``, the path
   every trial's fine-tuning takes) against a plain PyTorch loop on the same subnet, fp32 and
   bf16 (``cifar-like``, 32x32, batch 256 on a GPU). Goal: >= 0.9x plain, bf16 >= 1.6x fp32.
2. Several candidates on one device at once (one CUDA stream each) against one at a time.
3. A one-rank DeepSpeed engine (``build_engine(engine="deepspeed")``) against the evaluation
   core's plain engine (``LocalEngine``, what a run uses for dp = pp = 1).

    bash bench/gpu_check.sh                       # on a GPU machine (under 8 minutes)
    bash bench/gpu_check.sh --device cpu --quick  # the CPU fallback CI runs (seconds)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
import os
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _subnet(preset: str, size: int, seed: int) -> tuple[Any, Any, tuple[int, ...]]:
    import numpy as np

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet

    space = HierarchicalSearchSpace.preset(preset)
    shape = (3, size, size) if space.domain == "image" else (16, 8)
    arch = space.sample(np.random.default_rng(seed))
    net = SuperNet(space, input_shape=shape, num_classes=10, seed=seed)
    return net.subnet(arch), arch, shape


def _rate(step: Callable[[], Any], images: int, seconds: float, sync: Callable[[], None]) -> float:
    """Images per second of ``step`` over about ``seconds`` (after two warm-up steps)."""
    for _ in range(2):
        step()
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 3:
        step()
        n += 1
    sync()
    return n * images / (time.perf_counter() - t0)


def _plain_step(model: Any, opt: Any, x: Any, y: Any, dtype: Any, device: str) -> Callable:
    import torch
    import torch.nn.functional as F

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()

    return step


def core_vs_plain(args: argparse.Namespace, sync: Callable[[], None]) -> list[tuple]:
    import copy

    import torch

    from optuna_hpcnas.evaluation import FineTuning
    from optuna_hpcnas.evaluation import LocalEngine

    model, arch, shape = _subnet(args.preset, args.image, 0)
    x = torch.randn(args.batch, *shape, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    rows = []
    for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        plain_model = copy.deepcopy(model).to(args.device).train()
        opt = torch.optim.Adam(plain_model.parameters(), lr=1e-3)
        plain = _rate(_plain_step(plain_model, opt, x, y, dtype, args.device), args.batch,
                      args.seconds, sync)  # fmt: skip
        tuning = FineTuning("adam", 1e-3, 0.9, 0.0, precision, 0.0)
        session = LocalEngine().open(copy.deepcopy(model).to(args.device), arch, tuning)
        core = _rate(lambda s=session: s.step(x, y), args.batch, args.seconds, sync)
        rows.append((f"core engine / plain PyTorch, {precision}", core, plain))
    fp32, bf16 = rows[0][1], rows[1][1]
    rows.append(("core engine bf16 / fp32", bf16, fp32))
    return rows


def concurrent_candidates(args: argparse.Namespace, sync: Callable[[], None]) -> list[tuple]:
    import copy

    import torch

    models = []
    for seed in range(args.candidates):
        model, _, shape = _subnet(args.preset, args.image, seed)
        model = copy.deepcopy(model).to(args.device).train()
        models.append((model, torch.optim.Adam(model.parameters(), lr=1e-3)))
    x = torch.randn(args.batch, *shape, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    steps = [_plain_step(m, o, x, y, torch.bfloat16, args.device) for m, o in models]
    images = args.batch * len(steps)

    def one_at_a_time() -> None:
        for step in steps:
            step()

    sequential = _rate(one_at_a_time, images, args.seconds, sync)
    if args.device != "cuda":
        return [(f"{len(steps)} candidates at once (CUDA streams) / one at a time", None, None)]
    streams = [torch.cuda.Stream() for _ in steps]

    def together() -> None:
        for stream, step in zip(streams, steps):
            with torch.cuda.stream(stream):
                step()

    concurrent = _rate(together, images, args.seconds, sync)
    return [(f"{len(steps)} candidates at once (CUDA streams) / one at a time", concurrent,
             sequential)]  # fmt: skip


def deepspeed_vs_plain(args: argparse.Namespace, sync: Callable[[], None]) -> list[tuple]:
    import copy

    import torch

    from optuna_hpcnas.distributed import DistributedConfig
    from optuna_hpcnas.distributed import form_groups
    from optuna_hpcnas.distributed._engine import build_engine
    from optuna_hpcnas.distributed._engine import TorchWorld
    from optuna_hpcnas.distributed._groups import self_comm
    from optuna_hpcnas.evaluation import FineTuning
    from optuna_hpcnas.evaluation import LocalEngine

    model, arch, shape = _subnet(args.preset, args.image, 0)
    x = torch.randn(args.batch, *shape, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    group = form_groups(self_comm(), 1)
    world = TorchWorld(group, DistributedConfig(engine="deepspeed"), args.device)
    world.ensure(1)
    try:
        engine = build_engine(
            list(copy.deepcopy(model).children()), torch.nn.CrossEntropyLoss(), data_parallel=1,
            pipeline_stages=1, micro_batch_size=args.batch,
            config=DistributedConfig(engine="deepspeed"), lr=1e-3, device=args.device,
            precision="bf16",
        )  # fmt: skip
        stream = iter(lambda: (x, y), None)
        deepspeed = _rate(lambda: engine.train_step(stream), args.batch, args.seconds, sync)
    finally:
        world.close()
    # the plain path of a run (dp = pp = 1): the evaluation core's LocalEngine
    tuning = FineTuning("adam", 1e-3, 0.9, 0.0, "bf16", 0.0)
    session = LocalEngine().open(copy.deepcopy(model).to(args.device), arch, tuning)
    plain = _rate(lambda: session.step(x, y), args.batch, args.seconds, sync)
    return [("DeepSpeed 1-rank engine / the core's plain engine, bf16", deepspeed, plain)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the CPU fallback)")
    parser.add_argument("--preset", default="cifar-like")
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu --quick")
    if args.quick:
        args.preset, args.image, args.batch, args.candidates, args.seconds = (
            "digits-small", 8, 32, 2, 0.3,
        )  # fmt: skip
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rows = core_vs_plain(args, sync) + concurrent_candidates(args, sync)
    rows += deepspeed_vs_plain(args, sync)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"GPU readiness on {device}: {args.preset} {args.image}x{args.image}, batch {args.batch}"
    )
    print(f"{'check':<60} {'images/s':>10} {'peer':>10} {'ratio':>7}")
    for label, value, peer in rows:
        if value is None:
            print(f"{label:<60} {'n/a':>10} {'n/a':>10} {'n/a':>7}")
        else:
            print(f"{label:<60} {value:10.0f} {peer:10.0f} {value / peer:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"check": r[0], "value": r[1], "peer": r[2]} for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
