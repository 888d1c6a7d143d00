"""MNIST-1D training throughput: the supernet warm-up and the stages against plain PyTorch.

For a few ``signal-1d`` architectures, in one process, signals per second of
(1) a plain PyTorch loop (``model(x)``, cross-entropy, ``backward``, ``Adam.step``) on the
    architecture's stand-alone subnet,
(2) the evaluation core's fine-tuning step on the same subnet (``LocalEngine``, what every
    stage of every trial runs), and
(3) the supernet warm-up's step on that one path (``train_step`` through the shared weights:
    sliced kernels and normalisation),
with the same batches and the threads torch is given (``--threads``, default the process's
share of the cores as ``hpcnas run`` sets it), and the ratio of (2) and (3) to (1).

    python bench/signal_throughput.py [--threads 1] [--steps 60] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time


def _arches(space):  # type: ignore[no-untyped-def]
    from optuna_hpcnas.search_space import SIGNAL_1D_PAPER_MODELS

    def conv(i: int, kernel: int, width: int) -> dict[str, object]:
        return {
            f"node.cell{i}.op": "conv1d_bn",
            f"node.cell{i}.kernel": kernel,
            f"node.cell{i}.width": width,
            f"node.cell{i}.stride": 1,
        }

    residual: dict[str, object] = {
        "node.topology": "residual",
        "node.stem": "none",
        "node.head": "mean",
        "cluster.micro_batch_size": 64,
    }
    for i in range(4):
        residual.update(conv(i, 5, 50))
    mixed = {
        **residual,
        "node.cell1.op": "gru",
        "node.cell1.width": 50,
        "node.cell3.op": "transformer",
        "node.cell3.heads": 2,
        "node.cell3.expansion": 2,
    }
    for key in ("kernel", "stride"):
        for i in (1, 3):
            mixed.pop(f"node.cell{i}.{key}")
    mixed.pop("node.cell3.width")
    return {
        "residual conv1d_bn k5 w50 x4": space.from_params(residual),
        "residual with gru and transformer": space.from_params(mixed),
        "the paper's CNN": space.from_params(
            {
                k: v
                for k, v in SIGNAL_1D_PAPER_MODELS["cnn"].items()
                if k not in ("cluster.data_parallel", "cluster.pipeline_stages")
            }
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, help="torch threads (default: the run's share)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per measurement")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    args = parser.parse_args()

    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_mnist1d_task
    from optuna_hpcnas.evaluation import FineTuning
    from optuna_hpcnas.evaluation import LocalEngine
    from optuna_hpcnas.run import configure_threads
    from optuna_hpcnas.supernet import SuperNet
    from optuna_hpcnas.supernet import train_step

    threads = configure_threads(requested=args.threads, ranks_on_node=1)
    data = load_mnist1d_task()
    space = HierarchicalSearchSpace.preset("signal-1d").fitting(1)
    supernet = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
    generator = torch.Generator().manual_seed(0)
    batches = [b for _, b in zip(range(args.steps + 5), _cycle(data.train, args, generator))]
    tuning = FineTuning("adam", 1e-3, 0.9, 0.0, "fp32", 5.0)

    def timed(step) -> float:  # type: ignore[no-untyped-def]
        """Seconds of ``args.steps`` steps after 5 untimed ones (allocator, kernels)."""
        for x, y in batches[:5]:
            step(x, y)
        started = time.perf_counter()
        for x, y in batches[5:]:
            step(x, y)
        return time.perf_counter() - started

    def rates(steps) -> list[float]:  # type: ignore[no-untyped-def]
        """Signals/s of each step, rounds interleaved, median of ``args.rounds``: on a busy
        machine the load falls on every variant alike, so the ratios stay fair."""
        seconds = [[timed(step) for step in steps] for _ in range(args.rounds)]
        return [args.steps * args.batch_size / statistics.median(s) for s in zip(*seconds)]

    print(f"signals/s on MNIST-1D, batch {args.batch_size}, {threads} torch thread(s)")
    print(
        f"{'architecture':<36} {'plain':>8} {'stages':>8} {'ratio':>6} {'warm-up':>8} {'ratio':>6}"
    )
    for name, arch in _arches(space).items():
        model = supernet.subnet(arch).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        session = LocalEngine().open(supernet.subnet(arch).train(), arch, tuning)
        shared = torch.optim.Adam(supernet.parameters(), lr=1e-3)
        supernet.train()
        plain, stages, warm_up = rates(
            [
                functools.partial(_plain_step, model, optimizer),
                session.step,
                functools.partial(train_step, supernet, shared, archs=[arch], grad_clip=5.0),
            ]
        )
        print(
            f"{name:<36} {plain:>8.0f} {stages:>8.0f} {stages / plain:>5.2f}x "
            f"{warm_up:>8.0f} {warm_up / plain:>5.2f}x"
        )


def _plain_step(model, optimizer, x, y) -> None:  # type: ignore[no-untyped-def]
    """A textbook PyTorch training step: the peer."""
    import torch.nn.functional as F

    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def _cycle(dataset, args, generator):  # type: ignore[no-untyped-def]
    from optuna_hpcnas.data import iterate_batches

    while True:
        yield from iterate_batches(dataset, args.batch_size, shuffle=True, generator=generator)


if __name__ == "__main__":
    main()
