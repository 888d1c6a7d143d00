"""Render the README's benchmark figures (PNG) from the stored digits-small results.

Reads ``bench/data/evolution_vs_peers/*.json`` (written by ``bench/evolution_vs_peers.py``)
and reruns nothing:

    python bench/plots.py                  # -> docs/images/regret_digits.png, ask_time.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator
from matplotlib.ticker import FuncFormatter
from matplotlib.ticker import NullLocator
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from evolution_vs_peers import ask_groups
from evolution_vs_peers import CHECKPOINTS
from evolution_vs_peers import load_stored
from evolution_vs_peers import picks_by_cell
from evolution_vs_peers import SAMPLERS
from nas_table import mean_ci

DATA = Path(__file__).parent / "data" / "evolution_vs_peers"
OUT = Path(__file__).parent.parent / "docs" / "images"
# Same order as the --merge command in docs/samplers.md: later files' ask figures win.
REGRET_FILES = ("digits_single.json", "digits_gp.json", "digits_gp2.json")
ASK_FILES = ("digits_multi_ask.json", "digits_ask.json")
LABELS = {"Evolution": "EvolutionarySampler"}
COLORS = {
    "Evolution": "tab:red",
    "Random": "tab:gray",
    "TPE (multivariate)": "tab:blue",
    "NSGA-II": "tab:green",
    "GP": "tab:purple",
}
MARKERS = {"Evolution": "o", "Random": "s", "TPE (multivariate)": "^", "NSGA-II": "D", "GP": "v"}


def _load(data: Path, names: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    results: list[tuple[Any, ...]] = []
    summary: dict[str, Any] = {}
    for name in names:
        runs, asks = load_stored(data / name)
        results += runs
        summary.update(asks)
    return results, summary


def _budget(data: Path) -> float:
    return float(json.loads((data / REGRET_FILES[0]).read_text())["budget"])


def _legend(fig: Any, ax: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))


def plot_regret(data: Path, out: Path) -> None:
    """Mean regret (log-loss x100) with 95% bands at the stored checkpoints, per sampler."""
    results, _ = _load(data, REGRET_FILES)
    by = picks_by_cell(results)
    budget = _budget(data)
    panels = [("plain", "No budget")]
    if any(setting == "budget" for setting, _ in by):
        panels.append(("budget", f"FLOPs ≤ {budget:,.0f} (only feasible trials count)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6))
    axes = np.atleast_1d(axes)
    x = np.array(CHECKPOINTS)
    for ax, (setting, title) in zip(axes, panels):
        for name in SAMPLERS:
            picks = by.get((setting, name))
            if not picks:
                continue
            stats = [mean_ci([100.0 * p[k][0] for p in picks]) for k in range(len(x))]
            mean = np.array([m for m, _ in stats])
            half = np.nan_to_num(np.array([h for _, h in stats]))
            label = f"{LABELS.get(name, name)} ({len(picks)} seeds)"
            ax.plot(x, mean, marker=MARKERS[name], color=COLORS[name], label=label)
            ax.fill_between(
                x, np.maximum(mean - half, 0), mean + half, color=COLORS[name], alpha=0.15
            )
        ax.set_title(title)
        ax.set_xlabel("Trials")
        ax.set_xticks(x)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Regret: best valid log-loss − table best (×100)")
    fig.suptitle("digits-small tabular NAS (1,536 archs): mean regret, 95% CI bands")
    _legend(fig, axes[0])
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_ask_time(data: Path, out: Path) -> None:
    """ms per ask vs finished trials (log-log), per sampler, for each stored search space."""
    _, summary = _load(data, ASK_FILES)
    groups = ask_groups(summary)
    titles = {"ask": "digits-small (1,536 archs)"}
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.6), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (group, by_name) in zip(axes, groups.items()):
        for name in SAMPLERS:
            cells = by_name.get(name)
            if not cells:
                continue
            n = sorted(cells)
            ax.plot(
                n,
                [cells[k] for k in n],
                marker=MARKERS[name],
                color=COLORS[name],
                label=LABELS.get(name, name),
            )
        space = group.split("-", 1)[-1]
        ax.set_title(titles.get(group, f"{space} space (random history)"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Finished trials in the study")
        ticks = sorted({k for cells in by_name.values() for k in cells})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("Time per ask + suggest (ms)")
    fig.suptitle("Sampler cost per ask (mean of 30 asks; GP 3, only at 200 trials)")
    _legend(fig, axes[0])
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="stored JSON results")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the PNGs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plot_regret(args.data, args.out / "regret_digits.png")
    plot_ask_time(args.data, args.out / "ask_time.png")
    for name in ("regret_digits.png", "ask_time.png"):
        path = args.out / name
        print(f"{path} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
