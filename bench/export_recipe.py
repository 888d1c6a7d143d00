"""Does the export recipe converge? A signal starter's ``[export]`` on each data set.

Trains the FCN baseline of the starter's space (``reference_models(preset)["fcn"]``) with
the starter's export recipe (Adam, cosine, ``steps`` steps, batch and learning rate following
the data) on train + validation, as ``hpcnas export`` does, and records the smoothed training
loss and the test accuracy every tenth of the budget, for each seed. Prints a table and draws
the curves (``--plot``, the figure in docs/signals.md). A recipe that converges has a flat
loss and test accuracy over its last tenths. ``--max-batch-sizes 16 64`` runs the recipe
once per cap on the batch, in the same run (the starter's cap and the one it replaced).

    python bench/export_recipe.py [--sets GunPoint ItalyPowerDemand BasicMotions mnist1d]
        [--seeds 0 1 2] [--preset signal-1d] [--steps S] [--max-batch-sizes 16 64]
        [--plot docs/images/export_recipe.png]
        [--fixed-lr 1e-2]   # one rate at every batch size instead of the square-root rule
        [--model plain]  # or plain-norm, wang: which FCN (``MODELS``)
        [--average 0.25]  # weight averaging over the last quarter of the steps
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

SETS = ("GunPoint", "ItalyPowerDemand", "BasicMotions", "mnist1d", "ArrowHead", "OSULeaf", "ACSF1")
DEFAULT_SETS = SETS[:4]  # the protocol's; the others are held out (bench/tsc_vs_textbook.py)


# the FCN trained: the space's (its subnet, as `hpcnas export` builds it: no norm before the
# pooling), a plain PyTorch FCN of the same widths and kernels without and with a LayerNorm
# before its pooling (the sequence head's, before it normalised after attention cells only),
# and Wang et al.'s own (bench/_textbook.py)
MODELS = ("space", "plain", "plain-norm", "wang")


class PlainFCN(nn.Module):
    """Conv1d-BatchNorm-ReLU layers (same padding), optionally a LayerNorm over the channels
    of every position, global average pooling, a linear classifier."""

    def __init__(
        self, channels: int, classes: int, convs: list[tuple[int, int]], *, norm: bool
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width, kernel in convs:
            layers += [nn.Conv1d(channels, width, kernel, padding="same"), nn.BatchNorm1d(width)]
            layers.append(nn.ReLU())
            channels = width
        self.body = nn.Sequential(*layers)
        self.norm: nn.Module = nn.LayerNorm(channels) if norm else nn.Identity()
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, L, C)
        h = self.body(x.transpose(1, 2)).transpose(1, 2)
        return self.head(self.norm(h).mean(dim=1))


def _model(kind: str, net: Any, arch: Any, data: Any, seed: int) -> nn.Module:
    if kind == "space":
        return net.subnet(arch)
    torch.manual_seed(seed)
    channels, classes = data.input_shape[1], data.num_classes
    if kind == "wang":
        from _textbook import FCN

        return FCN(channels, classes)
    convs = [(cell.width, cell.kernel) for cell in arch.cells if cell.op != "identity"]
    return PlainFCN(channels, classes, convs, norm=kind == "plain-norm")


def curve(
    name: str,
    seed: int,
    preset: str,
    steps: int | None,
    cap: int | None,
    fixed_lr: float | None,
    model_kind: str = "space",
    average: float | None = None,
) -> dict[str, Any]:
    from optuna_hpcnas.cli import starter
    from optuna_hpcnas.config import DataConfig
    from optuna_hpcnas.config import tomllib
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.evaluation import train_model
    from optuna_hpcnas.evaluation import training_set
    from optuna_hpcnas.search_space import fit_to_input
    from optuna_hpcnas.search_space import HierarchicalSearchSpace
    from optuna_hpcnas.search_space import reference_models
    from optuna_hpcnas.supernet import SuperNet

    table = {"name": "mnist1d"} if name == "mnist1d" else {"name": "aeon", "dataset": name}
    data = DataConfig(**table, seed=seed).load()
    space = fit_to_input(HierarchicalSearchSpace.preset(preset), data.input_shape).space
    arch = space.from_params(reference_models(preset)["fcn"])
    net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes, seed=seed)
    model = _model(model_kind, net, arch, data, seed)
    export = tomllib.loads(starter(preset))["export"]
    if steps is not None:
        export["steps"] = steps
    if cap is not None:
        export["max_batch_size"] = cap
    if average is not None:
        export["average"] = average
    recipe = ScratchTrainingConfig(**{**export, "seed": seed, "latency_repeats": 0})
    samples = len(training_set(data, recipe))
    if fixed_lr is not None:  # the same batch, the rate and steps not scaled with it
        recipe = replace(recipe, lr=fixed_lr, batch_size=recipe.schedule(samples).batch_size)
    losses: list[float] = []
    tests: dict[int, float] = {}
    taken = recipe.schedule(samples).steps  # what train_model takes
    tenth = max(1, taken // 10)

    def on_step(step: int, loss: float) -> None:
        losses.append(loss)
        if step % tenth == 0:
            tests[step], _ = evaluate(model, data.test)
            model.train()

    started = time.perf_counter()
    result = train_model(model, data, recipe, on_step=on_step)
    return {
        "set": name,
        "seed": seed,
        "cap": recipe.max_batch_size,
        "average": recipe.average,
        "batch": result["batch_size"],
        "seconds": time.perf_counter() - started,
        "test": result["test_accuracy"],
        "steps": result["steps"],
        "loss": [float(np.mean(losses[i : i + tenth])) for i in range(0, 10 * tenth, tenth)],
        "tests": [tests[s] for s in sorted(tests)][:10],
    }


def _plot(rows: list[dict[str, Any]], path: Path, preset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    colours = {name: f"C{i}" for i, name in enumerate(SETS)}
    first_cap = rows[0]["cap"]
    for row in rows:
        x = np.arange(1, len(row["loss"]) + 1) * 10
        first = row["seed"] == rows[0]["seed"]
        label = f"{row['set']} (batch {row['batch']})" if first else None
        style = {"color": colours[row["set"]], "alpha": 0.7, "label": label}
        style["linestyle"] = "-" if row["cap"] == first_cap else "--"
        left.plot(x, row["loss"], **style)
        right.plot(x, row["tests"], **style)
    left.set(yscale="log", xlabel="% of the export's steps", ylabel="training loss")
    right.set(xlabel="% of the export's steps", ylabel="test accuracy", ylim=(0.5, 1.01))
    left.legend()
    fig.suptitle(f"FCN with the {preset} export recipe (one line per seed)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(DEFAULT_SETS), choices=SETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--preset", default="signal-1d", choices=["signal-1d", "signal-elastic"])
    parser.add_argument("--steps", type=int, default=None, help="default: the starter's")
    parser.add_argument(
        "--max-batch-sizes",
        nargs="+",
        type=int,
        default=None,
        help="caps on the auto batch to compare (default: the starter's)",
    )
    parser.add_argument("--plot", default=None, help="PNG of the curves")
    parser.add_argument(
        "--model", default="space", choices=MODELS,
        help="which FCN: the space's, a plain one of its widths without / with a LayerNorm "
        "before the pooling, or Wang et al.'s",
    )  # fmt: skip
    parser.add_argument(
        "--average", type=float, default=None,
        help="share of the steps whose weights are averaged (default: the starter's)",
    )  # fmt: skip
    parser.add_argument(
        "--fixed-lr",
        type=float,
        default=None,
        help="this learning rate at every batch size (the rule's alternative)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [
        curve(name, seed, args.preset, args.steps, cap, args.fixed_lr, args.model, args.average)
        for name in args.sets
        for cap in args.max_batch_sizes or [None]
        for seed in args.seeds
    ]
    average = "" if args.average is None else f", weights averaged over the last {args.average}"
    print(f"FCN of {args.preset} ({args.model}), its starter's [export]{average}")
    print("| set | seed | batch | steps | seconds | test accuracy by tenth of the steps | final |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        tests = " ".join(f"{t:.3f}" for t in r["tests"])
        print(f"| {r['set']} | {r['seed']} | {r['batch']} | {r['steps']} | {r['seconds']:.0f} | "
              f"{tests} | {r['test']:.4f} |")  # fmt: skip
    print("\nmean final test accuracy per set and batch:")
    for name in args.sets:
        for batch in sorted({r["batch"] for r in rows if r["set"] == name}):
            tests = [r["test"] for r in rows if r["set"] == name and r["batch"] == batch]
            print(f"  {name:<17} batch {batch:>3}: {np.mean(tests):.4f} (n={len(tests)})")
    print("\nmean training loss by tenth (the last three should be flat):")
    for r in rows:
        print(f"  {r['set']:<17} seed {r['seed']} batch {r['batch']}: "
              + " ".join(f"{v:.4f}" for v in r["loss"]))  # fmt: skip
    if args.plot:
        _plot(rows, Path(args.plot), args.preset)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
