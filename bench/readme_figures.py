"""Write the benchmark figures of README.md and docs/ from the stored bench results.

A figure is the text between ``<!-- figure: NAME -->`` and ``<!-- /figure -->`` in a
Markdown file; this script rewrites it from the result file ``FIGURES[NAME]`` reads (small
JSON files in ``bench/data/``, each written by the bench command named in the figure), so no
figure there is typed by hand. ``--check`` rewrites nothing and exits 1 naming every figure
that differs from its data (the test suite runs it).

    python bench/readme_figures.py            # rewrite the figures
    python bench/readme_figures.py --check    # exit 1 if one is stale
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
from pathlib import Path
import re
import sys

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
DOCUMENTS = ("README.md", "docs/signals.md", "docs/supernet.md")
_FIGURE = re.compile(r"(<!-- figure: ([\w.-]+) -->\n)(.*?)(<!-- /figure -->)", re.DOTALL)


def _peers_mnist1d(data: Path) -> str:
    """The peer table on MNIST-1D: ``bench/tsc_vs_textbook.py --sets mnist1d`` with every
    method (its ``--out`` stored as ``bench/data/tsc_vs_textbook_mnist1d.json``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tsc_vs_textbook import results_table

    results = json.loads((data / "tsc_vs_textbook_mnist1d.json").read_text())
    return results_table(results, "mnist1d")


FIGURES: dict[str, Callable[[Path], str]] = {"peers-mnist1d": _peers_mnist1d}


def rewritten(text: str, data: Path) -> tuple[str, list[str]]:
    """``text`` with every figure written from ``data``, and the names of those that
    changed."""
    changed: list[str] = []

    def fill(match: re.Match[str]) -> str:
        head, name, body, tail = match.groups()
        if name not in FIGURES:
            raise SystemExit(f"unknown figure {name!r} (known: {', '.join(sorted(FIGURES))})")
        fresh = FIGURES[name](data).rstrip("\n") + "\n"
        if fresh != body:
            changed.append(name)
        return head + fresh + tail

    return _FIGURE.sub(fill, text), changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a figure is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to write in")
    parser.add_argument("--data", type=Path, default=DATA, help="the stored results")
    args = parser.parse_args()
    stale: list[str] = []
    for name in DOCUMENTS:
        path = args.root / name
        if not path.is_file():
            continue
        text = path.read_text()
        fresh, changed = rewritten(text, args.data)
        stale += [f"{name}: {figure}" for figure in changed]
        if changed and not args.check:
            path.write_text(fresh)
    if args.check and stale:
        raise SystemExit("stale figures (run python bench/readme_figures.py): " + "; ".join(stale))
    if args.check:
        print("figures up to date")
    else:
        print("figures rewritten: " + ("; ".join(stale) if stale else "none changed"))


if __name__ == "__main__":
    main()
