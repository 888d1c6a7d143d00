"""Slurm batch scripts, the mpirun wrapper and the Kubeflow MPIJob, built as text.

The ranks always start as ``python -m mpi4py -m optuna_hpcnas ...``: with ``-m mpi4py`` an
uncaught exception on one rank aborts the whole job instead of leaving the others waiting in
a collective. The storage URL never appears on a command line (``ps`` shows those): it comes
from ``OPTUNA_STORAGE`` in the environment.
"""

from __future__ import annotations

from collections.abc import Sequence
import json
from pathlib import Path
import re
import shlex
from typing import Any

from optuna_hpcnas._validation import check_int

STORAGE_ENV = "OPTUNA_STORAGE"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_WALLTIME = re.compile(r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$")


def _positive(name: str, value: Any) -> int:
    check_int(name, value, 1)
    return int(value)


def _hpcnas_args(command: str, config: str, extra: Sequence[str]) -> list[str]:
    if command not in ("run", "resume"):
        raise ValueError(f"`command` is {command!r}, but must be 'run' or 'resume'.")
    if isinstance(extra, str):
        raise TypeError(f"`extra_args` must be a sequence of strings, but got {extra!r}.")
    return [command, "--config", config, *extra]


def build_mpirun_command(
    *,
    n_ranks: int,
    config: str = "nas.toml",
    command: str = "run",
    python: str = "python",
    mpirun: str = "mpirun",
    extra_args: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of an ``mpirun`` launch of the search; runs nothing.

    Examples:
        >>> argv, env = build_mpirun_command(n_ranks=4)
        >>> " ".join(argv)
        'mpirun -n 4 python -m mpi4py -m optuna_hpcnas run --config nas.toml'
        >>> env["OMP_NUM_THREADS"]
        '1'
    """
    _positive("n_ranks", n_ranks)
    argv = [mpirun, "-n", str(n_ranks), python, "-m", "mpi4py", "-m", "optuna_hpcnas"]
    argv += _hpcnas_args(command, config, extra_args)
    return argv, {"OMP_NUM_THREADS": "1"}


def build_srun_command(
    *,
    config: str = "nas.toml",
    command: str = "run",
    python: str = "python",
    mpi: str = "pmix",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``srun`` line of the batch script (one job step holds every rank)."""
    return [
        "srun",
        f"--mpi={mpi}",
        "--kill-on-bad-exit=1",
        python,
        "-m",
        "mpi4py",
        "-m",
        "optuna_hpcnas",
        *_hpcnas_args(command, config, extra_args),
    ]


def _check_slurm(
    nodes: int,
    ntasks_per_node: int,
    cpus_per_task: int,
    signal_seconds: int,
    gpus_per_node: int | None,
) -> None:
    for name, value in (
        ("nodes", nodes),
        ("ntasks_per_node", ntasks_per_node),
        ("cpus_per_task", cpus_per_task),
        ("signal_seconds", signal_seconds),
    ):
        _positive(name, value)
    if gpus_per_node is not None:
        _positive("gpus_per_node", gpus_per_node)


def _check_names(time_limit: str, job_name: str) -> None:
    if not _WALLTIME.match(time_limit):
        raise ValueError(
            f"`time_limit` is {time_limit!r}, but must look like 'HH:MM:SS' or 'D-HH:MM:SS'."
        )
    if not re.match(r"^[\w.-]+$", job_name):
        raise ValueError(f"`job_name` is {job_name!r}; use letters, digits, '.', '_', '-'.")


def slurm_script(
    *,
    config: str = "nas.toml",
    job_name: str = "hpcnas",
    nodes: int = 2,
    ntasks_per_node: int = 4,
    cpus_per_task: int = 8,
    gpus_per_node: int | None = 4,
    time_limit: str = "24:00:00",
    partition: str | None = None,
    account: str | None = None,
    signal_seconds: int = 120,
    python: str = "python",
    setup: Sequence[str] = (),
) -> str:
    """A Slurm batch script that runs the search in one job step and survives preemption.

    Slurm sends ``USR1`` to the batch shell ``signal_seconds`` before the time limit
    (``--signal=B:USR1@...``); the script forwards it to the ranks (which checkpoint and mark
    their trials for retry), waits for them, and requeues the job (``--requeue``). A requeued
    job (``SLURM_RESTART_COUNT > 0``) runs ``hpcnas resume``.
    """
    _check_slurm(nodes, ntasks_per_node, cpus_per_task, signal_seconds, gpus_per_node)
    _check_names(time_limit, job_name)
    sbatch = [
        f"--job-name={job_name}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={ntasks_per_node}",
        f"--cpus-per-task={cpus_per_task}",
    ]
    if gpus_per_node is not None:
        sbatch.append(f"--gpus-per-node={gpus_per_node}")
    sbatch += [f"--time={time_limit}", f"--signal=B:USR1@{signal_seconds}", "--requeue"]
    if partition:
        sbatch.append(f"--partition={partition}")
    if account:
        sbatch.append(f"--account={account}")
    sbatch += ["--open-mode=append", f"--output={job_name}-%j.out"]
    run = " ".join(shlex.quote(a) for a in build_srun_command(config=config, python=python))
    run = run.replace(" run --config ", ' "$HPCNAS_COMMAND" --config ')
    lines = ["#!/bin/bash", *(f"#SBATCH {s}" for s in sbatch), ""]
    lines += [
        "# Generated by `hpcnas template slurm`; edit the #SBATCH lines for your cluster.",
        "set -euo pipefail",
        "",
        *setup,
        "# The storage URL comes from the environment, never from the command line (ps).",
        "# Keep the password in ~/.pgpass (chmod 600) or a secret manager, not in this file.",
        f': "${{{STORAGE_ENV}:?export {STORAGE_ENV}=postgresql+psycopg://USER@HOST:5432/DB}}"',
        f"export {STORAGE_ENV}",
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
        "# Each node's ranks merge their Prometheus metrics through node-local files.",
        'export PROMETHEUS_MULTIPROC_DIR="${TMPDIR:-/tmp}/hpcnas-metrics-${SLURM_JOB_ID}"',
        "",
        "# A requeued job continues the study where it stopped.",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then HPCNAS_COMMAND=resume; '
        "else HPCNAS_COMMAND=run; fi",
        "",
        "preempt() {",
        '    echo "hpcnas: USR1 received, checkpointing and requeueing job ${SLURM_JOB_ID}"',
        "    # srun forwards USR1 to every task; the ranks checkpoint and mark trials for retry.",
        "    # USR1 may come before SRUN_PID is set (right after srun started): the job list.",
        '    pid="${SRUN_PID:-$(jobs -p)}"',
        "    kill -USR1 ${pid} 2>/dev/null || true",
        "    wait ${pid} || true",
        '    scontrol requeue "${SLURM_JOB_ID}"',
        "    exit 0",
        "}",
        "trap preempt USR1",
        "",
        f"{run} &",
        "SRUN_PID=$!",
        "# `wait` returns early when USR1 arrives; the trap then takes over.",
        'wait "${SRUN_PID}"',
        "",
    ]
    return "\n".join(lines)


def mpirun_script(*, default_ranks: int = 4, python: str = "python") -> str:
    """A wrapper that launches the search on one machine or a host list with ``mpirun``.

    Usage: ``hpcnas-mpirun.sh [-n RANKS] [hpcnas arguments...]`` (default
    ``run --config nas.toml``). ``MPIRUN`` and ``PYTHON`` override the programs; extra
    launcher flags go in ``MPIRUN_ARGS`` (e.g. ``-hosts a,b``). ``SIGINT``/``SIGTERM`` are
    passed on to the ranks so that they checkpoint before exiting.
    """
    _positive("default_ranks", default_ranks)
    argv, env = build_mpirun_command(
        n_ranks=default_ranks, python=python, mpirun="mpirun", config="nas.toml"
    )
    example = " ".join(argv)
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            "# Generated by `hpcnas template mpirun`.",
            f"# Launch: {example}",
            "# Usage: hpcnas-mpirun.sh [-n RANKS] [hpcnas arguments...]",
            "set -euo pipefail",
            "",
            f'RANKS="${{HPCNAS_RANKS:-{default_ranks}}}"',
            'if [ "${1:-}" = "-n" ]; then RANKS="$2"; shift 2; fi',
            'if [ "$#" -eq 0 ]; then set -- run --config nas.toml; fi',
            'MPIRUN="${MPIRUN:-mpirun}"',
            f'PYTHON="${{PYTHON:-{python}}}"',
            *(f'export {k}="${{{k}:-{v}}}"' for k, v in env.items()),
            "# Ranks on this machine merge their Prometheus metrics through these files.",
            'export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-'
            '$(mktemp -d "${TMPDIR:-/tmp}/hpcnas-metrics.XXXXXX")}"',
            "",
            'if [ -z "${OPTUNA_STORAGE:-}" ]; then',
            '    echo "hpcnas-mpirun: OPTUNA_STORAGE is not set; the storage comes from the'
            ' config or --storage" >&2',
            "fi",
            "",
            "# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of flags on purpose",
            '"${MPIRUN}" ${MPIRUN_ARGS:-} -n "${RANKS}" "${PYTHON}" -m mpi4py -m optuna_hpcnas'
            ' "$@" &',
            "PID=$!",
            'forward() { kill -"$1" "${PID}" 2>/dev/null || true; }',
            "trap 'forward TERM' TERM",
            "trap 'forward INT' INT",
            'status=0; wait "${PID}" || status=$?',
            "# After a forwarded signal, wait again for the ranks to finish checkpointing.",
            'if kill -0 "${PID}" 2>/dev/null; then wait "${PID}" || status=$?; fi',
            'exit "${status}"',
            "",
        ]
    )


def mpijob_manifest(
    *,
    name: str = "hpcnas",
    image: str = "ghcr.io/optuna-hpcnas/optuna-hpcnas:latest",
    workers: int = 2,
    slots_per_worker: int = 4,
    gpus_per_worker: int | None = 4,
    cpu_per_worker: int = 16,
    memory_per_worker: str = "64Gi",
    config_map: str = "hpcnas-config",
    storage_secret: str = "hpcnas-storage",
    mpi_implementation: str = "OpenMPI",
    metrics_port: int = 9464,
) -> dict[str, Any]:
    """A Kubeflow MPI Operator ``MPIJob`` (``kubeflow.org/v2beta1``) as a dict.

    The config file comes from a ConfigMap (key ``nas.toml``), the storage URL from a Secret
    (key ``url``) into ``OPTUNA_STORAGE``, which ``mpirun`` exports to every rank.
    """
    _check_mpijob(name, workers, slots_per_worker, cpu_per_worker, gpus_per_worker)
    flags = {"OpenMPI": ["-x", STORAGE_ENV], "MPICH": ["-genvlist", STORAGE_ENV]}
    if mpi_implementation not in flags:
        raise ValueError(
            f"`mpi_implementation` is {mpi_implementation!r}, but must be one of {list(flags)}."
        )
    argv, _ = build_mpirun_command(
        n_ranks=workers * slots_per_worker, config="/etc/hpcnas/nas.toml"
    )
    command = [argv[0], *flags[mpi_implementation], *argv[1:]]
    storage_env = {
        "name": STORAGE_ENV,
        "valueFrom": {"secretKeyRef": {"name": storage_secret, "key": "url"}},
    }
    limits: dict[str, Any] = {"cpu": str(cpu_per_worker), "memory": memory_per_worker}
    if gpus_per_worker is not None:
        limits["nvidia.com/gpu"] = gpus_per_worker
    config_volume = {"name": "config", "configMap": {"name": config_map}}
    config_mount = {"name": "config", "mountPath": "/etc/hpcnas", "readOnly": True}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "optuna-hpcnas"}},
        "spec": {
            "slotsPerWorker": slots_per_worker,
            "mpiImplementation": mpi_implementation,
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
            "mpiReplicaSpecs": {
                "Launcher": _replica(
                    1,
                    "launcher",
                    image,
                    command,
                    [storage_env],
                    config_mount,
                    config_volume,
                    {"cpu": "1", "memory": "2Gi"},
                    restart="OnFailure",
                ),
                "Worker": _replica(
                    workers,
                    "worker",
                    image,
                    None,
                    [
                        storage_env,
                        {"name": "OMP_NUM_THREADS", "value": "1"},
                        {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/tmp/hpcnas-metrics"},
                    ],
                    config_mount,
                    config_volume,
                    limits,
                    annotations={
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(metrics_port),
                    },
                ),
            },
        },
    }


def _check_mpijob(name: str, workers: int, slots: int, cpus: int, gpus: int | None) -> None:
    if not _NAME.match(name):
        raise ValueError(f"`name` is {name!r}, but must be a DNS label (a-z, 0-9, '-').")
    _positive("workers", workers)
    _positive("slots_per_worker", slots)
    _positive("cpu_per_worker", cpus)
    if gpus is not None:
        _positive("gpus_per_worker", gpus)


def _replica(
    replicas: int,
    name: str,
    image: str,
    command: list[str] | None,
    env: list[dict[str, Any]],
    mount: dict[str, Any],
    volume: dict[str, Any],
    limits: dict[str, Any],
    *,
    restart: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One ``mpiReplicaSpecs`` entry of an MPIJob: a single-container pod template."""
    container: dict[str, Any] = {"name": name, "image": image}
    if command is not None:
        container["command"] = command
    container.update(env=env, volumeMounts=[mount], resources={"limits": limits})
    template: dict[str, Any] = {"spec": {"containers": [container], "volumes": [volume]}}
    if annotations is not None:
        template = {"metadata": {"annotations": annotations}, **template}
    spec: dict[str, Any] = {"replicas": replicas}
    if restart is not None:
        spec["restartPolicy"] = restart
    spec["template"] = template
    return spec


def _yaml(data: dict[str, Any]) -> str:
    import yaml  # PyYAML comes with optuna

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_all(directory: str | Path) -> list[Path]:
    """Write every generated file with its defaults under ``directory``; return the paths.

    This is how ``integrations/`` in the repository is made (``hpcnas template all``).
    """
    from optuna_hpcnas.integrations._grafana import grafana_dashboard
    from optuna_hpcnas.integrations._grafana import prometheus_scrape_config

    root = Path(directory)
    files = {
        "slurm/hpcnas.sbatch": slurm_script(),
        "mpirun/hpcnas-mpirun.sh": mpirun_script(),
        "kubernetes/mpijob.yaml": "# Generated by `hpcnas template mpijob`.\n"
        + _yaml(mpijob_manifest()),
        "grafana/hpcnas-dashboard.json": json.dumps(grafana_dashboard(), indent=2) + "\n",
        "prometheus/prometheus.yml": "# Generated by `hpcnas template prometheus`.\n"
        + _yaml(prometheus_scrape_config()),
    }
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.suffix in (".sh", ".sbatch"):
            path.chmod(0o755)
        written.append(path)
    return written
