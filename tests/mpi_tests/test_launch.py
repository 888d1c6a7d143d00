from __future__ import annotations

from pathlib import Path
import re

import pytest

from tests.mpi_helpers import run_mpi

pytestmark = pytest.mark.mpi


def test_four_ranks_on_two_cores(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "total = comm.allreduce(comm.Get_rank())\n"
        "print(f'rank {comm.Get_rank()}/{comm.Get_size()} sum {total}', flush=True)\n"
    )
    result = run_mpi(4, [str(script)], timeout=60)
    assert result.returncode == 0, result.stderr
    # ranks share one pipe, so lines may interleave: match the records, not the lines
    records = sorted(re.findall(r"rank \d/\d sum \d+", result.stdout))
    assert records == [f"rank {r}/4 sum 6" for r in range(4)]


def test_exception_on_one_rank_aborts_the_job(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "if comm.Get_rank() == 1:\n"
        "    raise RuntimeError('rank 1 fails')\n"
        "comm.barrier()  # the other ranks would wait forever without python -m mpi4py\n"
    )
    result = run_mpi(3, [str(script)], timeout=60)
    assert result.returncode != 0
    assert "rank 1 fails" in result.stderr
