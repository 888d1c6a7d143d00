"""Sampler asks on an idle and on a busy machine, in one run (issue 22).

``--load`` CPU-bound processes (a busy loop each) are started here and paused (SIGSTOP);
every measurement is taken twice in a row, once with them paused ("as found": whatever else
runs on the shared machine) and once with them running ("busy"), so both halves see the same
neighbours and the ratio is the busy processes' own effect. On the same NAS-Bench-201
cifar10 history (``bench/sampler_suite.py``):

* median wall milliseconds per ask after ``--history`` finished trials, for
  EvolutionarySampler and QUBOSampler (one BLAS/OpenMP thread, their default),
  EvolutionarySampler with as many threads as cores (the BLAS default before issue 22), TPE
  (multivariate) and GP;
* wall seconds per 100-trial study of EvolutionarySampler and GPSampler (``--seeds``
  studies each), and their ratio.

GP gets the same threads as our samplers: torch's intra-op threads and every BLAS/OpenMP pool
limited to ``--gp-threads`` (1) while it runs.

    python bench/sampler_load.py                     # one busy process, 2 studies each
    python bench/sampler_load.py --load 2 --seeds 3
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from collections.abc import Iterator
import contextlib
import os
from pathlib import Path
import signal
import statistics
import subprocess
import sys
import time
import warnings

import optuna
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))

from sampler_suite import make_problem
from sampler_suite import Problem
from sampler_suite import run_one

from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler

_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

# name -> (factory, runs under the bench's own thread limit: GP and TPE are not ours)
SAMPLERS: dict[str, tuple[Callable[[int], optuna.samplers.BaseSampler], bool]] = {
    "Evolution": (lambda s: EvolutionarySampler(seed=s), False),
    f"Evolution threads={_CORES}": (
        lambda s: EvolutionarySampler(seed=s, threads=_CORES or 1),
        False,
    ),
    "QUBO": (lambda s: QUBOSampler(seed=s), False),
    "TPE": (lambda s: optuna.samplers.TPESampler(multivariate=True, seed=s), True),
    "GP": (lambda s: optuna.samplers.GPSampler(seed=s), True),
}


class Busy:
    """``processes`` CPU-bound Python processes that can be paused and resumed."""

    def __init__(self, processes: int) -> None:
        self._procs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
        ]
        self.running = True
        self.set(False)

    def set(self, running: bool) -> None:
        if running != self.running:
            for proc in self._procs:
                os.kill(proc.pid, signal.SIGCONT if running else signal.SIGSTOP)
            self.running = running
            time.sleep(0.05)  # let the scheduler see the change

    def stop(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound Python processes running for the duration of the block."""
    load = Busy(processes)
    load.set(True)
    try:
        time.sleep(1.0)
        yield
    finally:
        load.stop()


@contextlib.contextmanager
def peer_threads(limited: bool, threads: int) -> Iterator[None]:
    """Optuna's samplers get ``threads`` for torch and every thread pool (ours limit
    themselves)."""
    if not limited:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(threads):
            yield
    finally:
        torch.set_num_threads(before)


def ms_per_ask(
    problem: Problem,
    make: Callable[[int], optuna.samplers.BaseSampler],
    history: int,
    asks: int,
    load: Busy,
) -> tuple[float, float]:
    """Median wall ms of an ask as found and busy, on a study with ``history`` trials (each
    ask timed once in either state, alternating; one untimed ask first)."""
    suggest = problem.suggest_for_new_study()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: problem.value[suggest(t)], n_trials=history)
    study.sampler = make(0)
    times: dict[bool, list[float]] = {False: [], True: []}
    for k in range(2 * asks + 1):
        # States in pairs (as found, as found, busy, busy, ...): QUBOSampler's local and
        # global asks alternate by trial number, and each state must get both.
        running = (k // 2) % 2 == 1
        load.set(running)
        start = time.perf_counter()
        trial = study.ask()
        key = suggest(trial)
        elapsed = time.perf_counter() - start
        study.tell(trial, problem.value[key])
        if k:
            times[running].append(elapsed)
    load.set(False)
    return 1000.0 * statistics.median(times[False]), 1000.0 * statistics.median(times[True])


def reference_ms(asks: int, load: Busy) -> tuple[float, float]:
    """The same measurement for a fixed single-threaded loop (about 10 ms): the share of a
    core this process gets, which no sampler can beat."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for k in range(2 * asks):
        running = (k // 2) % 2 == 1
        load.set(running)
        start = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i
        times[running].append(time.perf_counter() - start)
    load.set(False)
    return 1000.0 * statistics.median(times[False]), 1000.0 * statistics.median(times[True])


def seconds_per_study(
    problem: Problem, name: str, seeds: int, threads: int, load: Busy
) -> tuple[float, float]:
    """Mean wall seconds of a 100-trial study as found and busy (each seed in either state)."""
    make, limited = SAMPLERS[name]
    spent: dict[bool, list[float]] = {False: [], True: []}
    for seed in range(seeds):
        for running in (False, True):
            load.set(running)
            with peer_threads(limited, threads):
                spent[running].append(run_one(problem, "plain", make(seed), 100)["seconds"])
    load.set(False)
    return statistics.mean(spent[False]), statistics.mean(spent[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=1, help="busy processes")
    parser.add_argument("--history", type=int, default=100)
    parser.add_argument("--asks", type=int, default=20, help="asks timed in either state")
    parser.add_argument("--seeds", type=int, default=2, help="100-trial studies per sampler")
    parser.add_argument("--gp-threads", type=int, default=1)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    problem = make_problem("nb201-cifar10", 0)
    load = Busy(args.load)
    try:
        before = os.getloadavg()[0]
        asks = {"one-thread loop (reference)": reference_ms(args.asks, load)}
        for name, (make, limited) in SAMPLERS.items():
            n = max(2, args.asks // 4) if name == "GP" else args.asks
            with peer_threads(limited, args.gp_threads):
                asks[name] = ms_per_ask(problem, make, args.history, n, load)
        studies = {
            name: seconds_per_study(problem, name, args.seeds, args.gp_threads, load)
            for name in ("Evolution", "GP")
        }
        after = os.getloadavg()[0]
    finally:
        load.stop()
    print(f"## Median wall ms per ask after {args.history} trials, NAS-Bench-201 cifar10")
    print(
        f"\n{_CORES} CPUs; load average {before:.1f} at the start, {after:.1f} at the end "
        f"(with the {args.load} busy process(es) running half the time)\n"
    )
    print("| sampler | as found | busy | busy / as found | over the reference's |")
    print("|---|---|---|---|---|")
    share = asks["one-thread loop (reference)"]
    for name, (a, b) in asks.items():
        extra = (b / a) / (share[1] / share[0])
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} | {extra:.2f} |")
    print(
        f"\n## Wall seconds per 100-trial study ({args.seeds} seeds; GP threads {args.gp_threads})"
    )
    print("\n| phase | Evolution | GP | Evolution / GP |")
    print("|---|---|---|---|")
    for i, label in enumerate(("as found", "busy")):
        evo, gp = studies["Evolution"][i], studies["GP"][i]
        print(f"| {label} | {evo:.2f} | {gp:.2f} | {evo / gp:.3f} |")


if __name__ == "__main__":
    main()
