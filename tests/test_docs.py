"""The documentation: its code samples run, its ``hpcnas`` commands parse, the site builds.

Conventions for README.md and docs/*.md:

* A fenced ``python`` block is a program: it runs in a fresh interpreter, in an empty
  temporary directory, with ``OMP_NUM_THREADS=1`` and a timeout.
* ``<!-- docs-test: skip REASON -->`` as the last non-blank line before the fence keeps a
  block from running when it needs what a test cannot give (a database server, a trained
  model, minutes of training); the reason is required. The block must still parse and its
  imports still run, so a renamed public name fails here too.
* ``train_and_score``, ``train_and_validate`` and ``evaluate`` in a block stand for the
  reader's own evaluation: the blocks run with them defined as a fixed score of the
  architecture.
* Every ``hpcnas`` command of a ``bash`` block and every inline ``hpcnas ...`` code span names
  a real sub-command and real options (synopses with ``[...]`` and ``a|b`` included); the
  concrete commands of ``bash`` blocks parse with the command's own parser.
* Docstring examples (the API reference shows them) run as doctests; their section is spelt
  ``Examples:``, which the API reference renders as code (``Example:`` becomes prose).

The site is built as ``make docs`` builds it (``mkdocs build --strict``), and once more with a
broken link, anchor and API reference put in, which must fail.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
import json
import os
from pathlib import Path
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from optuna_hpcnas.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PACKAGES = (ROOT / "optuna_hpcnas", ROOT / "qubo")
FENCE = re.compile(r"^(?P<ticks>`{3,})(?P<info>\S*)")
MARKER = "<!-- docs-test:"
SKIP = re.compile(r"^<!-- docs-test: skip (?P<reason>\S.*?) -->$")
BLOCK_TIMEOUT_S = 60
# The reader's own evaluation, as the samples name it: a fixed score per architecture.
PLACEHOLDERS = """
import zlib


def _score(arch):
    return zlib.crc32(repr(arch).encode()) / 2**32


PLACEHOLDERS = {"train_and_score": _score, "train_and_validate": _score, "evaluate": _score}
"""
# Runs one sample (a file named after its page and line) as __main__, placeholders defined.
RUNNER = PLACEHOLDERS + "import runpy, sys\nrunpy.run_path(sys.argv[1], PLACEHOLDERS, '__main__')"
# The docstring examples of the modules named in argv, in one interpreter of their own (they
# set torch's threads, as the library does): {module: [failed, attempted, report]}.
DOCTESTS = """
import contextlib, doctest, importlib, io, json, sys
results = {}
for name in sys.argv[1:]:
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        module = importlib.import_module(name)
        failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    results[name] = [failed, attempted, report.getvalue()]
print(json.dumps(results))
"""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    info: str
    code: str
    skip: str | None  # the reason, for a block that does not run

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != match["ticks"]:
            end += 1
        assert end < len(lines), f"{page.name}:{i + 1}: the fence is never closed"
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        skip = SKIP.match(before)
        blocks.append(
            Block(
                page,
                i + 1,
                match["info"],
                "\n".join(lines[i + 1 : end]) + "\n",
                skip["reason"] if skip else None,
            )
        )
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in _blocks(page)]
PYTHON = [block for block in BLOCKS if block.info == "python"]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


# ---------------------------------------------------------------------------- code blocks
def test_every_marker_skips_a_python_block_and_some_blocks_run() -> None:
    markers = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().startswith(MARKER):
                assert SKIP.match(line.strip()), f"{page.name}:{number}: malformed {line!r}"
                markers.append(f"{page.name}:{number}")
    skipped = [block for block in BLOCKS if block.skip is not None]
    assert all(block.info == "python" for block in skipped), [b.where for b in skipped]
    assert len(skipped) == len(markers), "a marker is not right before a ```python fence"
    runnable = [block for block in PYTHON if block.skip is None]
    assert len(runnable) >= 5, [block.where for block in runnable]


@pytest.mark.parametrize(
    "block",
    [block for block in PYTHON if block.skip is None],
    ids=lambda block: block.where,
)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    sample = tmp_path / f"{block.page.stem}_{block.line}.py"
    sample.write_text(block.code, encoding="utf-8")
    done = _run([sys.executable, "-c", RUNNER, str(sample)], cwd=tmp_path, timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr[-4000:]}"


def test_skipped_blocks_parse_and_their_imports_run(tmp_path: Path) -> None:
    skipped = [block for block in PYTHON if block.skip is not None]
    checks = {}
    for block in skipped:
        tree = ast.parse(block.code, filename=block.where)  # a SyntaxError names the block
        imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        checks[block.where] = ast.unparse(ast.Module(body=imports, type_ignores=[]))
    assert sum(bool(source) for source in checks.values()) >= 5
    script = (
        "import json, sys, traceback\n"
        "failed = {}\n"
        "for where, source in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        exec(compile(source, where, 'exec'), {})\n"
        "    except Exception:\n"
        "        failed[where] = traceback.format_exc(limit=2)\n"
        "print(json.dumps(failed))\n"
    )
    done = _run(
        [sys.executable, "-c", script, json.dumps(checks)], cwd=tmp_path, timeout=BLOCK_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {}


# ---------------------------------------------------------------------------- docstrings
def _modules_with_examples() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_docstring_examples_run(tmp_path: Path) -> None:
    modules = _modules_with_examples()
    assert len(modules) >= 20, modules
    done = _run([sys.executable, "-c", DOCTESTS, *modules], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert sorted(results) == sorted(modules)
    assert {name: report for name, (failed, _, report) in results.items() if failed} == {}
    assert sum(attempted for _, attempted, _ in results.values()) >= 100


def test_docstrings_spell_the_examples_section_as_the_api_reference_reads_it() -> None:
    singular = re.compile(r"^\s+Example:\s*$")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if singular.match(line)
    ]
    assert found == [], "write `Examples:` (griffe renders `Example:` as prose)"


# ---------------------------------------------------------------------------- hpcnas commands
def _fenced_commands() -> list[tuple[str, list[str]]]:
    """``(where, args after hpcnas)`` for each command line of the ``bash`` blocks."""
    commands = []
    for block in BLOCKS:
        if block.info != "bash":
            continue
        logical = block.code.replace("\\\n", " ").splitlines()
        for offset, line in enumerate(logical, 1):
            if "hpcnas" not in line:
                continue
            tokens = [token for token in shlex.split(line, comments=True) if token != "&"]
            if tokens[:1] == ["hpcnas"]:
                commands.append((f"{block.where}+{offset}", tokens[1:]))
            for i in range(len(tokens) - 1):
                if tokens[i : i + 2] == ["-m", "optuna_hpcnas"]:  # python -m optuna_hpcnas
                    commands.append((f"{block.where}+{offset}", tokens[i + 2 :]))
    return commands


def _inline_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"`(hpcnas [^`]+)`", text):
            span = " ".join(match[1].replace("\\|", "|").split())
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            commands.append((where, span.split()[1:]))
    return commands


def _sub_commands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the hpcnas parser has no sub-commands")


def _problems(args: list[str], subs: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What a command names that the parser does not have: sub-commands, options, choices."""
    problems = []
    for name in args[0].split("/"):  # `hpcnas best/status/export`
        sub = subs.get(name)
        if sub is None:
            problems.append(f"no sub-command {name!r}")
            continue
        positional = next((a for a in sub._actions if not a.option_strings and a.choices), None)
        previous: argparse.Action | None = positional
        for token in (token.strip("[]") for token in args[1:]):
            if token.startswith("--"):
                previous = sub._option_string_actions.get(token.split("=")[0])
                if previous is None:
                    problems.append(f"{name}: no option {token.split('=')[0]}")
            elif "|" in token.strip("|") and previous is not None and previous.choices:
                for choice in token.split("|"):
                    if choice not in previous.choices:
                        problems.append(f"{name}: {choice!r} is not a choice of {previous.dest}")
    return problems


def test_hpcnas_commands_name_real_sub_commands_and_options() -> None:
    subs = _sub_commands()
    commands = _fenced_commands() + _inline_commands()
    assert len(commands) >= 100, len(commands)
    problems = [
        f"{where}: hpcnas {' '.join(args)}: {problem}"
        for where, args in commands
        for problem in _problems(args, subs)
    ]
    assert problems == []


def test_the_checker_catches_a_wrong_sub_command_option_or_choice() -> None:
    subs = _sub_commands()
    assert _problems(["serve", "deploy/", "[--model", "int8|fp16]"], subs) == [
        "serve: 'fp16' is not a choice of model"
    ]
    assert _problems(["run", "--configs", "nas.toml"], subs) == ["run: no option --configs"]
    assert _problems(["best/stats"], subs) == ["no sub-command 'stats'"]
    assert _problems(["template", "slurm|mpirun|all", "--out", "integrations"], subs) == []


def test_concrete_commands_parse(capsys: pytest.CaptureFixture) -> None:
    concrete = [
        (where, args)
        for where, args in _fenced_commands()
        if not any(char in " ".join(args) for char in "[]|<>")
    ]
    assert len(concrete) >= 15, concrete
    for where, args in concrete:
        try:
            build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{where}: hpcnas {' '.join(args)}: {capsys.readouterr().err}")


# ---------------------------------------------------------------------------- the site
def _mkdocs(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') is missing")
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config)]
    return _run([*argv, "--site-dir", str(site)], cwd=cwd, timeout=300)


def test_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = _mkdocs(ROOT / "mkdocs.yml", site, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-6000:]
    assert "WARNING" not in done.stderr
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'id="quick-start"' in home  # the README's own quick start
    assert 'href="gpu/"' in home  # README's docs/gpu.md, as a page of the site
    for page in PAGES[1:]:
        if page.name == "index.md":
            continue
        assert (site / page.stem / "index.html").is_file(), page.name
    for image in (ROOT / "docs" / "images").glob("*.png"):
        assert (site / "images" / image.name).is_file(), image.name
    samplers = (site / "api" / "samplers" / "index.html").read_text(encoding="utf-8")
    assert 'id="optuna_hpcnas.samplers.EvolutionarySampler"' in samplers


def test_site_build_fails_on_a_broken_link_anchor_or_reference(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("api"))
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config["nav"] = [entry for entry in config["nav"] if "API reference" not in entry]
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    broken = ("no-such-page.md", "samplers.md#no-such-heading", "optuna_hpcnas.NoSuchName")
    with open(tmp_path / "docs" / "gpu.md", "a", encoding="utf-8") as page:
        page.write(f"\n[a page]({broken[0]}), [an anchor]({broken[1]}), [a name][{broken[2]}]\n")
    done = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site", cwd=tmp_path)
    assert done.returncode != 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    for target in broken:
        assert any(target in line for line in warnings), (target, warnings)
    assert len(warnings) == len(broken), warnings  # the rest of the site builds cleanly
