"""Run under mpirun -n 2: rank 1 fails inside a data-parallel training step of a search."""

from __future__ import annotations

import sys

from mpi4py import MPI

from optuna_hpcnas.config import load_config
from optuna_hpcnas.distributed import run_search
from optuna_hpcnas.distributed._evaluator import default_evaluator


def failing_factory(config, space, device):
    evaluator = default_evaluator(config, space, device)
    original = evaluator.train_batches

    def train_batches(**kwargs):
        if MPI.COMM_WORLD.Get_rank() == 1:
            raise RuntimeError("injected failure on rank 1")
        return original(**kwargs)

    evaluator.train_batches = train_batches
    return evaluator


run_search(load_config(sys.argv[1]), evaluator_factory=failing_factory)
print("NOT REACHED", flush=True)
