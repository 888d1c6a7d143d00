"""The release as a user installs it: sdist and wheel built from the checkout, checked by
twine, the wheel installed into a fresh virtual environment outside the checkout, and
``hpcnas init`` + a 2-trial ``hpcnas run`` from there.

The fresh environment borrows this one's dependencies through a ``.pth`` line (torch and the
rest are not downloaded again) but holds its own copy of optuna-hpcnas, the wheel's: the
package data (starters, Helm templates, Grafana dashboard) must be inside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest
import tomllib

import optuna_hpcnas

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--no-isolation",
         "--outdir", str(dist), str(REPO)],
        cwd=tmp_path,
    )  # fmt: skip
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(dist.iterdir())
    version = optuna_hpcnas.__version__
    assert f"-{version}-" in wheels[0].name and sdists[0].name.endswith(f"-{version}.tar.gz")
    assert "PASSED" in _run([sys.executable, "-m", "twine", "check", *map(str, wheels)], tmp_path)
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for data in (
        "optuna_hpcnas/starters/digits-small.toml",
        "optuna_hpcnas/starters/signal-1d.toml",
        "optuna_hpcnas/deploy/chart/templates/deployment.yaml",
        "optuna_hpcnas/integrations/grafana/hpcnas-dashboard.json",
        "optuna_hpcnas/py.typed",
    ):
        assert data in names, f"{data} is not in the wheel"
    assert not any(n.startswith(("tests/", "bench/")) for n in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # nothing of the checkout on the path: only the wheel provides optuna_hpcnas
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPTUNA_STORAGE")}
    env.update(OMP_NUM_THREADS="1", PATH=f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}")
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
             tmp_path, env).strip()
    )  # fmt: skip
    # this environment's dependencies, after the fresh one's own packages on sys.path
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    _run([*pip, "--ignore-installed", str(wheels[0])], tmp_path, env)

    user = tmp_path / "user"
    user.mkdir()
    # the borrowed mpi4py looks for the mpich wheel's library under its own prefix
    libmpi = sorted(Path(sys.prefix, "lib").glob("libmpi.so*"))
    if libmpi:
        env["MPI4PY_LIBMPI"] = os.pathsep.join(map(str, libmpi))
    where = _run([str(python), "-c", "import optuna_hpcnas; print(optuna_hpcnas.__file__)"],
                 user, env)  # fmt: skip
    assert Path(where.strip()).is_relative_to(env_dir), where
    hpcnas = str(env_dir / "bin" / "hpcnas")
    assert version in _run([hpcnas, "--version"], user, env)
    _run([hpcnas, "init"], user, env)
    assert tomllib.loads((user / "nas.toml").read_text())["space"]["preset"] == "digits-small"
    _run(
        [hpcnas, "run", "--config", "nas.toml", "--n-trials", "2", "--no-progress",
         "--set", "training.epochs=1"],
        user, env,
    )  # fmt: skip
    status = json.loads(_run([hpcnas, "status", "--json"], user, env))  # ./nas.toml, no flag
    states = status["by_state"]
    assert states["COMPLETE"] >= 1 and states["COMPLETE"] + states["PRUNED"] == 2, status
