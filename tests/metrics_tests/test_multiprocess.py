"""Metrics of several processes merge in one /metrics (prometheus_client multiprocess mode)."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys
import textwrap

import pytest

from optuna_hpcnas.metrics import enable_multiprocess
from tests.mpi_helpers import run_mpi

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# One process of a job: enable the directory first, count, and (the last one) serve.
PROCESS = textwrap.dedent(
    """
    import sys, urllib.request
    from optuna_hpcnas.metrics import enable_multiprocess, SearchMetrics, serve_metrics

    directory, n_bytes, serve = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "serve"
    enable_multiprocess(directory, clean=not serve)
    metrics = SearchMetrics()
    metrics.add_checkpoint_bytes(n_bytes)
    metrics.trial_finished("COMPLETE", 1.0, rank=int(serve))
    if serve:
        with serve_metrics(port=0) as server:
            with urllib.request.urlopen(server.url, timeout=10) as response:
                sys.stdout.write(response.read().decode())
    """
)

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


def test_two_processes_add_up_in_one_endpoint(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    directory = str(tmp_path / "prom")
    env = {k: v for k, v in os.environ.items() if k.upper() != MULTIPROC_ENV}
    outputs = []
    for n_bytes, role in ((100, "count"), (200, "serve")):
        proc = subprocess.run(
            [sys.executable, "-c", PROCESS, directory, str(n_bytes), role],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    out = outputs[-1]
    assert "hpcnas_checkpoint_bytes_total 300.0" in out
    assert 'hpcnas_trials_finished_total{state="COMPLETE"} 2.0' in out
    assert 'hpcnas_rank_busy_seconds_total{rank="0"} 1.0' in out
    assert 'hpcnas_rank_busy_seconds_total{rank="1"} 1.0' in out


def test_enabling_after_the_client_is_imported_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("prometheus_client")
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.delenv(MULTIPROC_ENV.lower(), raising=False)
    # Metrics built now would stay in memory, never in the merged files.
    with pytest.raises(RuntimeError, match="before prometheus_client is imported"):
        enable_multiprocess(tmp_path)
    assert MULTIPROC_ENV not in os.environ
    # The job script exported this directory before Python started: nothing to switch.
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    assert enable_multiprocess(tmp_path) == tmp_path
    with pytest.raises(RuntimeError, match="before prometheus_client is imported"):
        enable_multiprocess(tmp_path / "other")
