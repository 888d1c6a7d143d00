"""Time-series classification against the textbook models, at equal wall-clock, in one run.

For every data set and seed, on the same cores one after the other:

(a) the project as a user types it: ``hpcnas init --preset signal-1d``, the ``[data]`` table
    pointed at the set, ``hpcnas run`` (its timeout leaving room for the export inside the
    budget) and ``hpcnas export``; the exported model's test accuracy, wall time of both;
(b) the textbook models alone, FCN and ResNet of Wang et al. 2017 (``bench/_textbook.py``),
    with the literature's recipe on the whole training set, each given the whole budget;
(c) what a user of Optuna writes: ``TPESampler`` + ``HyperbandPruner`` over stand-alone
    training of the same (fitted) ``signal-1d`` space (Adam 1e-3, batches of min(N/10, 16)
    of the training split, validation accuracy every 50 steps, at most 1,000 steps), for the
    budget less the final training; the best architecture then trained with (a)'s export
    recipe on train + validation; ``random+sh``: the same with ``RandomSampler`` +
    ``SuccessiveHalvingPruner``.

(a) runs in two modes: ``hpcnas`` (multi-fidelity, the ``signal-1d`` starter: every
candidate trained through the stages) and ``hpcnas-one-shot`` (the ``signal-elastic``
starter: the supernet warmed up, candidates scored by inherited weights, the best few
trained through the stages). (a)'s warm-up runs before its search timeout, so the peers
(b) and (c) are each given the longest wall time an (a) arm of the same set and seed took
(the budget at least): any advantage of time is theirs.

Data: GunPoint, ItalyPowerDemand and BasicMotions (and, on request, ArrowHead, OSULeaf,
ACSF1, JapaneseVowels and PickupGestureWiimoteZ, sets the starters were not developed on) as
aeon's wheel ships them (the archive's train/test split, read offline), MNIST-1D (4,000 /
1,000, generator seed 42) and scikit-learn's digits (8x8 images: (a) runs the ``digits-small``
and ``digits-elastic`` starters, (c) searches ``digits-small``, and (b) has no
textbook image model here); the seed draws the validation split, the samplers and the
weights. Prints test accuracy, mean +- s.e. over the seeds, beside the published FCN /
ResNet figures (Fawaz et al. 2019, mean of 10 runs). Results go to ``--out`` as they finish
(JSON), and a rerun skips what is there.

    python bench/tsc_vs_textbook.py [--sets GunPoint ...] [--seeds 0 1 2] [--minutes 20]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

VENV_BIN = Path(sys.executable).parent
# the protocol's sets, then the classification sets aeon's wheel also ships that the starters
# were never developed on (ArrowHead: 36 series of 251; OSULeaf: 200 of 427, 6 classes;
# ACSF1: 100 of 1,460, 10 classes; JapaneseVowels: 270 of 7-26 positions, 12 channels, 9
# classes; PickupGestureWiimoteZ: 50 of 29-361 positions, 10 classes): a check on data the
# project has not seen, ragged ones included
SETS = (
    "GunPoint", "ItalyPowerDemand", "BasicMotions", "mnist1d", "digits",
    "ArrowHead", "OSULeaf", "ACSF1", "JapaneseVowels", "PickupGestureWiimoteZ",
)  # fmt: skip
PROTOCOL_SETS = SETS[:5]
# Fawaz et al. 2019 (FCN, ResNet; the archive's split, mean of 10 runs): the UCR 2015 sets from
# their Table 4 (results/results-uea-avg-std.csv of github.com/hfawaz/dl-4-tsc),
# JapaneseVowels from their multivariate table (results/results-mts-avg-std.csv, Baydogan's
# copy of the same 270 / 370 split). BasicMotions, PickupGestureWiimoteZ, ACSF1 and MNIST-1D
# are not in them.
PUBLISHED = {
    "GunPoint": (100.0, 99.1),
    "ItalyPowerDemand": (96.1, 96.3),
    "ArrowHead": (84.3, 84.5),
    "OSULeaf": (97.7, 97.9),
    "JapaneseVowels": (99.3, 99.2),
}
METHODS = ("hpcnas", "hpcnas-one-shot", "fcn", "resnet", "tpe+hyperband", "random+sh")
DEFAULT_METHODS = ("hpcnas", "hpcnas-one-shot", "fcn", "resnet", "tpe+hyperband")
# the starter each of (a)'s modes runs: multi-fidelity over the mixed space, one-shot over
# the nested elastic one
PRESETS = {"hpcnas": "signal-1d", "hpcnas-one-shot": "signal-elastic"}
IMAGE_PRESETS = {"hpcnas": "digits-small", "hpcnas-one-shot": "digits-elastic"}
TEXTBOOK = ("fcn", "resnet")  # time-series models: not run on images


def presets(name: str) -> dict[str, str]:
    """The starter of each of (a)'s modes on the set ``name``."""
    return IMAGE_PRESETS if name == "digits" else PRESETS


def _data_table(name: str, seed: int) -> dict[str, Any]:
    if name in ("mnist1d", "digits"):
        return {"name": name, "seed": seed}
    return {"name": "aeon", "dataset": name, "seed": seed}


def _load(name: str, seed: int) -> Any:
    from optuna_hpcnas.config import DataConfig

    return DataConfig(**_data_table(name, seed)).load()


# ---------------------------------------------------------------------------- (a)
def hpcnas(name: str, seed: int, budget: float, work: Path, preset: str) -> dict[str, Any]:
    """(a): ``hpcnas init --preset``, ``run`` and ``export``, timed as a whole."""
    import tomli_w

    config = _starter(preset)
    config["data"] = _data_table(name, seed)
    config["sampler"]["seed"] = seed
    config["training"]["seed"] = seed
    config["export"]["seed"] = seed
    # the export and the run's start (data, warm-up) inside the budget
    config["study"]["timeout"] = max(30.0, 0.85 * budget - 30.0)
    # the image starters end on their n_trials (no timeout): here the timeout ends them, as
    # it ends the signal starters (2,000 trials: more than either digits space holds)
    config["study"]["n_trials"] = max(config["study"]["n_trials"], 2000)
    config["study"]["storage"] = f"sqlite:///{work / 'nas.db'}"
    path = work / "nas.toml"
    path.write_text(tomli_w.dumps(config))
    started = time.perf_counter()
    run = _hpcnas("run", "--config", str(path), "--no-progress", cwd=work)
    run_seconds = time.perf_counter() - started
    export = _hpcnas("export", "--config", str(path), "--out", "best", "--no-onnx", cwd=work)
    found = re.search(r"test accuracy ([0-9.]+)", export)
    assert found is not None, export
    chosen = re.search(r"exported trial (\d+)", export)
    trials = re.search(r"study '[^']+': (.*)", run)
    return {
        "test": float(found.group(1)),
        "seconds": time.perf_counter() - started,
        "run_seconds": run_seconds,
        "trials": trials.group(1) if trials else "",
        "exported_trial": int(chosen.group(1)) if chosen else None,
        "published_choice": "published model" in export,
        **_study_figures(work),
    }


def _study_figures(work: Path) -> dict[str, Any]:
    """The best trial's value and the published models' values, from the run's study."""
    import optuna

    storage = f"sqlite:///{work / 'nas.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    complete = _trained(study)
    best = max(complete, key=lambda t: t.values[0])
    references = {
        str(t.user_attrs["reference_model"]): round(float(t.values[0]), 4)
        for t in complete
        if "reference_model" in t.user_attrs
    }
    return {
        "best_value": round(float(best.values[0]), 4),
        "best_architecture": best.user_attrs.get("arch_description", ""),
        "reference_values": references,
        "best_valid_over_time": _trajectory(study),
    }


def _trained(study: Any) -> list[Any]:
    """The completed trials whose value is a trained model's (not a one-shot score by
    inherited weights)."""
    import optuna

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [t for t in complete if t.user_attrs.get("fidelity") != "inherited"]


def _trajectory(study: Any) -> list[tuple[float, float]]:
    """``(seconds since the study's first trial started, best validation value so far)`` at
    every completed trial that improved it: the curve of best validation against time."""

    complete = _trained(study)
    starts = [t.datetime_start for t in study.get_trials(deepcopy=False) if t.datetime_start]
    if not complete or not starts:
        return []
    origin = min(starts)
    curve: list[tuple[float, float]] = []
    for trial in sorted(complete, key=lambda t: t.datetime_complete):
        value = float(trial.values[0])
        if not curve or value > curve[-1][1]:
            seconds = (trial.datetime_complete - origin).total_seconds()
            curve.append((round(seconds, 1), round(value, 4)))
    return curve


def _starter(preset: str = "signal-1d") -> dict[str, Any]:
    """The starter that ``hpcnas init --preset`` writes, as a table."""
    from optuna_hpcnas.cli import starter
    from optuna_hpcnas.config import tomllib

    return dict(tomllib.loads(starter(preset)))


def _hpcnas(*args: str, cwd: Path) -> str:
    out = subprocess.run(
        [str(VENV_BIN / "hpcnas"), *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"hpcnas {args[0]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


# ---------------------------------------------------------------------------- (b)
def textbook(model: str, name: str, seed: int, budget: float) -> dict[str, Any]:
    """(b): FCN or ResNet alone, the literature's recipe, the whole training set."""
    from bench._textbook import accuracy
    from bench._textbook import fit
    from optuna_hpcnas.data import joined

    data = _load(name, seed)
    train = joined(data.train, data.valid)
    x, y = train.tensors  # type: ignore[attr-defined]
    started = time.perf_counter()
    net, info = fit(model, x, y, data.num_classes, seconds=budget, seed=seed)
    seconds = time.perf_counter() - started
    xt, yt = data.test.tensors  # type: ignore[attr-defined]
    return {"test": accuracy(net, xt, yt), "seconds": seconds, **info}


# ---------------------------------------------------------------------------- (c)
def optuna_peer(name: str, seed: int, budget: float, method: str) -> dict[str, Any]:
    """(c): TPE + Hyperband (or Random + successive halving) over stand-alone training of
    the space, then the export recipe."""
    import optuna
    import torch
    import torch.nn.functional as F

    from optuna_hpcnas.data import stream_batches
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.evaluation import train_model
    from optuna_hpcnas.search_space import fit_to_input
    from optuna_hpcnas.search_space import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet

    data = _load(name, seed)
    preset = presets(name)["hpcnas"]
    space = HierarchicalSearchSpace.preset(preset).fitting(1)
    space = fit_to_input(space, data.input_shape).space
    batch = max(2, min(len(data.train) // 10, 16))  # type: ignore[arg-type]
    every, rounds = 50, 20

    def build(arch: Any, number: int) -> torch.nn.Module:
        net = SuperNet(
            space, input_shape=data.input_shape, num_classes=data.num_classes, seed=number
        )
        return net.subnet(arch).train()

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        trial.set_user_attr("arch", arch.to_json())
        model = build(arch, trial.number)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(trial.number)
        batches = stream_batches(data.train, batch, generator=generator)
        accuracy = 0.0
        for r in range(1, rounds + 1):
            model.train()
            for _, (x, y) in zip(range(every), batches):
                loss = F.cross_entropy(model(x), y)
                if not torch.isfinite(loss):
                    raise optuna.TrialPruned("non-finite loss")
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            accuracy, _ = evaluate(model, data.valid)
            trial.report(accuracy, r)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return accuracy

    if method == "tpe+hyperband":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True
        )
        pruner: optuna.pruners.BasePruner = optuna.pruners.HyperbandPruner(
            min_resource=1, max_resource=rounds
        )
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    started = time.perf_counter()
    study.optimize(objective, timeout=0.85 * budget - 30.0, catch=(RuntimeError, ValueError))
    from optuna_hpcnas import Architecture

    recipe = ScratchTrainingConfig(**_starter(preset)["export"], seed=seed)
    best = Architecture.from_json(study.best_trial.user_attrs["arch"])
    result = train_model(build(best, seed), data, recipe)
    states = [t.state.name for t in study.trials]
    return {
        "test": result["test_accuracy"],
        "seconds": time.perf_counter() - started,
        "trials": f"{states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned",
        "best_valid": study.best_value,
        "best_valid_over_time": _trajectory(study),
    }


# ---------------------------------------------------------------------------- table
def _methods_run(results: dict[str, Any]) -> list[str]:
    """The methods that have a result, in ``METHODS`` order."""
    run = {key.split("/")[2] for key in results}
    return [m for m in METHODS if m in run]


def tsc_table(results: dict[str, Any], sets: list[str], seeds: list[int]) -> str:
    """Test accuracy (%) per set and method, mean +- s.e. over the seeds, beside the
    published figures."""
    methods = _methods_run(results)
    head = "| set | " + " | ".join(methods) + " | published FCN / ResNet |"
    lines = [head, "|" + "---|" * (len(methods) + 2)]
    for name in sets:
        cells = []
        for method in methods:
            values = [
                results[key]["test"]
                for seed in seeds
                if (key := f"{name}/{seed}/{method}") in results
            ]
            cells.append(_mean_se(values))
        fcn, resnet = PUBLISHED.get(name, (None, None))
        published = f"{fcn} / {resnet}" if fcn is not None else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {published} |")
    return "\n".join(lines)


def seconds_table(results: dict[str, Any], sets: list[str], seeds: list[int]) -> str:
    """Wall seconds each method took (mean over the seeds), and what (a) exported."""
    methods = _methods_run(results)
    lines = ["| set | " + " | ".join(f"{m} s" for m in methods) + " | (a) exported |"]
    lines.append("|" + "---|" * (len(methods) + 2))
    for name in sets:
        cells = []
        for method in methods:
            walls = [
                results[key]["wall"]
                for seed in seeds
                if (key := f"{name}/{seed}/{method}") in results
            ]
            cells.append(f"{sum(walls) / len(walls):,.0f}" if walls else "-")
        picks = [
            f"trial {r.get('exported_trial')}"
            + (" (a published model within the margin)" if r.get("published_choice") else "")
            for seed in seeds
            if (r := results.get(f"{name}/{seed}/hpcnas")) is not None
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {', '.join(picks) or '-'} |")
    return "\n".join(lines)


ARMS = {
    "hpcnas": "`hpcnas run` + `export`, multi-fidelity (`{hpcnas}` starter)",
    "hpcnas-one-shot": "`hpcnas run` + `export`, one-shot (`{hpcnas-one-shot}` starter)",
    "fcn": "FCN alone (Wang et al. 2017)",
    "resnet": "ResNet alone (Wang et al. 2017)",
    "tpe+hyperband": "Optuna `TPESampler` + `HyperbandPruner`, stand-alone training",
    "random+sh": "Optuna `RandomSampler` + `SuccessiveHalvingPruner`, stand-alone training",
}


def result_seeds(results: dict[str, Any], name: str | None = None) -> list[int]:
    """The seeds of ``results`` (keys ``set/seed/method``), of the set ``name`` where given."""
    return sorted(
        {int(key.split("/")[1]) for key in results if name is None or key.startswith(f"{name}/")}
    )


def result_sets(results: dict[str, Any]) -> list[str]:
    """The sets of ``results``, in ``SETS`` order."""
    return [name for name in SETS if any(key.startswith(f"{name}/") for key in results)]


def results_table(results: dict[str, Any], name: str) -> str:
    """One row per method on ``name``: test accuracy (mean +- s.e. over the seeds run), wall
    minutes and the candidates its search evaluated."""
    seeds = result_seeds(results, name)
    lines = [
        f"| {name}, seeds {', '.join(map(str, seeds))} | test accuracy (%) | wall (min) "
        "| candidates |",
        "|---|---|---|---|",
    ]
    for method in METHODS:
        runs = [r for seed in seeds if (r := results.get(f"{name}/{seed}/{method}"))]
        if not runs:
            continue
        wall = sum(r["wall"] for r in runs) / len(runs) / 60
        # the budget's placeholders a timeout left WAITING were never candidates
        counts = [
            ", ".join(p for p in str(r["trials"]).split(", ") if "waiting" not in p)
            for r in runs
            if r.get("trials")
        ]
        trials = "; ".join(counts) or "-"
        accuracy = _mean_se([r["test"] for r in runs])
        arm = ARMS[method]
        for mode, preset in presets(name).items():
            arm = arm.replace("{" + mode + "}", preset)
        lines.append(f"| {arm} | {accuracy} | {wall:.1f} | {trials} |")
    return "\n".join(lines)


def _mean_se(values: list[float]) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{100 * mean:.1f} (n=1)"
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return f"{100 * mean:.1f} +- {100 * math.sqrt(var / len(values)):.1f} (n={len(values)})"


def plot_over_time(results: dict[str, Any], name: str, seeds: list[int], out: Path) -> None:
    """Best validation accuracy against wall time of each search arm on ``name`` (one line
    per seed), the textbook models' test accuracy as horizontal marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, color in zip(METHODS, ("tab:red", "tab:orange", "k", "tab:gray", "b", "g")):
        for i, seed in enumerate(seeds):
            result = results.get(f"{name}/{seed}/{method}")
            if result is None:
                continue
            curve = result.get("best_valid_over_time") or []
            if curve:
                xs = [t / 60 for t, _ in curve] + [result["wall"] / 60]
                ys = [v for _, v in curve] + [curve[-1][1]]
                label = f"{method} (best validation)" if i == 0 else None
                ax.step(xs, ys, where="post", color=color, label=label)
            elif method in ("fcn", "resnet"):
                label = f"{method} alone (test)" if i == 0 else None
                ax.axhline(result["test"], color=color, ls=":", label=label)
    ax.set_xlabel("wall time of the arm (minutes, 2 cores)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.8, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"{name}: best validation accuracy against time, seeds {seeds}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(PROTOCOL_SETS), choices=SETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=20.0, help="budget of each method")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=METHODS)
    parser.add_argument("--out", default="bench/results/tsc_vs_textbook.json")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep each search arm's study and export here"
    )
    parser.add_argument(
        "--table-only", action="store_true", help="print the table of --out, run nothing"
    )
    parser.add_argument(
        "--plot", type=Path, help="with --table-only: the first set's curves to this PNG"
    )
    args = parser.parse_args()
    if args.table_only:
        results = json.loads(Path(args.out).read_text())
        if args.plot is not None:
            plot_over_time(results, args.sets[0], args.seeds, args.plot)
        print(f"test accuracy (%), {args.minutes:g} minutes per method, seeds {args.seeds}")
        print(tsc_table(results, args.sets, args.seeds))
        print(seconds_table(results, args.sets, args.seeds))
        return

    import torch

    torch.set_num_threads(2)  # (b) and (c) in this process: the same two cores as (a)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.is_file() else {}
    budget = 60.0 * args.minutes
    for seed in args.seeds:
        for name in args.sets:
            for method in sorted(args.methods, key=METHODS.index):  # (a) first
                key = f"{name}/{seed}/{method}"
                if key in results or (name == "digits" and method in TEXTBOOK):
                    continue
                # (a)'s warm-up runs before its timeout: every peer gets the longest wall
                # time an (a) arm of this set and seed took, the budget at least
                walls = [r["wall"] for m in PRESETS if (r := results.get(f"{name}/{seed}/{m}"))]
                given = budget if method in PRESETS else max([budget, *walls])
                started = time.perf_counter()
                if method in PRESETS:
                    preset = presets(name)[method]
                    if args.keep is not None:  # the study and export, kept to be read
                        kept = args.keep / key.replace("/", "-")
                        kept.mkdir(parents=True, exist_ok=True)
                        result = hpcnas(name, seed, budget, kept, preset)
                    else:
                        with tempfile.TemporaryDirectory() as work:
                            result = hpcnas(name, seed, budget, Path(work), preset)
                elif method in ("tpe+hyperband", "random+sh"):
                    result = optuna_peer(name, seed, given, method)
                else:
                    result = textbook(method, name, seed, given)
                result["wall"] = time.perf_counter() - started
                result["budget_s"] = given
                results[key] = result
                out.write_text(json.dumps(results, indent=1))
                print(key, json.dumps(result), flush=True)
    minutes = f"{args.minutes:g} minutes per method on 2 cores"
    print(f"\ntest accuracy (%), {minutes}, seeds {args.seeds}")
    print(tsc_table(results, args.sets, args.seeds))
    print(seconds_table(results, args.sets, args.seeds))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
