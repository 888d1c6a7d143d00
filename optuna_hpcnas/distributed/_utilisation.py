"""Where each rank's wall time goes: compute versus storage, sampler, communication, idle.

``UtilisationTracker.track(category)`` is a context manager put around every phase of the
run loop; time not inside any tracked phase is ``other``. At the end ``summarise`` gathers
the per-rank shares on rank 0; ``run_search`` logs the table and stores it in the study
(``_keys.DISTRIBUTED_UTILISATION``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
import time
from typing import Any

CATEGORIES = ("compute", "setup", "storage", "sampler", "communication", "idle")
"""``compute``: forward, backward, optimizer step and validation forwards; ``setup``: building
models and engines; ``storage``: Optuna storage calls; ``sampler``: the sampler's ask;
``communication``: weight synchronisation inside and between groups; ``idle``: waiting for
the leader or for work."""


class UtilisationTracker:
    """Accumulates seconds per category for one rank.

    Args:
        clock: A monotonic clock (``time.perf_counter`` by default).

    Example:
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

    def stop(self) -> None:
        """Freeze the wall time (later ``report`` calls use this end)."""
        self._stop = self._clock()

    @property
    def wall(self) -> float:
        end = self._stop if self._stop is not None else self._clock()
        return max(end - self._start, 1e-12)

    def report(self, **labels: Any) -> RankUtilisation:
        wall = self.wall
        tracked = sum(self.seconds.values())
        shares = {k: v / wall for k, v in self.seconds.items()}
        shares["other"] = max(0.0, 1.0 - tracked / wall)
        return RankUtilisation(wall_seconds=wall, shares=shares, labels=dict(labels))


@dataclass(frozen=True)
class RankUtilisation:
    """Shares of one rank's wall time (they sum to 1 with ``other``)."""

    wall_seconds: float
    shares: dict[str, float]
    labels: dict[str, Any]

    @property
    def compute_share(self) -> float:
        return self.shares["compute"]

    def to_dict(self) -> dict[str, Any]:
        return {"wall_seconds": self.wall_seconds, "shares": self.shares, **self.labels}


def format_table(reports: Sequence[RankUtilisation]) -> str:
    """A plain-text table, one line per rank, plus the mean."""
    cols = [*CATEGORIES, "other"]
    head = f"{'rank':>4} {'group':>5} {'wall s':>8} " + " ".join(f"{c[:7]:>7}" for c in cols)
    lines = [head]
    for r in reports:
        lines.append(
            f"{r.labels.get('rank', '?'):>4} {r.labels.get('group', '?'):>5} "
            f"{r.wall_seconds:8.2f} " + " ".join(f"{r.shares[c]:7.1%}" for c in cols)
        )
    if reports:
        mean = {c: sum(r.shares[c] for r in reports) / len(reports) for c in cols}
        lines.append(f"{'mean':>4} {'':>5} {'':>8} " + " ".join(f"{mean[c]:7.1%}" for c in cols))
    return "\n".join(lines)
