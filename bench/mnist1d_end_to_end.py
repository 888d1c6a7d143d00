"""MNIST-1D end to end: the main job against what a user has without it, in one run.

(a) the project's search as a user types it: ``hpcnas init --preset signal-1d``, ``hpcnas run``
    and ``hpcnas export`` (wall time of each, the best validation value after 10/20/40 trials,
    the exported model's test accuracy);
(b) Optuna's TPE over the same space with every candidate trained stand-alone on the training
    split (``--tpe-steps`` steps of the export recipe, by default 10 passes at the recipe's
    batch: 2,000 steps of 16 on MNIST-1D, 1,000 of the recipe's plan in steps of 64),
    scored on the validation split, given the same wall-clock budget as (a), its best
    architecture retrained with the same export recipe (on train + validation, as the export);
(c) the MNIST-1D paper's CNN (Greydanus 2020: 94 % test) trained with the same recipe.

Prints the test accuracies, the candidates each search evaluated and the cost ratio (seconds
per evaluated candidate). Every part uses the threads the machine gives one process (torch's
share of the cores, as ``hpcnas run`` sets it).

    python bench/mnist1d_end_to_end.py [--generator-seed 42] [--config nas.toml] [--ranks 2]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import math
import os
from pathlib import Path
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Result:
    seconds: float
    test_accuracy: float
    candidates: int | None = None
    note: str = ""
    steps: int | None = None  # of each candidate's stand-alone training


def _hpcnas(*args: str, cwd: Path, ranks: int = 1) -> tuple[float, str]:
    command = [str(VENV_BIN / "hpcnas"), *args]
    if ranks > 1:  # as integrations/mpirun launches it: one evaluation group per rank
        command = [str(VENV_BIN / "mpirun"), "-n", str(ranks), sys.executable, "-m", "mpi4py"]
        command += ["-m", "optuna_hpcnas", *args]
    started = time.perf_counter()
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"hpcnas {args[0]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return seconds, out.stdout + out.stderr


def ours(work: Path, config: Path | None, generator_seed: int | None, ranks: int) -> Result:
    """(a): the CLI path, timed as a whole (``hpcnas run`` under ``mpirun -n ranks``)."""
    import optuna

    if config is None:
        _hpcnas("init", "--preset", "signal-1d", "--out", "nas.toml", cwd=work)
        config = work / "nas.toml"
    if generator_seed is not None:
        text = config.read_text().replace(
            'name = "mnist1d"', f'name = "mnist1d"\ngenerator_seed = {generator_seed}'
        )
        config = work / "nas-draw.toml"
        config.write_text(text)
    run_seconds, _ = _hpcnas(
        "run", "--config", str(config), "--no-progress", cwd=work, ranks=ranks
    )
    export_seconds, text = _hpcnas("export", "--config", str(config), "--out", "best", cwd=work)
    found = re.search(r"test accuracy ([0-9.]+)", text)
    assert found is not None, text
    storage = f"sqlite:///{work / 'nas.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    trials = sorted(
        (t for t in study.get_trials(deepcopy=False) if t.state.is_finished()),
        key=lambda t: t.number,
    )  # the budget's trials not reached before the timeout stay WAITING: not counted
    best_after = []
    for n in (10, 20, 40, len(trials)):
        done = [t.value for t in trials[:n] if t.state.name == "COMPLETE" and t.value is not None]
        best_after.append(f"{n}: {max(done):.4f}" if done else f"{n}: -")
    print("    best validation accuracy after N trials: " + ", ".join(best_after))
    return Result(
        seconds=run_seconds + export_seconds,
        test_accuracy=float(found.group(1)),
        candidates=len(trials),
        note=f"run {run_seconds:.0f} s, export {export_seconds:.0f} s",
    )


def tpe(budget: float, steps: int | None, seed: int, generator_seed: int | None) -> Result:
    """(b): TPE, each candidate trained from scratch on the training split for ``steps``
    (default: 10 passes over it at the recipe's batch size); stops when the next candidate
    would not fit ``budget`` seconds with the final retraining."""
    import optuna

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.evaluation import train_model
    from optuna_hpcnas.supernet import SuperNet

    data = _data(generator_seed)
    space = HierarchicalSearchSpace.preset("signal-1d").fitting(1)
    recipe = _recipe()
    if steps is None:  # ten passes at the recipe's batch, in steps of its plan (a batch of 64)
        plan = recipe.schedule(data.sizes[0])
        steps = round(10 * math.ceil(data.sizes[0] / plan.batch_size) * plan.scale)
    # the validation split scores the candidates: they never train on it
    short = ScratchTrainingConfig(
        **{**_recipe_dict(), "steps": steps, "latency_repeats": 0, "holdout": True}
    )
    started = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    per_candidate = 0.0
    while True:
        elapsed = time.perf_counter() - started
        final = per_candidate * recipe.steps / max(steps, 1)
        if study.trials and elapsed + per_candidate + final > budget:
            break
        trial = study.ask()
        arch = space.suggest(trial)
        shape, classes = data.input_shape, data.num_classes
        net = SuperNet(space, input_shape=shape, num_classes=classes, seed=trial.number)
        t0 = time.perf_counter()
        result = train_model(net.subnet(arch), data, short)
        per_candidate = max(per_candidate, time.perf_counter() - t0)
        study.tell(trial, result["valid_accuracy"])
    best = space.from_params(study.best_params)
    net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
    final_result = train_model(net.subnet(best), data, recipe)
    return Result(
        seconds=time.perf_counter() - started,
        test_accuracy=float(final_result["test_accuracy"]),
        candidates=len(study.trials),
        note=best.describe(),
        steps=steps,
    )


def paper_cnn(generator_seed: int | None) -> Result:
    """(c): the paper's CNN, trained with the export recipe."""
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.evaluation import train_model
    from optuna_hpcnas.search_space import SIGNAL_1D_PAPER_MODELS
    from optuna_hpcnas.supernet import SuperNet

    data = _data(generator_seed)
    space = HierarchicalSearchSpace.preset("signal-1d").fitting(1)
    arch = space.from_params(SIGNAL_1D_PAPER_MODELS["cnn"])
    net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
    started = time.perf_counter()
    result = train_model(net.subnet(arch), data, _recipe())
    return Result(time.perf_counter() - started, float(result["test_accuracy"]))


def _data(generator_seed: int | None):  # type: ignore[no-untyped-def]
    from optuna_hpcnas.config import DataConfig

    return DataConfig(name="mnist1d", generator_seed=generator_seed).load()


def _recipe_dict() -> dict[str, Any]:
    """The ``[export]`` table of ``hpcnas init --preset signal-1d``."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    from optuna_hpcnas.cli import starter

    return dict(tomllib.loads(starter("signal-1d"))["export"])


def _recipe():  # type: ignore[no-untyped-def]
    from optuna_hpcnas.evaluation import ScratchTrainingConfig

    return ScratchTrainingConfig(**_recipe_dict())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, help="a run config (default: hpcnas init's)")
    parser.add_argument("--generator-seed", type=int, help="another draw of MNIST-1D")
    parser.add_argument(
        "--tpe-steps",
        type=int,
        default=None,
        help="stand-alone optimisation steps per TPE candidate (default: 10 passes over the "
        "training split at the recipe's batch: 2,000 steps of 16 on MNIST-1D)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-peers", action="store_true", help="only (a)")
    parser.add_argument("--workdir", type=Path, help="keep (a)'s study and export here")
    parser.add_argument(
        "--ranks", type=int, default=1, help="(a) under `mpirun -n RANKS` (one group per rank)"
    )
    args = parser.parse_args()

    from optuna_hpcnas.run import configure_threads

    configure_threads(requested=None, ranks_on_node=1)
    with tempfile.TemporaryDirectory() as tmp:
        config = args.config.resolve() if args.config else None
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        a = ours(work.resolve(), config, args.generator_seed, args.ranks)
    print(
        f"(a) hpcnas run + export: {a.seconds:.0f} s ({a.note}), {a.candidates} trials, "
        f"test accuracy {a.test_accuracy:.4f}"
    )
    if args.skip_peers:
        return
    b = tpe(a.seconds, args.tpe_steps, args.seed, args.generator_seed)
    c = paper_cnn(args.generator_seed)
    rows = [
        ("(a) hpcnas run + export (weight sharing)", a),
        (f"(b) Optuna TPE, each candidate {b.steps} steps stand-alone", b),
        ("(c) the paper's CNN (94 % in the paper)", c),
    ]
    print(f"\nMNIST-1D, generator seed {args.generator_seed or 42}, {os.cpu_count()} CPUs")
    print(f"{'method':<58} {'seconds':>8} {'candidates':>10} {'s/candidate':>11} {'test':>7}")
    for label, r in rows:
        per = f"{r.seconds / r.candidates:.1f}" if r.candidates else "-"
        count = str(r.candidates or "-")
        print(f"{label:<58} {r.seconds:>8.0f} {count:>10} {per:>11} {r.test_accuracy:>7.4f}")
    assert a.candidates and b.candidates
    ratio = (b.seconds / b.candidates) / (a.seconds / a.candidates)
    print(f"cost per candidate, TPE stand-alone / weight sharing: {ratio:.1f}x")
    print(f"TPE's pick: {b.note}")


if __name__ == "__main__":
    main()
