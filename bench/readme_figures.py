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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tsc_vs_textbook import PUBLISHED
from tsc_vs_textbook import result_seeds
from tsc_vs_textbook import result_sets
from tsc_vs_textbook import results_table
from tsc_vs_textbook import seconds_table
from tsc_vs_textbook import tsc_table

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
DOCUMENTS = (
    "README.md",
    "docs/deploy.md",
    "docs/samplers.md",
    "docs/signals.md",
    "docs/supernet.md",
)
_FIGURE = re.compile(r"(<!-- figure: ([\w.-]+) -->\n)(.*?)(<!-- /figure -->)", re.DOTALL)


def _peers_mnist1d(data: Path) -> str:
    """The peer table on MNIST-1D: ``bench/tsc_vs_textbook.py --sets mnist1d`` with every
    method (its ``--out`` stored as ``bench/data/tsc_vs_textbook_mnist1d.json``)."""
    results = json.loads((data / "tsc_vs_textbook_mnist1d.json").read_text())
    return results_table(results, "mnist1d")


def _demo(data: Path) -> str:
    """What ``make demo`` printed: ``python -m optuna_hpcnas.demo --json bench/data/demo.json``."""
    r = json.loads((data / "demo.json").read_text())
    return (
        f"As `{r['command']}` (what `make demo` runs, less its options) printed it on "
        f"{r['date']} on 2 CPU cores, {r['threads']} thread: {r['total_seconds']:.1f} s wall; "
        f"the search has a {r['timeout_s']:.0f} s budget, in which it ran {r['trials']} trials "
        f"({r['complete_trials']} complete, {r['pruned_trials']} stopped by the StagedPruner); "
        f"best retrained test accuracy {r['retrained_test_accuracy']:.3f} on "
        f"{r['test_images']} test images (target 0.97)."
    )


def _speed(model: dict) -> str:
    """INT8's batch-1 p50 against FP32's, in words."""
    fp32, int8 = model["timed_ms"]["ort FP32"]["p50"], model["timed_ms"]["ort INT8"]["p50"]
    if int8 > fp32:
        return f"{int8 / fp32:.2f}x slower than FP32 at batch 1"
    return f"{fp32 / int8:.2f}x faster than FP32 at batch 1"


def _deploy_int8(data: Path) -> str:
    """FP32 against INT8 onnxruntime: ``bench/deploy.py --out bench/data/deploy.json``."""
    r = json.loads((data / "deploy.json").read_text())
    models = {m["model"]: m for m in r["models"]}
    digits, conv = models["digits"], models["cifar-conv"]

    def size(m: dict) -> str:
        return f"{m['bytes']['ort INT8'] / m['bytes']['ort FP32']:.2f}x the bytes"

    fp32_wins = digits["timed_ms"]["ort INT8"]["p50"] > digits["timed_ms"]["ort FP32"]["p50"]
    return (
        f"On the digits model of `{r['command']}` ({r['date']}, onnxruntime "
        f"{r['onnxruntime']}, one thread) INT8 keeps {digits['accuracy']['ort INT8']:.3f} "
        f"test accuracy (FP32 {digits['accuracy']['ort FP32']:.3f}) at {size(digits)} and is "
        f"{_speed(digits)} ({digits['timed_ms']['ort FP32']['p50'] * 1e3:.0f} µs in FP32)"
        + (", so `serve` picks FP32 there" if fp32_wins else "")
        + f"; on a convolutional cifar-like model INT8 is {_speed(conv)} at {size(conv)} "
        "(the bytes and the speed depend on the model: a deployed study's best may differ)."
    )


def _run_vs_api(data: Path) -> str:
    """``hpcnas run`` against the Python API: ``bench/run_vs_api.py --out``."""
    r = json.loads((data / "run_vs_api.json").read_text())
    return (
        f"`hpcnas run` against the Python API on `examples/nas.toml` (`{r['command']}`, "
        f"{r['date']}): the same trials one by one ({r['same']} of {r['trials']} architectures "
        f"and values identical) at {r['cli_s'] / r['api_s']:.2f}x the API's wall time "
        f"({r['cli_s']:.0f} s against {r['api_s']:.0f} s)."
    )


def _deploy_table(data: Path) -> str:
    """Every model and runtime of ``bench/deploy.py --out bench/data/deploy.json``."""
    r = json.loads((data / "deploy.json").read_text())
    lines = [
        f"`{r['command']}` ({r['date']}, onnxruntime {r['onnxruntime']}, one thread):",
        "",
        "| model | runtime | p50 ms | p99 ms | samples/s at batch 64 | bytes | accuracy "
        "| p50 vs FP32 | bytes vs FP32 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in r["models"]:
        base = m["timed_ms"]["ort FP32"]
        for runtime, row in m["timed_ms"].items():
            size = m["bytes"].get(runtime)
            fp32_bytes = m["bytes"]["ort FP32"]
            accuracy = m["accuracy"][runtime]
            reference = m["model"] != "digits" and runtime == "torch eager"
            lines.append(
                f"| {m['model']} | {runtime.replace('ort', 'ORT')} | {row['p50']:.3f} "
                f"| {row['p99']:.3f} | {row['tput']:,.0f} "
                f"| {'-' if size is None else f'{size:,}'} "
                f"| {'1 (reference)' if reference else f'{accuracy:.4f}'} "
                f"| {row['p50'] / base['p50']:.2f} "
                f"| {'-' if size is None else f'{size / fp32_bytes:.2f}'} |"
            )
    return "\n".join(lines)


_PROBLEMS = {
    "digits": "digits-small",
    "nb201-cifar10": "NAS-Bench-201 cifar10",
    "nb201-cifar100": "NAS-Bench-201 cifar100 (not tuned on)",
    "nb201-imagenet16-120": "NAS-Bench-201 ImageNet16-120 (not tuned on)",
    "quadratic": "random quadratic",
}
_SAMPLERS = {"Evolution": "Evolutionary"}


def _samplers(data: Path, name: str = "sampler_suite.json", *, errors: bool = False) -> str:
    """The sampler table: ``bench/sampler_suite.py summary --out`` stored as
    ``bench/data/sampler_suite.json`` (regret at N trials, mean over the seeds)."""
    from sampler_suite import regret_cell  # imports the package: only for this figure

    r = json.loads((data / name).read_text())
    names = r["samplers"]
    modes = {row["mode"] for row in r["rows"]}
    lines = [
        f"Mean regret after {r['at']} trials over {r['seeds']} seeds"
        + (" ± standard error" if errors else "")
        + ", lower is better "
        f"(`{r['command']}`, after its `run`; seeds in brackets where fewer ran):",
        "",
        "| problem | " + " | ".join(_SAMPLERS.get(n, n) for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in r["rows"]:
        label = _PROBLEMS.get(row["problem"], row["problem"])
        if len(modes) > 1:
            label += f", {row['mode']}"
        cells = [regret_cell(row["regret"][n], r["seeds"], errors=errors) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    seconds = [f"{v:.2f}" if v is not None else "-" for v in r["seconds"].values()]
    lines.append("| seconds per study | " + " | ".join(seconds) + " |")
    return "\n".join(lines)


def _accuracy(results: dict, name: str, method: str) -> str:
    """Test accuracy (%) of ``method`` on ``name``, the mean over the seeds run."""
    tests = [r["test"] for key, r in results.items() if key.startswith(f"{name}/")
             and key.endswith(f"/{method}")]  # fmt: skip
    return f"{100 * sum(tests) / len(tests):.1f}" if tests else "-"


def _protocol(results: dict) -> str:
    """The seeds and the budget (``--minutes``) of an arm, as the results record them; a peer
    is given at least the wall time (a) took."""
    budgets = [r["budget_s"] for r in results.values() if "budget_s" in r]
    minutes = f", {min(budgets) / 60:g} min an arm, peers given (a)'s wall" if budgets else ""
    return _seed_counts(results) + minutes


def _seed_counts(results: dict, method: str | None = None) -> str:
    """How many seeds ran (``method``'s alone when given), and the sets that ran fewer, as
    "3 seeds (BasicMotions 2)"."""
    if method is not None:
        results = {k: v for k, v in results.items() if k.endswith(f"/{method}")}
    seeds = result_seeds(results)
    fewer = [
        f"{name} {n}"
        for name in result_sets(results)
        if (n := len(result_seeds(results, name))) < len(seeds)
    ]
    but = f" ({', '.join(fewer)})" if fewer else ""
    return f"{len(seeds)} seed{'s' * (len(seeds) > 1)}{but}"


def _tasks(data: Path) -> str:
    """The table "Which tasks it fits": the demo (``demo.json``) and
    ``bench/tsc_vs_textbook.py`` on MNIST-1D and on the archive's sets (``--out``
    ``tsc_vs_textbook_mnist1d.json`` and ``tsc_vs_textbook_aeon.json``)."""
    demo = json.loads((data / "demo.json").read_text())
    mnist = json.loads((data / "tsc_vs_textbook_mnist1d.json").read_text())
    aeon = json.loads((data / "tsc_vs_textbook_aeon.json").read_text())
    sets = result_sets(aeon)

    def per_set(method: str) -> str:
        return " / ".join(_accuracy(aeon, n, method) for n in sets)

    published = " / ".join(f"{p[0]:.1f}" if (p := PUBLISHED.get(n)) else "-" for n in sets)
    docs = "[docs/signals.md](docs/signals.md#against-the-textbook-and-optunas-own-at-equal-"
    docs += "wall-clock)"
    return "\n".join(
        [
            "| task | data | what it reaches | peer in the same run |",
            "|---|---|---|---|",
            "| small images: scikit-learn's digits (`make demo`, `digits-small`) | 1,797 8x8 "
            f"images, {demo['test_images']} held out for test | test accuracy "
            f"{demo['retrained_test_accuracy']:.3f} in {demo['total_seconds']:.0f} s "
            f"({demo['timeout_s']:.0f} s of search) | - (the space is small enough to train "
            "whole: `bench/search_cost.py`) |",
            "| 1-D signals: MNIST-1D (`hpcnas init --preset signal-1d`; `signal-elastic` for "
            "one-shot) | 4,000 train / 1,000 test signals of length 40 | test accuracy (%) "
            f"{_accuracy(mnist, 'mnist1d', 'hpcnas')} multi-fidelity, "
            f"{_accuracy(mnist, 'mnist1d', 'hpcnas-one-shot')} one-shot ({_protocol(mnist)}; "
            "the table below) | the FCN alone "
            f"{_accuracy(mnist, 'mnist1d', 'fcn')}, the ResNet "
            f"{_accuracy(mnist, 'mnist1d', 'resnet')}, Optuna's TPE + Hyperband "
            f"{_accuracy(mnist, 'mnist1d', 'tpe+hyperband')}, Random + SuccessiveHalving "
            f"{_accuracy(mnist, 'mnist1d', 'random+sh')} over the same space, same wall |",
            '| time series as the UCR/UEA archive keeps them (`[data] name = "aeon"`, the '
            f"`signal-1d` or `signal-elastic` starter) | {', '.join(sets)} (the archive's "
            "train/test split, shipped by aeon) | test accuracy (%) "
            f"{per_set('hpcnas')} multi-fidelity ({_protocol(aeon)}), "
            f"{per_set('hpcnas-one-shot')} one-shot ({_seed_counts(aeon, 'hpcnas-one-shot')}); "
            f"published FCN {published} | the FCN alone {per_set('fcn')}, the ResNet "
            f"{per_set('resnet')}, Optuna's TPE + Hyperband over the same space "
            f"{per_set('tpe+hyperband')}, same wall on the same 2 cores "
            f"(`bench/tsc_vs_textbook.py`; table and caveats in {docs}) |",
            "| your own signals, images or token sequences | `npz` `(N, L)`, `(N, L, F)`, "
            "`(N, C, H, W)`; `image_folder`; `cifar10` files; a `factory` | the presets "
            "`signal-elastic`, `signal-1d`, `digits-elastic`, `cifar-like`, `sequence` | - |",
        ]
    )


def _tsc_aeon(data: Path, name: str = "tsc_vs_textbook_aeon.json") -> str:
    """The archive's sets against the textbook and Optuna's own: ``bench/tsc_vs_textbook.py``
    with ``--out bench/data/<name>``; test accuracy, then wall seconds."""
    results = json.loads((data / name).read_text())
    sets, seeds = result_sets(results), result_seeds(results)
    return "\n".join(
        [
            f"Test accuracy (%), {_protocol(results)}:",
            "",
            tsc_table(results, sets, seeds),
            "",
            "Wall seconds each method took, and the trial (a) exported:",
            "",
            seconds_table(results, sets, seeds),
        ]
    )


FIGURES: dict[str, Callable[[Path], str]] = {
    "demo": _demo,
    "deploy-int8": _deploy_int8,
    "deploy-table": _deploy_table,
    "peers-mnist1d": _peers_mnist1d,
    "run-vs-api": _run_vs_api,
    "samplers": _samplers,
    "samplers-cluster": lambda data: _samplers(data, "sampler_suite_cluster.json", errors=True),
    "tasks": _tasks,
    "tsc-aeon": _tsc_aeon,
    "tsc-heldout": lambda data: _tsc_aeon(data, "tsc_vs_textbook_heldout.json"),
}


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
