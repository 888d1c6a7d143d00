"""Run under mpirun -n 2: rank 1 fails inside a data-parallel training step of a search."""

from __future__ import annotations

import sys
from typing import Any

from mpi4py import MPI

from optuna_hpcnas.config import load_config
from optuna_hpcnas.distributed import _group_engine
from optuna_hpcnas.run import run_search

if MPI.COMM_WORLD.Get_rank() == 1:

    def step(self: Any, x: Any, y: Any) -> Any:
        raise RuntimeError("injected failure on rank 1")

    _group_engine._DeepSpeedSession.step = step  # type: ignore[method-assign]

run_search(load_config(sys.argv[1]))
print("NOT REACHED", flush=True)
