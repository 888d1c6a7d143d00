"""The structure the design notes ask for, held by tests: short functions, imports that run
one way, Optuna's private API called from one module."""

from __future__ import annotations

import ast
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "optuna_hpcnas").rglob("*.py")) + sorted((ROOT / "qubo").rglob("*.py"))


def test_no_library_function_is_over_80_lines() -> None:
    long = []
    for path in LIBRARY:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, long


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_imports_run_one_way() -> None:
    package = ROOT / "optuna_hpcnas"
    above = ("optuna_hpcnas.config", "optuna_hpcnas.run", "optuna_hpcnas.cli")
    for path in (package / "distributed").rglob("*.py"):
        assert not any(m.startswith(above) for m in _imports(path)), path
    for path in (ROOT / "qubo").rglob("*.py"):
        assert not any(m.split(".")[0] in ("optuna", "torch", "optuna_hpcnas")
                       for m in _imports(path)), path  # fmt: skip
    for sub in ("evaluation", "supernet", "search_space", "samplers", "pruners", "data"):
        for path in (package / sub).rglob("*.py"):
            up = [m for m in _imports(path) if m.startswith(above)]
            assert not up, (path, up)


def test_optunas_private_calls_live_in_the_records_module() -> None:
    private = re.compile(r"\._pop_waiting_trial_id|\._thread_local|optuna\.storages\._heartbeat")
    for path in LIBRARY:
        if path.name == "_records.py":
            continue
        assert not private.search(path.read_text()), path
