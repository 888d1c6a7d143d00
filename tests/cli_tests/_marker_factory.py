"""A ``[data] factory`` that leaves a mark when it runs (tests of what export imports)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.data import TaskData

MARK_ENV = "HPCNAS_TEST_FACTORY_MARK"


def digits_with_mark(seed: int, **kwargs: Any) -> TaskData:
    Path(os.environ[MARK_ENV]).write_text("ran")
    return load_digits_task(seed=seed)
