"""Metrics of several MPI ranks merge in one /metrics (prometheus_client multiprocess mode)."""

from __future__ import annotations

from pathlib import Path
import textwrap

import pytest

from tests.mpi_helpers import run_mpi

SCRIPT = textwrap.dedent(
    """
    import sys, urllib.request
    from mpi4py import MPI
    from optuna_hpcnas.metrics import enable_multiprocess, SearchMetrics, serve_metrics

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank == 0:
        enable_multiprocess(sys.argv[1], clean=True)
    comm.Barrier()
    if rank != 0:
        enable_multiprocess(sys.argv[1])
    metrics = SearchMetrics()
    for _ in range(rank + 1):
        metrics.trial_finished("COMPLETE", 2.0, rank=rank)
    metrics.set_compute_share(rank, 0.5 + 0.1 * rank)
    metrics.add_checkpoint_bytes(100 * (rank + 1))
    comm.Barrier()
    if rank == 0:
        with serve_metrics(port=0) as server:
            with urllib.request.urlopen(server.url, timeout=10) as response:
                sys.stdout.write(response.read().decode())
    comm.Barrier()
    """
)


@pytest.mark.mpi
def test_ranks_merge_into_one_endpoint(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    proc = run_mpi(3, [str(script), str(tmp_path / "prom")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # Counters add up over ranks: 1 + 2 + 3 trials and 100 + 200 + 300 bytes.
    assert 'hpcnas_trials_finished_total{state="COMPLETE"} 6.0' in out
    assert "hpcnas_checkpoint_bytes_total 600.0" in out
    for rank, share in ((0, 0.5), (1, 0.6), (2, 0.7)):
        assert f'hpcnas_rank_busy_seconds_total{{rank="{rank}"}} {2.0 * (rank + 1)}' in out
        assert f'hpcnas_rank_compute_share_ratio{{rank="{rank}"}} {share}' in out
