"""The OptunaHub packages in ``integrations/optunahub/package`` (the registry's layout): the
files and README front-matter the registry checks, loading with ``optunahub.load_local_module``,
their examples, and their own tests (Optuna's sampler contract suites) run as the registry's
contributors run them, from the registry root."""

from __future__ import annotations

from pathlib import Path
import re
import runpy
import subprocess
import sys

import optuna
import optunahub
import pytest
import yaml

from optuna_hpcnas import samplers

REGISTRY = Path(__file__).resolve().parents[2] / "integrations" / "optunahub"
PACKAGES = {"hpcnas_evolutionary": "EvolutionarySampler", "hpcnas_qubo": "QUBOSampler"}
FIELDS = ("author", "title", "description", "tags", "optuna_versions", "license")


def _front_matter(path: Path) -> dict[str, object]:
    match = re.match(r"---\n(.*?)\n---\n", path.read_text(), re.DOTALL)
    assert match, f"{path} has no front-matter"
    return yaml.safe_load(match.group(1))


@pytest.mark.parametrize("name", PACKAGES)
def test_layout_and_front_matter(name: str) -> None:
    root = REGISTRY / "package" / "samplers" / name
    for file in ("__init__.py", "sampler.py", "README.md", "LICENSE", "example.py"):
        assert (root / file).is_file(), f"{name}/{file} is missing"
    assert list((root / "tests").glob("test_*.py"))
    assert (root / "requirements.txt").read_text().split() == ["optuna-hpcnas"]
    assert (root / "LICENSE").read_text().startswith("MIT License")
    meta = _front_matter(root / "README.md")
    for field in FIELDS:  # the registry's header_confirm.py: present and not empty
        assert meta.get(field) not in (None, ""), f"{name}: `{field}` is missing or empty"
    tags = meta["tags"]
    assert isinstance(tags, list) and {"sampler", "nas"} <= set(tags)
    assert meta["license"] == "MIT License"
    versions = meta["optuna_versions"]
    assert isinstance(versions, list) and versions
    # Confirmed versions are releases the library supports (pyproject: optuna>=5,<6).
    assert all(re.fullmatch(r"5\.\d+\.\d+", str(v)) for v in versions), versions
    # The registry strips HTML from READMEs: markdown only.
    assert not re.search(r"<[a-zA-Z/][^>]*>", (root / "README.md").read_text())


@pytest.mark.parametrize("name", PACKAGES)
def test_load_local_module_gives_the_library_sampler(name: str) -> None:
    module = optunahub.load_local_module(
        package=f"samplers/{name}", registry_root=str(REGISTRY / "package")
    )
    cls = PACKAGES[name]
    assert module.__all__ == [cls]
    assert getattr(module, cls) is getattr(samplers, cls)


@pytest.mark.parametrize("name", PACKAGES)
def test_example_runs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = REGISTRY / "package" / "samplers" / name / "example.py"
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()


def test_package_tests_pass_from_the_registry_root() -> None:
    tests = [f"package/samplers/{name}/tests" for name in PACKAGES]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=REGISTRY,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) > 100, proc.stdout[-500:]  # the suites did run
