"""One-shot search speed per storage: how many trials a second ``hpcnas run`` completes when a
candidate is scored by inherited weights alone, and how much of a trial is the storage.

Each backend gets a fresh storage (``optuna_hpcnas.testing.storages.provision_backend``) and
the same search: the ``digits-elastic`` space, one process, a 2-epoch sandwich warm-up, then
``--trials`` trials in one-shot mode (no finalists), the evolutionary sampler. From the study:
trials per second from the end of the warm-up to the end of the run (the last batch written),
the median evaluation (the core's scoring, recorded by the run) and the rest of a trial's wall
time (asks, tells, the sampler); on the Redis journal also the commands the server processed
over the whole run (its ``total_commands_processed``) per trial, which the load of the machine
does not move. Each backend runs with every ``--batches`` size of
``[distributed] one_shot_batch``; the peer in the same run is the same backend with 1 (each
candidate asked and told on the study, as the Python API does).

    python bench/one_shot_storage.py [--trials 300] [--backends sqlite postgresql journal-redis]
        [--batches 1 64] [--out bench/data/one_shot_storage.json]
        (backends also: journal-file, mysql)
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stored import store_result


def measure(kind: str, trials: int, workdir: str, batch: int = 1) -> dict[str, Any]:
    import optuna

    from optuna_hpcnas import _keys
    from optuna_hpcnas.config import config_from_dict
    from optuna_hpcnas.run import run_search
    from optuna_hpcnas.storages import open_storage
    from optuna_hpcnas.testing.storages import provision_backend

    with provision_backend(kind, workdir) as url:
        config = config_from_dict(
            {
                "study": {"name": "one-shot", "storage": url, "n_trials": trials},
                "space": {"preset": "digits-elastic"},
                "data": {"name": "digits"},
                "sampler": {"name": "evolutionary", "seed": 0},
                "pruner": {"name": "none"},
                "training": {
                    "epochs": 2,
                    "paths_per_batch": 3,
                    "sandwich": True,
                    "batch_size": 32,
                    "threads": 1,
                },
                "objective": {
                    "mode": "one-shot",
                    "finalists": 0,
                    "optimizer": "adam",
                    "latency_repeats": 1,
                },
                "distributed": {"processes": 1, "one_shot_batch": batch},
            }  # fmt: skip
        )
        commands_before = _redis_commands(url)
        warmed_up = _WarmUpEnd()
        logger = logging.getLogger("optuna_hpcnas.run._search")
        level = logger.level
        logger.addHandler(warmed_up)
        logger.setLevel(logging.INFO)
        try:
            run_search(config)
            end = time.time()
        finally:
            logger.removeHandler(warmed_up)
            logger.setLevel(level)
        commands = _redis_commands(url)
        study = optuna.load_study(study_name="one-shot", storage=open_storage(url))
        done = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    if commands is not None and commands_before is not None:
        commands -= commands_before + 1  # the second INFO itself
    assert warmed_up.at is not None, "the run logged no warm-up"
    seconds = end - warmed_up.at
    evaluation = [
        float(t.system_attrs[_keys.DISTRIBUTED_EVALUATION_SECONDS])
        for t in done
        if _keys.DISTRIBUTED_EVALUATION_SECONDS in t.system_attrs
    ]
    per_trial = seconds / len(done)
    median_eval = statistics.median(evaluation) if evaluation else float("nan")
    return {
        "backend": kind,
        "batch": batch,
        "trials": len(done),
        "seconds": seconds,
        "trials_per_s": len(done) / seconds,
        "trial_ms": 1000 * per_trial,
        "evaluation_ms": 1000 * median_eval,
        "storage_share": max(0.0, 1 - median_eval / per_trial),
        "redis_commands_per_trial": None if commands is None else commands / len(done),
    }


def _redis_commands(url: str) -> int | None:
    """The commands a Redis server has processed so far (``INFO stats``); ``None`` for the
    other backends. Counts every client of the server: run nothing else against it."""
    if not url.startswith("redis://"):
        return None
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


class _WarmUpEnd(logging.Handler):
    """When the run logged the end of its supernet warm-up: the search starts there."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Supernet warm-up"):
            self.at = record.created


def table(rows: list[dict[str, Any]], trials: int) -> str:
    """The Markdown table: per backend and batch size, beside the same backend unbatched."""
    unbatched = {r["backend"]: r["trials_per_s"] for r in rows if r["batch"] == 1}
    lines = [
        f"One-shot mode, {trials} trials, one process (digits-elastic, inherited scoring)",
        "",
        "| backend | one_shot_batch | trials/s | x batch 1 | ms a trial | evaluation ms "
        "(median) | the rest | Redis commands a trial |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peer = unbatched.get(r["backend"])
        ratio = f"{r['trials_per_s'] / peer:.2f}" if peer else "-"
        commands = r.get("redis_commands_per_trial")
        lines.append(
            f"| {r['backend']} | {r['batch']} | {r['trials_per_s']:.1f} | {ratio} | "
            f"{r['trial_ms']:.0f} | {r['evaluation_ms']:.0f} | {r['storage_share']:.0%} | "
            f"{'-' if commands is None else f'{commands:.0f}'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql", "journal-redis"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--out", type=Path, help="also store the rows here (JSON)")
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for kind in args.backends:
            for batch in args.batches:
                rows.append(measure(kind, args.trials, workdir, batch))
                print(rows[-1], flush=True)
    print()
    print(table(rows, args.trials))
    if args.out is not None:
        store_result(args.out, {"trials": args.trials, "rows": rows})


if __name__ == "__main__":
    main()
