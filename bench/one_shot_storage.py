"""One-shot search speed per storage: how many trials a second ``hpcnas run`` completes when a
candidate is scored by inherited weights alone, and how much of a trial is the storage.

Each backend gets a fresh storage (``optuna_hpcnas.testing.storages.provision_backend``) and
the same search: the ``digits-elastic`` space, one process, a 2-epoch sandwich warm-up, then
``--trials`` trials in one-shot mode (no finalists), the evolutionary sampler. From the study:
trials per second between the first trial's start and the last one's end, the median
evaluation (the core's scoring, recorded by the run) and the rest of a trial's wall time
(asks, tells, heartbeats, the sampler). The peer in the same run is the fastest backend.

    python bench/one_shot_storage.py [--trials 300] [--backends sqlite postgresql journal-redis]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def measure(kind: str, trials: int, workdir: str) -> dict[str, Any]:
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
                "distributed": {"processes": 1},
            }  # fmt: skip
        )
        run_search(config)
        study = optuna.load_study(study_name="one-shot", storage=open_storage(url))
        done = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    start = min(t.datetime_start for t in done if t.datetime_start is not None)
    end = max(t.datetime_complete for t in done if t.datetime_complete is not None)
    seconds = (end - start).total_seconds()
    evaluation = [
        float(t.system_attrs[_keys.DISTRIBUTED_EVALUATION_SECONDS])
        for t in done
        if _keys.DISTRIBUTED_EVALUATION_SECONDS in t.system_attrs
    ]
    per_trial = seconds / len(done)
    median_eval = statistics.median(evaluation) if evaluation else float("nan")
    return {
        "backend": kind,
        "trials": len(done),
        "seconds": seconds,
        "trials_per_s": len(done) / seconds,
        "trial_ms": 1000 * per_trial,
        "evaluation_ms": 1000 * median_eval,
        "storage_share": max(0.0, 1 - median_eval / per_trial),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql", "journal-redis"])
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for kind in args.backends:
            rows.append(measure(kind, args.trials, workdir))
    best = max(r["trials_per_s"] for r in rows)
    print(
        f"\nOne-shot mode, {args.trials} trials, one process (digits-elastic, inherited scoring)"
    )
    print("| backend | trials/s | x fastest | ms a trial | evaluation ms (median) | the rest |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['backend']} | {r['trials_per_s']:.1f} | {r['trials_per_s'] / best:.2f} | "
            f"{r['trial_ms']:.0f} | {r['evaluation_ms']:.0f} | {r['storage_share']:.0%} |"
        )


if __name__ == "__main__":
    main()
