"""Benchmark 3: DeepSpeed vs plain PyTorch for dp = pp = 1, and pipeline vs data parallel on
4 ranks, training the same supernet subnet (images per second, training steps only).

    python bench/distributed_engines.py [--steps 30] [--batch 64] [--preset digits-small]

Part 1 runs in this process: plain PyTorch (the evaluation core's ``LocalEngine``, what
``run_search`` uses when dp = pp = 1) versus a DeepSpeed engine in a torch world of one rank
(ZeRO 0 and ZeRO 1), fp32 and bf16 autocast.
Part 2 launches ``mpirun -n 4`` with this file as worker: data parallel 4 (ZeRO-1), pipeline
4, and pipeline 2 x data 2, each against the same micro-batch size per replica. On a machine
with fewer cores than ranks, ranks share cores (the figures are then relative only).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import subprocess
import sys
import time
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def subnet_layers(preset: str, seed: int = 0) -> tuple[list[Any], tuple[int, ...], int]:
    import torch

    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import CellConfig
    from optuna_hpcnas.search_space import ClusterConfig
    from optuna_hpcnas.search_space import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet

    space = HierarchicalSearchSpace.preset(preset)
    shape = (1, 8, 8) if preset == "digits-small" else (3, 32, 32)
    width = max(space.widths)
    ops = ("conv3x3", "sepconv3x3", "dilconv3x3", "conv3x3")
    cells = tuple(
        CellConfig(op=ops[i % len(ops)], kernel=3, width=width) for i in range(space.num_cells)
    )
    arch = Architecture("residual", cells, ClusterConfig())
    torch.manual_seed(seed)
    net = SuperNet(space, input_shape=shape, num_classes=10, seed=seed)
    return net.layers(arch), shape, 10


def batches(shape: tuple[int, ...], batch: int, replica: int, seed: int = 0) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed + replica)
    x = torch.randn(16 * batch, *shape, generator=gen)
    y = torch.randint(0, 10, (16 * batch,), generator=gen)
    while True:
        for i in range(16):
            yield x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]


class CoreSteps:
    """The evaluation core's plain path (``LocalEngine``: how a run trains a candidate on one
    rank), stepped like a ``TrainEngine``."""

    def __init__(self, layers: list[Any], precision: str) -> None:
        import torch

        from optuna_hpcnas.evaluation import FineTuning
        from optuna_hpcnas.evaluation import LocalEngine

        tuning = FineTuning("adam", 1e-3, 0.9, 0.0, precision, 0.0)
        model = torch.nn.Sequential(*layers)
        self.session = LocalEngine().open(model, None, tuning)  # type: ignore[arg-type]

    def train_step(self, stream: Any) -> float:
        x, y = next(stream)
        return self.session.step(x, y).loss


def time_engine(engine: Any, stream: Any, steps: int, warmup: int = 3) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for ``steps`` training steps.

    CPU seconds are what the engine costs even when other jobs share the cores (the wall
    time then mostly measures the neighbours)."""
    for _ in range(warmup):
        engine.train_step(stream)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        engine.train_step(stream)
    return time.perf_counter() - t0, time.process_time() - c0


def part1(args: argparse.Namespace) -> list[tuple[str, str, float, float]]:
    """Build every engine once, then time them interleaved ``--repeats`` times (median), so
    a background load spike does not favour one of them."""
    import statistics

    import torch

    from optuna_hpcnas.distributed import DistributedConfig
    from optuna_hpcnas.distributed import form_groups
    from optuna_hpcnas.distributed._engine import build_engine
    from optuna_hpcnas.distributed._engine import TorchWorld
    from optuna_hpcnas.distributed._groups import self_comm

    group = form_groups(self_comm(), 1)
    world = TorchWorld(group, DistributedConfig(engine="deepspeed"), "cpu")
    world.ensure(1)  # a torch world of one rank for the DeepSpeed engines
    engines: dict[tuple[str, str], tuple[Any, Any]] = {}
    for precision in ("fp32", "bf16"):
        layers, shape, _ = subnet_layers(args.preset)
        engines[(precision, "plain PyTorch")] = (
            CoreSteps(layers, precision),
            batches(shape, args.batch, 0),
        )
        for label, zero in (("DeepSpeed ZeRO-0", 0), ("DeepSpeed ZeRO-1", 1)):
            config = DistributedConfig(engine="deepspeed", zero_stage=zero)
            layers, shape, _ = subnet_layers(args.preset)
            engine = build_engine(
                layers,
                torch.nn.CrossEntropyLoss(),
                data_parallel=1,
                pipeline_stages=1,
                micro_batch_size=args.batch,
                config=config,
                lr=1e-3,
                precision=precision,
            )
            engines[(precision, label)] = (engine, batches(shape, args.batch, 0))
    walls: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    cpus: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    for _ in range(args.repeats):
        for key, (engine, stream) in engines.items():
            wall, cpu = time_engine(engine, stream, args.steps)
            walls[key].append(wall)
            cpus[key].append(cpu)
    world.close()
    images = args.steps * args.batch
    return [
        (
            p,
            label,
            images / statistics.median(walls[(p, label)]),
            images / statistics.median(cpus[(p, label)]),
        )
        for p, label in engines
    ]


def worker(args: argparse.Namespace) -> None:
    """Under mpirun -n 4: time dp4, pp4 and pp2 x dp2 (all ranks of one group)."""
    from mpi4py import MPI
    import torch

    from optuna_hpcnas.distributed import DistributedConfig
    from optuna_hpcnas.distributed import form_groups
    from optuna_hpcnas.distributed._engine import build_engine
    from optuna_hpcnas.distributed._engine import TorchWorld

    comm = MPI.COMM_WORLD
    group = form_groups(comm, comm.Get_size())
    results = []
    layouts = (("data parallel 4", 4, 1), ("pipeline 4", 1, 4), ("pipeline 2 x data 2", 2, 2))
    for label, dp, pp in layouts:
        config = DistributedConfig(group_size=4, zero_stage=1)
        world = TorchWorld(group, config, "cpu")
        world.ensure(4)
        layers, shape, _ = subnet_layers(args.preset)
        engine = build_engine(
            layers,
            torch.nn.CrossEntropyLoss(),
            data_parallel=dp,
            pipeline_stages=pp,
            micro_batch_size=args.batch,
            config=config,
            lr=1e-3,
            group_rank=group.rank,
            accumulation_steps=4 if pp > 1 else 1,
        )
        comm.Barrier()
        wall, cpu = time_engine(engine, batches(shape, args.batch, group.rank % dp), args.steps)
        wall = comm.allreduce(wall, op=MPI.MAX)
        cpu = comm.allreduce(cpu, op=MPI.SUM)  # CPU seconds of all ranks together
        images = args.steps * args.batch * dp * engine.micro_batches
        results.append((label, images / wall, images / cpu))
        world.close()
        del engine
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--preset", default="digits-small")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--no-mpi", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(
        f"subnet of {args.preset} (residual, widest cells), batch {args.batch}, "
        f"{args.steps} steps, median of {args.repeats} interleaved repeats\n"
    )
    rows = part1(args)
    print(
        f"{'precision':<9} {'engine (dp = pp = 1)':<20} {'images/s':>9} {'vs plain':>8} "
        f"{'images/CPU-s':>12} {'vs plain':>8}"
    )
    plain = {p: (w, c) for p, label, w, c in rows if label == "plain PyTorch"}
    for precision, label, w, c in rows:
        pw, pc = plain[precision]
        print(f"{precision:<9} {label:<20} {w:9.0f} {w / pw:7.2f}x {c:12.0f} {c / pc:7.2f}x")
    if args.no_mpi:
        return
    mpirun = Path(sys.executable).with_name("mpirun")
    launcher = str(mpirun if mpirun.exists() else "mpirun")
    cmd = [launcher, "-n", "4", sys.executable, "-m", "mpi4py"]
    cmd += [__file__, "--worker", "--steps", str(args.steps), "--batch", str(args.batch)]
    cmd += ["--preset", args.preset]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(proc.stderr[-3000:])
    results = json.loads(lines[-1][len("RESULT ") :])
    print(
        f"\n4 ranks ({os.cpu_count()} cores), micro-batch {args.batch} per replica, ZeRO-1, fp32"
    )
    print(
        f"{'layout':<22} {'images/s':>9} {'vs dp4':>7} {'images/CPU-s':>12} {'vs dp4':>7} "
        f"{'vs 1-rank plain':>15}"
    )
    dp4 = results[0]
    for label, w, c in results:
        print(
            f"{label:<22} {w:9.0f} {w / dp4[1]:6.2f}x {c:12.0f} {c / dp4[2]:6.2f}x "
            f"{c / plain['fp32'][1]:14.2f}x"
        )
    print(
        "\nimages/CPU-s: images per CPU-second summed over the ranks (the cost of a layout, "
        "robust to other jobs on the cores); 'vs 1-rank plain' compares it with plain PyTorch."
    )


if __name__ == "__main__":
    main()
