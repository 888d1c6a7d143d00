"""Where a process sits in the job, read before MPI is imported."""

from __future__ import annotations

import pytest

from optuna_hpcnas.distributed import launched_rank_and_size


def test_rank_from_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(
        "sys.modules", {k: v for k, v in __import__("sys").modules.items() if k != "mpi4py.MPI"}
    )
    assert launched_rank_and_size() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "8")
    assert launched_rank_and_size() == (3, 8)
