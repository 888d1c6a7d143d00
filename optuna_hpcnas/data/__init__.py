"""Classification tasks for the search: digits, a synthetic sequence task, user data sets
(``.npz`` arrays, image folders, CIFAR-10 files on disk, a factory function)."""

from __future__ import annotations

from optuna_hpcnas.data._arrays import DataError
from optuna_hpcnas.data._files import load_task
from optuna_hpcnas.data._mnist1d import load_mnist1d_task
from optuna_hpcnas.data._tasks import iterate_batches
from optuna_hpcnas.data._tasks import joined
from optuna_hpcnas.data._tasks import load_digits_task
from optuna_hpcnas.data._tasks import make_sequence_task
from optuna_hpcnas.data._tasks import stream_batches
from optuna_hpcnas.data._tasks import TaskData

__all__ = [
    "DataError",
    "TaskData",
    "iterate_batches",
    "joined",
    "load_digits_task",
    "load_mnist1d_task",
    "load_task",
    "make_sequence_task",
    "stream_batches",
]
