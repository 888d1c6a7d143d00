"""Shared by the example scripts: command-line flags and the end-of-run summary.

Each example is one file to copy; this helper only keeps their argument parsing alike.
"""

from __future__ import annotations

import argparse
import os

import optuna


def parse_args(description: str, *, trials: int, steps: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--trials", type=int, default=trials, help="number of trials")
    parser.add_argument(
        "--steps", type=int, default=steps, help="optimisation steps of each trial's training"
    )
    parser.add_argument(
        "--storage",
        default=os.environ.get("OPTUNA_STORAGE", "sqlite:///examples.db"),
        help="Optuna storage URL (default: $OPTUNA_STORAGE, else sqlite:///examples.db)",
    )
    parser.add_argument("--study-name", default=None, help="study name")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def print_next_steps(study: optuna.Study, storage: str) -> None:
    print(f"\nstudy {study.study_name!r}: {len(study.trials)} trials in {storage}")
    print(f"  hpcnas best --storage {storage} --study-name {study.study_name}")
    print(f"  hpcnas dashboard --storage {storage}")
