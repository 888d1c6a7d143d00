"""Where each rank's wall time goes: compute versus storage, sampler, communication, idle.

``UtilisationTracker.track(category)`` is a context manager put around every phase of the
run loop; time not inside any tracked phase is ``other``. ``UtilisationTracker.loop()`` marks
the search loop (from the first ask to the rank's last trial): its shares are kept apart from
the whole process's, so start-up and the drain at the end (waiting for the other ranks' last
trials) never count for or against the loop's compute share. At the end ``run_search``
gathers every rank's report on rank 0, logs the table and stores it in the study
(``_keys.DISTRIBUTED_UTILISATION``); ``hpcnas status`` and ``bench/distributed_throughput.py``
print the same stored figures.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
import time
from typing import Any

CATEGORIES = ("compute", "setup", "storage", "sampler", "communication", "idle", "drain")
"""``compute``: forward, backward, optimizer step and validation forwards; ``setup``: building
models and engines; ``storage``: Optuna storage calls (on a leader's main thread: waiting
for its write thread, a pruner's verdict); ``sampler``: the sampler's ask (on a leader's main
thread: waiting for its ask thread); ``communication``: weight synchronisation inside and
between groups; ``idle``: waiting for the leader or for work; ``drain``: after the rank's last
trial, waiting for the storage thread's last writes and the other ranks' last trials."""


class UtilisationTracker:
    """Accumulates seconds per category for one rank.

    Args:
        clock: A monotonic clock (``time.perf_counter`` by default).

    Examples:
        >>> tracker = UtilisationTracker()
        >>> with tracker.track("compute"):
        ...     _ = sum(range(1000))
        >>> tracker.seconds["compute"] > 0
        True
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._start = clock()
        self._stop: float | None = None
        self.seconds: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
        self._stack: list[str] = []
        self._since = self._start
        self._loop: tuple[float, dict[str, float]] | None = None  # its start and seconds
        self.loop_seconds = 0.0
        self.loop_totals: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)

    @contextmanager
    def track(self, category: str) -> Iterator[None]:
        """Count the time inside the block as ``category``; a nested block counts its own
        time as its category, and the outer one resumes after it (a storage write inside an
        evaluation is storage, not compute)."""
        if category not in self.seconds:
            raise ValueError(f"`category` is {category!r}, but must be one of {list(CATEGORIES)}.")
        self._switch()
        self._stack.append(category)
        try:
            yield
        finally:
            self._switch()
            self._stack.pop()

    def _switch(self) -> None:
        now = self._clock()
        if self._stack:
            self.seconds[self._stack[-1]] += now - self._since
        self._since = now

    @contextmanager
    def loop(self) -> Iterator[None]:
        """Mark the search loop: the seconds of each category inside it are also kept apart
        (``loop_seconds``, ``loop_totals``, and ``loop_shares`` in the report)."""
        self._switch()
        start = self._clock()
        before = dict(self.seconds)
        try:
            yield
        finally:
            self._switch()
            self.loop_seconds += self._clock() - start
            for k, v in self.seconds.items():
                self.loop_totals[k] += v - before[k]

    def stop(self) -> None:
        """Freeze the wall time (later ``report`` calls use this end)."""
        self._stop = self._clock()

    @property
    def wall(self) -> float:
        end = self._stop if self._stop is not None else self._clock()
        return max(end - self._start, 1e-12)

    def report(self, **labels: Any) -> RankUtilisation:
        return RankUtilisation(
            wall_seconds=self.wall,
            shares=_shares(self.seconds, self.wall),
            loop_seconds=self.loop_seconds,
            loop_shares=(
                _shares(self.loop_totals, self.loop_seconds) if self.loop_seconds > 0 else None
            ),
            labels=dict(labels),
        )


def _shares(seconds: dict[str, float], total: float) -> dict[str, float]:
    """Each category's share of ``total`` seconds, and ``other`` for the untracked rest."""
    total = max(total, 1e-12)
    shares = {k: v / total for k, v in seconds.items()}
    shares["other"] = max(0.0, 1.0 - sum(seconds.values()) / total)
    return shares


@dataclass(frozen=True)
class RankUtilisation:
    """Shares of one rank's wall time and of its search loop (each sums to 1 with ``other``)."""

    wall_seconds: float
    shares: dict[str, float]
    labels: dict[str, Any]
    loop_seconds: float = 0.0
    loop_shares: dict[str, float] | None = None

    @property
    def compute_share(self) -> float:
        """Share of the search loop spent computing (of the whole process without a loop)."""
        return (self.loop_shares or self.shares)["compute"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_seconds": self.wall_seconds,
            "shares": self.shares,
            "loop_seconds": self.loop_seconds,
            "loop_shares": self.loop_shares or {},
            **self.labels,
        }


def format_table(reports: Sequence[RankUtilisation]) -> str:
    """A plain-text table, one line per rank, plus the mean: the loop's seconds and compute
    share, then the shares of the whole process's wall time."""
    cols = [*CATEGORIES, "other"]
    head = f"{'rank':>4} {'group':>5} {'loop s':>7} {'compute':>7} | {'wall s':>7} "
    lines = [head + " ".join(f"{c[:7]:>7}" for c in cols)]
    for r in reports:
        lines.append(
            f"{r.labels.get('rank', '?'):>4} {r.labels.get('group', '?'):>5} "
            f"{r.loop_seconds:7.2f} {r.compute_share:7.1%} | {r.wall_seconds:7.2f} "
            + " ".join(f"{r.shares[c]:7.1%}" for c in cols)
        )
    if reports:
        n = len(reports)
        mean = {c: sum(r.shares[c] for r in reports) / n for c in cols}
        loop = sum(r.compute_share for r in reports) / n
        lines.append(
            f"{'mean':>4} {'':>5} {'':>7} {loop:7.1%} | {'':>7} "
            + " ".join(f"{mean[c]:7.1%}" for c in cols)
        )
    return "\n".join(lines)
