"""The generators, tested without running Slurm or Kubernetes (the mpirun wrapper does run)."""

from __future__ import annotations

import json
from pathlib import Path
import re
import subprocess

import pytest
import yaml

from optuna_hpcnas.integrations import build_mpirun_command
from optuna_hpcnas.integrations import build_srun_command
from optuna_hpcnas.integrations import grafana_dashboard
from optuna_hpcnas.integrations import mpijob_manifest
from optuna_hpcnas.integrations import mpirun_script
from optuna_hpcnas.integrations import prometheus_scrape_config
from optuna_hpcnas.integrations import slurm_script
from optuna_hpcnas.integrations import write_all
from optuna_hpcnas.metrics import METRIC_NAMES

REPO = Path(__file__).resolve().parents[2]


def _bash_syntax_ok(text: str, tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_text(text)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_slurm_script(tmp_path: Path) -> None:
    text = slurm_script(nodes=3, ntasks_per_node=2, gpus_per_node=None, partition="gpu")
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    for flag in (
        "--nodes=3",
        "--ntasks-per-node=2",
        "--signal=B:USR1@120",
        "--requeue",
        "--partition=gpu",
    ):
        assert f"#SBATCH {flag}" in sbatch
    assert not any("gpus" in line for line in sbatch)
    assert (
        'srun --mpi=pmix --kill-on-bad-exit=1 python -m mpi4py -m optuna_hpcnas "$HPCNAS_COMMAND"'
        " --config nas.toml &" in text
    )
    # The storage URL is read from the environment and the job stops if it is missing.
    assert ': "${OPTUNA_STORAGE:?' in text
    assert "postgresql" not in text.replace("postgresql+psycopg://USER@HOST:5432/DB", "")
    # USR1 is trapped, forwarded to the step, then the job is requeued; a restart resumes.
    assert "trap preempt USR1" in text and 'scontrol requeue "${SLURM_JOB_ID}"' in text
    assert "SLURM_RESTART_COUNT" in text and "HPCNAS_COMMAND=resume" in text
    _bash_syntax_ok(text, tmp_path)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"nodes": 0}, ValueError, "nodes"),
        ({"nodes": 1.5}, TypeError, "nodes"),
        ({"time_limit": "forever"}, ValueError, "time_limit"),
        ({"job_name": "a b"}, ValueError, "job_name"),
    ],
)
def test_slurm_script_validates(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        slurm_script(**kwargs)


def test_launch_commands_are_pure() -> None:
    argv, env = build_mpirun_command(n_ranks=8, config="c.toml", command="resume")
    assert argv == [
        "mpirun", "-n", "8", "python", "-m", "mpi4py", "-m", "optuna_hpcnas",
        "resume", "--config", "c.toml",
    ]  # fmt: skip
    assert env == {"OMP_NUM_THREADS": "1"}
    assert build_srun_command()[:3] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1"]
    with pytest.raises(ValueError, match="command"):
        build_mpirun_command(n_ranks=2, command="status")
    with pytest.raises(ValueError, match="n_ranks"):
        build_mpirun_command(n_ranks=0)


def test_mpijob_manifest() -> None:
    manifest = yaml.safe_load(yaml.safe_dump(mpijob_manifest(workers=3, slots_per_worker=2)))
    assert manifest["apiVersion"] == "kubeflow.org/v2beta1" and manifest["kind"] == "MPIJob"
    spec = manifest["spec"]
    assert spec["slotsPerWorker"] == 2
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    command = " ".join(launcher["command"])
    assert command == (
        "mpirun -x OPTUNA_STORAGE -n 6 python -m mpi4py -m optuna_hpcnas run "
        "--config /etc/hpcnas/nas.toml"
    )
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    env = {e["name"]: e for e in worker["template"]["spec"]["containers"][0]["env"]}
    assert env["OPTUNA_STORAGE"]["valueFrom"]["secretKeyRef"] == {
        "name": "hpcnas-storage",
        "key": "url",
    }
    mpich = mpijob_manifest(mpi_implementation="MPICH")
    assert "-genvlist" in mpich["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
        "containers"][0]["command"]  # fmt: skip
    with pytest.raises(ValueError, match="mpi_implementation"):
        mpijob_manifest(mpi_implementation="LAM")
    with pytest.raises(ValueError, match="DNS label"):
        mpijob_manifest(name="My_Job")


def test_grafana_dashboard_covers_every_metric() -> None:
    dashboard = json.loads(json.dumps(grafana_dashboard()))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set()
    for expr in exprs:
        for name in re.findall(r"hpcnas_[a-z_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in METRIC_NAMES, f"{name} in {expr!r} is not a metric we export"
            used.add(base)
    assert used == set(METRIC_NAMES)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def test_prometheus_config() -> None:
    config = prometheus_scrape_config(targets=("node1:9464", "node2:9464"))
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == [
        "node1:9464",
        "node2:9464",
    ]
    with pytest.raises(ValueError):
        prometheus_scrape_config(targets=())


def test_committed_files_are_the_generated_ones(tmp_path: Path) -> None:
    for path in write_all(tmp_path):
        rel = path.relative_to(tmp_path)
        assert (REPO / "integrations" / rel).read_text() == path.read_text(), (
            f"integrations/{rel} is stale: run `hpcnas template all --out integrations`"
        )
    _bash_syntax_ok(mpirun_script(), tmp_path)
    assert (REPO / "integrations/mpirun/hpcnas-mpirun.sh").stat().st_mode & 0o111
