"""Benchmark 1: trials per second of the digits search with 1, 2 and 4 ranks, and the share
of each rank's time spent computing (forward, backward, optimizer, validation).

Each configuration is a real ``mpirun -n N python -m mpi4py -m optuna_hpcnas run``
launch against one SQLite study, groups of one rank (each rank its own group, weights
averaged between groups every trial). Peer in the same run: the 1-rank launch.

    python bench/distributed_throughput.py [--ranks 1 2 4] [--trials-per-rank 6] [--ask-ahead auto]
        [--config bench|starter] [--storage postgresql+psycopg://postgres@127.0.0.1/test]

On a machine with fewer cores than ranks the ranks share cores, so trials/s cannot scale
past the core count; the compute share still shows what the framework costs per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
import subprocess
import sys
import tempfile
import time

import optuna

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
CONFIG = """
[study]
name = "throughput"
storage = "{storage}"
n_trials = {n_trials}
[space]
preset = "digits-small"
[sampler]
name = "random"
seed = 0
[pruner]
name = "none"
[stages]
stages = [
    {{ name = "quick", steps = {quick}, lr = 1e-3 }},
    {{ name = "medium", steps = {medium}, lr = 1e-2 }},
]
eval_every = {quick}
[training]
epochs = 1
warmup_max_batches = 4
paths_per_batch = 2
[objective]
optimizer = "adam"
batch_size = 32
population_steps = {supernet_steps}
latency_repeats = 2
[distributed]
group_size = 1
sync_interval = 2
ask_ahead = "{ask_ahead}"
"""


def mpirun() -> str:
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.exists() else "mpirun"


def steps_per_pass(cap: int) -> int:
    """Fine-tuning steps of one pass over digits' training images at batch 32 (34), at most
    ``cap``: the quick stage has one pass, the medium stage two."""
    import math

    from optuna_hpcnas.data import load_digits_task

    return min(cap, math.ceil(load_digits_task().sizes[0] / 32))


def write_config(
    path: Path, n_trials: int, steps: int, ask_ahead: str, starter: bool, storage: str
) -> str:
    """The bench's config, or ``hpcnas init``'s starter config (``--config starter``) with
    the study, budget and ``ask_ahead`` of this run; returns the study name. ``steps`` caps
    the fine-tuning steps of a pass (``steps_per_pass``)."""
    if starter:
        import tomli_w

        from optuna_hpcnas.cli import STARTER

        data = tomllib.loads(STARTER)
        data["study"].update(name="throughput", storage=storage, n_trials=n_trials)
        data.setdefault("distributed", {})["ask_ahead"] = ask_ahead
        path.write_text(tomli_w.dumps(data))
    else:
        per_pass = steps_per_pass(steps)
        text = CONFIG.format(
            storage=storage,
            n_trials=n_trials,
            quick=per_pass,
            medium=2 * per_pass,
            supernet_steps=steps // 2,
            ask_ahead=ask_ahead,
        )
        path.write_text(text)
    return "throughput"


def run(n: int, args: argparse.Namespace, workdir: Path) -> dict:
    storage = args.storage or f"sqlite:///{workdir / f'r{n}.db'}"
    if args.storage:  # a server: a new study per launch
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name="throughput", storage=storage)
    cfg = workdir / f"r{n}.toml"
    n_trials = n * args.trials_per_rank
    write_config(cfg, n_trials, args.steps, args.ask_ahead, args.config == "starter", storage)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [mpirun(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m"]
    cmd += ["optuna_hpcnas", "-q", "run", "--config", str(cfg), "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    study = optuna.load_study(study_name="throughput", storage=storage)
    trials = [t for t in study.get_trials() if t.state.is_finished()]
    first = min(t.datetime_start for t in trials if t.datetime_start)
    last = max(t.datetime_complete for t in trials if t.datetime_complete)
    window = (last - first).total_seconds()
    attrs = study._storage.get_study_system_attrs(study._study_id)
    ranks = json.loads(attrs["hpcnas:distributed:utilisation"])[-1]["ranks"]
    return {
        "n": n,
        "trials": len(trials),
        "window": window,
        "wall": wall,
        "ranks": sorted(ranks, key=lambda r: r["rank"]),
        "sync_bytes": attrs.get("hpcnas:distributed:sync_bytes", 0),
    }


def storage_name(url: str) -> str:
    return "SQLite" if not url else url.split(":", 1)[0].split("+", 1)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--trials-per-rank", type=int, default=6)
    parser.add_argument(
        "--steps",
        type=int,
        default=40,
        help="cap on the fine-tuning steps of a pass over the training images (34 at batch "
        "32): the quick stage has one pass, the medium stage two; population steps: half",
    )
    parser.add_argument(
        "--ask-ahead", default="auto", choices=("auto", "on", "off"), help="[distributed]"
    )
    parser.add_argument(
        "--config",
        default="bench",
        choices=("bench", "starter"),
        help="this bench's config, or the `hpcnas init` starter config (staged pruner, "
        "evolutionary sampler, 34-step quick stage)",
    )
    parser.add_argument("--storage", default="", help="a server URL (default: SQLite files)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            results.append(run(n, args, Path(tmp)))
    base = results[0]["trials"] / results[0]["window"]
    what = (
        "the `hpcnas init` starter config"
        if args.config == "starter"
        else f"{3 * steps_per_pass(args.steps)} fine-tuning steps/trial"
    )
    where = storage_name(args.storage)
    print(f"digits-small search, {os.cpu_count()} CPU cores, {what}, {where}\n")
    print(
        f"{'ranks':>5} {'trials':>6} {'search s':>8} {'trials/s':>8} {'vs 1 rank':>9} "
        f"{'job s':>6} {'compute (loop)':>14} {'compute (wall)':>14} {'sync MB':>8}"
    )
    for r in results:
        tps = r["trials"] / r["window"]
        loop_share = [x["loop_shares"]["compute"] for x in r["ranks"]]
        wall_share = [x["shares"]["compute"] for x in r["ranks"]]
        print(
            f"{r['n']:>5} {r['trials']:>6} {r['window']:8.1f} {tps:8.3f} {tps / base:8.2f}x "
            f"{r['wall']:6.1f} {min(loop_share):6.1%}-{max(loop_share):6.1%} "
            f"{min(wall_share):6.1%}-{max(wall_share):6.1%} {r['sync_bytes'] / 1e6:8.2f}"
        )
    cats = ["compute", "setup", "storage", "sampler", "communication", "idle", "drain", "other"]
    for title, key in (("search loop", "loop_shares"), ("whole process", "shares")):
        print(f"\nper rank, share of the {title} (as `hpcnas status` and the run's log print it):")
        print(f"{'ranks':>5} {'rank':>4} {'seconds':>7} " + " ".join(f"{c[:7]:>7}" for c in cats))
        for r in results:
            for x in r["ranks"]:
                seconds = x["loop_seconds"] if key == "loop_shares" else x["wall_seconds"]
                shares = " ".join(f"{x[key].get(c, 0.0):7.1%}" for c in cats)
                print(f"{r['n']:>5} {x['rank']:>4} {seconds:7.1f} {shares}")
    print("\nstorage thread of each leader, busy seconds (they overlap the rank's compute):")
    for r in results:
        for x in r["ranks"]:
            busy = "  ".join(f"{k} {v:.2f}" for k, v in x.get("storage_thread", {}).items())
            print(f"{r['n']:>5} {x['rank']:>4} {busy}")
    print(
        "\nsearch loop = from the rank's first ask to its last trial (after imports, model, "
        "study set-up and warm-up; before the drain: the last writes and waiting for the other "
        "ranks' last trials); whole process = from start to exit."
    )


if __name__ == "__main__":
    main()
