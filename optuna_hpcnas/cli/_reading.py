"""``hpcnas status`` and ``hpcnas best``: what a study holds, read from its storage."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas._cli_util import format_duration
from optuna_hpcnas._summary import best_trials
from optuna_hpcnas._summary import describe_trial
from optuna_hpcnas._summary import metric_names
from optuna_hpcnas._summary import study_status
from optuna_hpcnas.cli._common import CLIError
from optuna_hpcnas.cli._common import load_study
from optuna_hpcnas.cli._common import resolve_storage
from optuna_hpcnas.storages import mask_url

if TYPE_CHECKING:
    pass


_logger = logging.getLogger("optuna_hpcnas.cli")


# ---------------------------------------------------------------------------- status
def cmd_status(args: argparse.Namespace) -> int:
    study = load_study(args)
    info = study_status(study)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    storage, _ = resolve_storage(args)
    states = "  ".join(f"{k} {v}" for k, v in info["by_state"].items() if v)
    print(f"study        {info['study']}  ({mask_url(storage)})")
    print(
        "objectives   "
        + ", ".join(f"{d} {n}" for d, n in zip(info["directions"], info["metric_names"]))
    )
    finished = sum(info["by_state"][s] for s in ("COMPLETE", "PRUNED", "FAIL"))
    if info["progress"] is not None:
        print(f"progress     {finished}/{info['target_trials']} ({100 * info['progress']:.0f}%)")
    print(f"trials       {info['trials']}  {states}")
    waiting = info["by_state"]["WAITING"]
    if waiting:
        # parameterless placeholders of the budget (or retries), not failures
        print(
            f"queued       {waiting} WAITING trials, the budget's rest: `hpcnas resume` runs "
            "them (Optuna and the dashboard list them as WAITING)"
        )
    if "elapsed_seconds" in info:
        print(
            f"time         {info['first_start']} -> {info['last_finish'] or 'running'}  "
            f"({format_duration(info['elapsed_seconds'])})"
        )
        if info["trials_per_minute"] is not None:
            print(
                f"throughput   {info['trials_per_minute']:.2f} trials/min, mean evaluation "
                f"{info['mean_evaluation_seconds'] or 0:.2f} s"
            )
        if info["mean_concurrency"] is not None:
            print(f"utilisation  {info['mean_concurrency']:.2f} evaluations running on average")
    if "utilisation" in info:
        shares = "  ".join(f"rank {k}: {100 * v:.1f}%" for k, v in info["utilisation"].items())
        print(f"compute      {shares}  (of each rank's search loop, last run)")
    if "best" in info:
        b = info["best"]
        print(f"best         trial {b['trial']}  {b['values'][0]:.6g}  {b['architecture']}")
    if "pareto_front_trials" in info:
        print(f"pareto front {info['pareto_front_trials']} trials (see `hpcnas best`)")
    return 0


# ---------------------------------------------------------------------------- best
def cmd_best(args: argparse.Namespace) -> int:
    study = load_study(args)
    trials = best_trials(study, top=args.top)
    if not trials:
        raise CLIError(f"study {study.study_name!r} has no completed trial yet")
    names = metric_names(study)
    rows = []
    for t in trials:
        rows.append(
            {
                "trial": t.number,
                "flops": t.user_attrs.get(_keys.OBJECTIVE_FLOPS),
                "params": t.user_attrs.get(_keys.OBJECTIVE_PARAMS),
                "latency_s": t.user_attrs.get(_keys.OBJECTIVE_LATENCY),
                "stage": t.user_attrs.get(_keys.OBJECTIVE_STAGE),
                **dict(zip(names, t.values)),
                "architecture": describe_trial(study, t),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    title = "Pareto front" if len(study.directions) > 1 else f"top {len(rows)}"
    print(f"{title} of study {study.study_name!r} ({len(study.trials)} trials)")
    extra = [c for c in ("flops", "params", "latency_s", "stage") if c not in names]
    columns = ["trial", *names, *extra]
    columns = [c for c in columns if any(r[c] is not None for r in rows)]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    widths = {c: max(len(c), *(len(cell(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns) + "  architecture")
    for r in rows:
        print("  ".join(cell(r[c]).rjust(widths[c]) for c in columns) + "  " + r["architecture"])
    return 0
