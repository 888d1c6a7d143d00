"""Classification tasks for the search: digits, a synthetic sequence task, user datasets."""

from __future__ import annotations

from optuna_hpcnas.data._tasks import iterate_batches
from optuna_hpcnas.data._tasks import load_digits_task
from optuna_hpcnas.data._tasks import make_sequence_task
from optuna_hpcnas.data._tasks import TaskData

__all__ = ["TaskData", "iterate_batches", "load_digits_task", "make_sequence_task"]
