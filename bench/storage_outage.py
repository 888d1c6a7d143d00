"""Storage outages during ``hpcnas run`` (issue 23): per backend, a server of our own on a
free port is stopped in the middle of a search and started again, once for a short outage
the run rides out and once for one longer than a short window (the run exits 75, then
``hpcnas resume`` finishes the budget).

    python bench/storage_outage.py [--backends postgresql journal-redis] [--ranks 1 2]

Printed per run: the outage, whether the run survived it (exit 0), the seconds from the
server's start to the first trial the run wrote after it (for a run that gave up: the
resume's), the trials lost (must be 0) and the evaluations done twice (must be 0). The peer
in the same run is the same backend ridden out against given up. SQLite is a file, not a
server: it has no outage (N/A).
"""

from __future__ import annotations

import argparse
from pathlib import Path
import tempfile

from optuna_hpcnas.testing.outages import PostgresServer
from optuna_hpcnas.testing.outages import RedisServer
from optuna_hpcnas.testing.outages import run_outage_scenario

SERVERS = {"postgresql": PostgresServer, "journal-redis": RedisServer}
# (outage seconds, [storage] outage_tolerance_s)
CASES = ((10.0, 120.0), (20.0, 3.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--n-trials", type=int, default=6)
    args = parser.parse_args()
    header = (
        f"{'backend':<14} {'ranks':>5} {'window s':>8} {'outage s':>8} {'survived':>8} "
        f"{'exit':>4} {'resumed':>7} {'s to resume':>11} {'lost':>4} {'duplicated':>10}"
    )
    print(header)
    print("-" * len(header))
    failures = []
    for kind in args.backends:
        for ranks in args.ranks:
            for outage, window in CASES:
                with SERVERS[kind]() as server, tempfile.TemporaryDirectory() as workdir:
                    r = run_outage_scenario(
                        server, Path(workdir), ranks=ranks, outage_s=outage,
                        tolerance_s=window, n_trials=args.n_trials,
                    )  # fmt: skip
                resumed = "-" if r.resumed is None else ("yes" if r.resumed[0] == 0 else "NO")
                after = "-" if r.resume_after_s is None else f"{r.resume_after_s:.1f}"
                print(
                    f"{kind:<14} {ranks:>5} {window:>8g} {r.outage_s:>8.1f} "
                    f"{'yes' if r.exit_status == 0 else 'no':>8} {r.exit_status:>4} "
                    f"{resumed:>7} {after:>11} {r.lost:>4} {r.duplicated:>10}",
                    flush=True,
                )
                if r.lost or r.duplicated or r.left or resumed == "NO":
                    failures.append((kind, ranks, outage, r.output[-2000:]))
    print(f"{'sqlite':<14} {'-':>5} {'-':>8} {'N/A':>8}  (a file, not a server: no outage)")
    for kind, ranks, outage, tail in failures:
        print(f"\nFAILED {kind} ranks={ranks} outage={outage}:\n{tail}")
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
