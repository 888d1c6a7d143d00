"""``hpcnas run`` vs the Python API on the same budget: wall time, best value, same trials.

Both run ``examples/nas.toml`` (digits-small, EvolutionarySampler, StagedPruner, supernet
warm-up) for ``--trials`` trials, each in its own process with one torch thread: the API path
as a user writes it (``SupernetObjective`` + ``study.optimize``), the CLI path as typed
(``hpcnas run --config ...``). Peer in the same run: the API. Since both use the one
evaluation core with the same seeds, the trial values should agree one by one.

    python bench/run_vs_api.py --trials 20
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import subprocess
import sys
import tempfile
import time

from _stored import store_result

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "nas.toml"


def api_worker(storage: str, trials: int) -> None:
    """The API path, written as a user writes it, with the values of examples/nas.toml."""
    import optuna

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas import SupernetObjective
    from optuna_hpcnas.config import load_config
    from optuna_hpcnas.pruners import StagedPruner
    from optuna_hpcnas.samplers import EvolutionarySampler

    config = load_config(CONFIG)  # the same numbers as the CLI run, read from the same file
    space = HierarchicalSearchSpace.preset("digits-small")
    objective = SupernetObjective(
        space,
        config.data.load(),
        training=config.training.supernet,
        plan=config.stages,
        config=config.objective,
        seed=config.training.supernet.seed,
        threads=1,  # as the CLI run's training.threads=1
    )
    objective.train_supernet()
    study = optuna.create_study(
        study_name="api",
        storage=storage,
        direction="maximize",
        sampler=EvolutionarySampler(seed=config.sampler.seed),
        pruner=StagedPruner(config.stages),
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=trials)


def _timed(cmd: list[str], cwd: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return time.perf_counter() - t0


def _summary(storage: str, name: str) -> dict:
    import optuna

    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    return {
        "best": study.best_value,
        "complete": sum(t.state.name == "COMPLETE" for t in trials),
        "pruned": sum(t.state.name == "PRUNED" for t in trials),
        "values": [t.value for t in trials],
        "archs": [t.user_attrs.get("arch_description") for t in trials],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--api-worker", nargs=2, metavar=("STORAGE", "TRIALS"))
    parser.add_argument("--out", type=Path, help="also store the result as JSON here")
    args = parser.parse_args()
    if args.api_worker:
        api_worker(args.api_worker[0], int(args.api_worker[1]))
        return
    work = Path(tempfile.mkdtemp(prefix="hpcnas-run-vs-api-"))
    api_url, cli_url = f"sqlite:///{work / 'api.db'}", f"sqlite:///{work / 'cli.db'}"
    api_s = _timed([sys.executable, __file__, "--api-worker", api_url, str(args.trials)], cwd=work)
    cli_s = _timed(
        [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(CONFIG)]
        + ["--storage", cli_url, "--n-trials", str(args.trials), "--no-progress"]
        + ["--set", "metrics.enabled=false", "--set", "training.threads=1"],
        cwd=work,
    )
    api, cli = _summary(api_url, "api"), _summary(cli_url, "digits")
    same = sum(
        a == c and x == y
        for a, c, x, y in zip(api["values"], cli["values"], api["archs"], cli["archs"])
    )
    print(f"{args.trials} trials of examples/nas.toml, one torch thread per process")
    print(f"{'path':<12} {'wall s':>8} {'best':>8} {'complete':>8} {'pruned':>7} {'vs API':>7}")
    for name, s, r in (("API", api_s, api), ("hpcnas run", cli_s, cli)):
        print(
            f"{name:<12} {s:8.1f} {r['best']:8.4f} {r['complete']:8d} {r['pruned']:7d} "
            f"{s / api_s:6.2f}x"
        )
    print(f"trials with the same architecture and value: {same}/{args.trials}")
    record = {"trials": args.trials, "api_s": api_s, "cli_s": cli_s, "same": same}
    print(json.dumps(record))
    if args.out is not None:
        store_result(args.out, record)


if __name__ == "__main__":
    main()
