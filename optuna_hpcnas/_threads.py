"""Each process's share of the CPUs it may really use, for torch's intra-op threads.

Torch starts as many threads as the machine has cores in every process; with several ranks
on a node, or another job on the same cores, they fight over them (many times slower). The
CPUs a process may use are its affinity (``taskset``, Slurm's binding) capped by the CPU quota
of its cgroup (a container's ``--cpus``, Kubernetes' CPU limit), not the machine's count.
OpenMP threads that wait spin by default and take the cores from whatever else runs there;
``passive_openmp`` (``optuna_hpcnas._openmp``, which imports nothing, so the entry points call
it before torch loads) makes them sleep instead, so oversubscription degrades gracefully. The
command line, every rank of a run and ``SupernetObjective`` set their share here.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from optuna_hpcnas._openmp import passive_openmp

_logger = logging.getLogger(__name__)

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(mount: Path, relative: str) -> list[Path]:
    """``mount/relative`` and its parents up to ``mount`` (a quota anywhere above binds)."""
    parts = [p for p in relative.strip("/").split("/") if p and p != ".."]
    return [mount.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")  # "max 100000" or "<quota> <period>"
    if text is None:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota_text = _read(directory / "cpu.cfs_quota_us")  # -1: no quota
    period_text = _read(directory / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = float(quota_text), float(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_limit(root: Path = _CGROUP_ROOT, proc_cgroup: Path = _PROC_CGROUP) -> float | None:
    """CPUs the process's cgroup quota allows (``1.5`` for ``--cpus=1.5``), or ``None``.

    cgroup v2: ``cpu.max`` of the process's cgroup and every cgroup above it; v1: the
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` of the ``cpu`` controller's hierarchy. The
    smallest quota found wins. Inside a container the process's path is often not mounted;
    the mount's own root (the container's cgroup) is read then.
    """
    membership = _read(proc_cgroup) or ""
    limits: list[float] = []
    for line in membership.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, relative = fields
        if controllers == "":  # cgroup v2's unified hierarchy
            directories, quota = _ancestors(root, relative), _v2_quota
        elif "cpu" in controllers.split(","):
            mount = next(
                (
                    root / name
                    for name in (controllers, "cpu,cpuacct", "cpu")
                    if (root / name).is_dir()
                ),
                None,
            )
            if mount is None:
                continue
            directories, quota = _ancestors(mount, relative), _v1_quota
        else:
            continue
        limits += [q for q in map(quota, directories) if q is not None]
    if not membership:  # no /proc (not Linux): a v2 mount may still say something
        found = _v2_quota(root)
        if found is not None:
            limits.append(found)
    return min(limits) if limits else None


def available_cores() -> int:
    """CPUs this process may really use: its affinity, capped by its cgroup CPU quota
    (rounded down, at least 1), else the machine's count."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def thread_share(
    *, requested: int | None, ranks_on_node: int, environ: dict[str, str] | None = None
) -> tuple[int, str]:
    """``(threads, where the figure comes from)``: ``[training] threads``, else
    ``OMP_NUM_THREADS``, else the usable CPUs divided by the ranks on the node (at least 1)."""
    env = os.environ if environ is None else environ
    if requested is not None:
        return requested, "[training] threads"
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return int(omp), "OMP_NUM_THREADS"
    cores = available_cores()
    share = max(1, cores // max(1, ranks_on_node))
    return share, f"{cores} usable CPU(s) / {ranks_on_node} rank(s) on this node"


def configure_threads(*, requested: int | None, ranks_on_node: int, rank: int = 0) -> int:
    """Set torch's intra-op threads to this process's share and log the figure (OpenMP waits
    passively when torch is not loaded yet)."""
    in_time = passive_openmp()
    import torch

    threads, source = thread_share(requested=requested, ranks_on_node=ranks_on_node)
    torch.set_num_threads(threads)
    if rank == 0:
        _logger.info("torch uses %d intra-op thread(s) per process (%s).", threads, source)
        if not in_time:
            _logger.debug("torch was loaded before OMP_WAIT_POLICY could be set.")
    return threads
