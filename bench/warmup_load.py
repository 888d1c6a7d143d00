"""``hpcnas run``'s first supernet warm-up epoch, alone and beside a CPU-bound process.

Issue 22: with another CPU-bound job on the cores, torch's threads (the process's share:
usable CPUs / ranks) spun while they waited and the first warm-up epoch took 48x longer.
This runs ``python -m optuna_hpcnas run`` on ``examples/nas.toml`` cut to one warm-up epoch
and one trial (a temporary SQLite study, metrics off), reads the warm-up seconds from its
log, first as the machine is, then with ``--load`` busy processes beside it, and prints the
ratio. ``--checkout DIR`` runs another checkout's package instead (e.g. a ``git archive`` of
the main branch, for the figures before the change); the run takes the default threads.

    python bench/warmup_load.py
    python bench/warmup_load.py --checkout /tmp/main-copy --repeats 2
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(Path(__file__).parent))

from sampler_load import busy

EXAMPLE = Path(__file__).parent.parent / "examples" / "nas.toml"
_WARMUP = re.compile(r"Supernet warm-up: .* in ([0-9.]+) s")
_THREADS = re.compile(r"torch uses (\d+) intra-op thread")


def _config(directory: Path) -> Path:
    text = EXAMPLE.read_text()
    text = re.sub(r"(?m)^storage = .*$", f'storage = "sqlite:///{directory / "warm.db"}"', text)
    text = re.sub(r"(?m)^n_trials = .*$", "n_trials = 1", text)
    text = re.sub(r"(?m)^epochs = 8$", "epochs = 1", text)
    text = re.sub(r"(?m)^enabled = true", "enabled = false", text)
    path = directory / "warm.toml"
    path.write_text(text)
    return path


def warm_up_seconds(checkout: Path | None) -> tuple[float, str]:
    """Seconds of the first warm-up epoch and torch's thread count, from one fresh run."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # the run's own default share
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    with tempfile.TemporaryDirectory() as tmp:
        config = _config(Path(tmp))
        proc = subprocess.run(
            [sys.executable, "-m", "optuna_hpcnas", "run", "--config", str(config)],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    log = proc.stdout + proc.stderr
    found = _WARMUP.search(log)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"hpcnas run failed ({proc.returncode}):\n{log[-3000:]}")
    threads = _THREADS.search(log)
    return float(found.group(1)), threads.group(1) if threads else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=1, help="busy processes beside the run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--checkout", type=Path, default=None)
    args = parser.parse_args()
    idle = [warm_up_seconds(args.checkout) for _ in range(args.repeats)]
    load = os.getloadavg()[0]
    with busy(args.load):
        loaded = [warm_up_seconds(args.checkout) for _ in range(args.repeats)]
        load_busy = os.getloadavg()[0]
    a = min(s for s, _ in idle)
    b = min(s for s, _ in loaded)
    label = str(args.checkout) if args.checkout else "this checkout"
    print(f"## First warm-up epoch of `hpcnas run` ({label}; best of {args.repeats})\n")
    print("| phase | load average | torch threads | seconds |")
    print("|---|---|---|---|")
    print(f"| as found | {load:.1f} | {idle[0][1]} | {a:.1f} |")
    print(f"| {args.load} busy process(es) | {load_busy:.1f} | {loaded[0][1]} | {b:.1f} |")
    print(f"\nbusy / as found: {b / a:.2f}")


if __name__ == "__main__":
    main()
