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
    """Every module ``path`` imports, at the top or inside a function; ``from pkg import x``
    counts as ``pkg`` and ``pkg.x`` (``x`` may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _room(module: str) -> str | None:
    """The room of a module of ours: a subpackage of ``optuna_hpcnas`` (a directory), a
    top-level module of it, or ``qubo``; ``None`` for other packages and for the package's
    own face (``optuna_hpcnas/__init__.py`` only hands names on)."""
    parts = module.split(".")
    if parts[0] == "qubo":
        return "qubo"
    if parts[0] != "optuna_hpcnas" or len(parts) == 1:
        return None
    package = ROOT / "optuna_hpcnas"
    if (package / parts[1]).is_dir() or (package / f"{parts[1]}.py").is_file():
        return f"optuna_hpcnas.{parts[1]}"
    return None


def _room_graph() -> dict[str, dict[str, list[str]]]:
    """Room -> room it imports -> the files that do, for every room the directories hold."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in LIBRARY:
        rel = path.relative_to(ROOT).with_suffix("")
        source = _room(".".join(rel.parts))
        if source is None:
            continue
        edges = graph.setdefault(source, {})
        for module in _imports(path):
            target = _room(module)
            if target is not None and target != source:
                edges.setdefault(target, []).append(str(path.relative_to(ROOT)))
    return graph


def test_every_room_is_read_from_the_directories() -> None:
    rooms = set(_room_graph())
    package = ROOT / "optuna_hpcnas"
    expected = {
        f"optuna_hpcnas.{d.name}" for d in package.iterdir() if (d / "__init__.py").exists()
    }
    assert expected <= rooms and {"optuna_hpcnas.run", "optuna_hpcnas.storages", "qubo"} <= rooms


def test_imports_run_one_way_between_every_room() -> None:
    """No room reaches back to a room that imports it (directly or through others)."""
    graph = _room_graph()

    def reaches(start: str, goal: str) -> list[str] | None:
        seen, todo = {start}, [[start]]
        while todo:
            path = todo.pop()
            for nxt in graph.get(path[-1], {}):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append([*path, nxt])
        return None

    circles = []
    for room, edges in graph.items():
        for target, files in edges.items():
            back = reaches(target, room)
            if back is not None:
                circles.append(f"{room} -> {' -> '.join(back)} (first arrow from {files[0]})")
    assert not circles, circles
    for path in (ROOT / "qubo").rglob("*.py"):
        assert not any(m.split(".")[0] in ("optuna", "torch", "optuna_hpcnas")
                       for m in _imports(path)), path  # fmt: skip


def test_the_storages_stand_below_the_samplers_and_the_ranks() -> None:
    """The storage layer opens, leases and recovers; the harnesses that drive samplers and
    ranks against it live in ``optuna_hpcnas.testing``, and nothing else imports those."""
    graph = _room_graph()
    storages = graph.get("optuna_hpcnas.storages", {})
    assert not {"optuna_hpcnas.samplers", "optuna_hpcnas.distributed"} & set(storages), storages
    users = [room for room, edges in graph.items() if "optuna_hpcnas.testing" in edges]
    assert users == [], users


def test_the_group_loop_keeps_the_loop_and_the_messages() -> None:
    """``GroupLoop`` <= 150 lines and <= 10 attributes: the leader's storage calls belong to
    its ``LeaderQueue``."""
    tree = ast.parse((ROOT / "optuna_hpcnas" / "run" / "_loop.py").read_text())
    (loop,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GroupLoop"]
    assert (loop.end_lineno or 0) - loop.lineno + 1 <= 150
    attributes = {
        t.attr
        for n in ast.walk(loop)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    assert len(attributes) <= 10, sorted(attributes)


def test_optunas_private_calls_live_in_the_records_module() -> None:
    private = re.compile(r"\._pop_waiting_trial_id|\._thread_local|optuna\.storages\._heartbeat")
    for path in LIBRARY:
        if path.name == "_records.py":
            continue
        assert not private.search(path.read_text()), path
