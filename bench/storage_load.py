"""Load test of every shared storage, as Optuna tests its own (issue 16).

16 worker processes x 50 trials with EvolutionarySampler and 8 x 20 with QUBOSampler on the
``digits-small`` space (cheap deterministic objective: the load is the storage), on
PostgreSQL, MariaDB, the Redis journal, the journal file and the gRPC proxy (over
PostgreSQL by default). Each run must end with exactly 800 (160) COMPLETE trials, numbers
0..N-1, every trial's value, intermediate value, params and attributes matching its
architecture, and no architecture evaluated twice while unseen ones existed. The peer in
the same run is the journal file (no server): trials/s of each backend is printed relative to
it.

    python bench/storage_load.py [--backends postgresql mysql ...] [--quick]

Workers are separate processes (multiprocessing spawn) on this machine; with 2 cores the
figures are CPU-bound (16 interpreters share 2 cores with the servers).
"""

from __future__ import annotations

import argparse
import tempfile

import optuna

from optuna_hpcnas.testing.storages import provision_backend
from optuna_hpcnas.testing.storages import run_load_test

# The journal file (no server) first: it is the peer every other row is compared with.
BACKENDS = ("journal-file", "postgresql", "mysql", "journal-redis", "grpc")
RUNS = (("evolutionary", 16, 50), ("qubo", 8, 20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--proxy-over", default="postgresql", choices=("postgresql", "sqlite"))
    parser.add_argument("--quick", action="store_true", help="4 x 5 and 2 x 5 (smoke test)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    runs = (("evolutionary", 4, 5), ("qubo", 2, 5)) if args.quick else RUNS
    header = (
        f"{'backend':<14} {'sampler':<12} {'workers x trials':>16} {'COMPLETE':>9} "
        f"{'other':>6} {'repeats':>7} {'unique':>6} {'wall s':>7} {'trials/s':>8} "
        f"{'vs journal':>10} {'check':>6}"
    )
    print(f"gRPC proxy over {args.proxy_over}\n")
    print(header)
    print("-" * len(header))
    results = {}
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for sampler, n_workers, n_trials in runs:
            order = sorted(args.backends, key=lambda k: k != "journal-file")
            for kind in order:
                with provision_backend(kind, workdir, proxy_over=args.proxy_over) as url:
                    r = run_load_test(url, sampler=sampler, n_workers=n_workers, n_trials=n_trials)
                results[(kind, sampler)] = r
                peer = results.get(("journal-file", sampler))
                ratio = f"{r.trials_per_s / peer.trials_per_s:9.2f}x" if peer else f"{'-':>10}"
                other = sum(v for k, v in r.states.items() if k != "COMPLETE")
                ok = r.ok and r.repeated_architectures == 0
                print(
                    f"{kind:<14} {sampler:<12} {f'{n_workers} x {n_trials}':>16} "
                    f"{r.n_complete:>9} {other:>6} {r.repeated_architectures:>7} "
                    f"{r.n_unique_architectures:>6} {r.wall_s:7.1f} {r.trials_per_s:8.1f} "
                    f"{ratio} {'ok' if ok else 'FAIL':>6}",
                    flush=True,
                )
                failures.extend(f"{kind}/{sampler}: {p}" for p in r.problems)
                if r.repeated_architectures:
                    failures.append(
                        f"{kind}/{sampler}: {r.repeated_architectures} repeated architectures"
                    )
    print(
        "\nrepeats = trials whose architecture an earlier trial already had while unseen ones "
        "remained (1,536 in the space); vs journal = trials/s relative to the journal file in "
        "the same block."
    )
    if failures:
        print("\nPROBLEMS:")
        for f in failures:
            print(" ", f)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
