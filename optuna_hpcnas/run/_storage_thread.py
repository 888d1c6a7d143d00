"""Storage calls run in order on one background thread.

A group leader has two (``run/_loop.py``): one for its trial's writes (per-round reports,
attributes, the tell), one for the ask of the next trial. It goes on computing and waits only
for what it needs: the next trial, and a pruner's verdict when that verdict could be "stop"
(``evaluation.verdict_needed``). First-in-first-out order keeps the study's history what a
synchronous loop writes: a trial's reports before its tell; an ask starts once the tell
queued before it is written. Optuna's storages are thread-safe (``study.optimize
(n_jobs=...)`` relies on it; the heartbeat threads already write beside the main thread).

The thread's busy time overlaps the main thread's compute, so it is tracked on a tracker of
its own; the main thread counts only its waits.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
import logging
from typing import Any
from typing import TypeVar

from optuna_hpcnas.distributed import UtilisationTracker

_logger = logging.getLogger(__name__)
T = TypeVar("T")


class StorageThread:
    """First-in-first-out storage calls on one background thread.

    Args:
        tracker: The main thread's tracker; its waits are counted there.

    Examples:
        >>> from optuna_hpcnas.distributed import UtilisationTracker
        >>> thread = StorageThread(UtilisationTracker())
        >>> thread.wait(thread.submit(sum, [1, 2, 3]))
        6
        >>> thread.close()
    """

    def __init__(self, tracker: UtilisationTracker) -> None:
        self._main = tracker
        self.tracker = UtilisationTracker()  # the thread's own busy time
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcnas-storage")
        self._pending: list[Future[Any]] = []

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)``. Its error, if any, is raised by ``wait`` on it, or by the next
        ``check`` or ``drain`` (where a synchronous loop would have raised it, or later)."""
        future = self._pool.submit(fn, *args)
        self._pending.append(future)
        return future

    def wait(self, future: Future[T], category: str = "storage") -> T:
        """The result of ``future``; the main thread's wait counts as ``category``."""
        with self._main.track(category):
            try:
                return future.result()
            finally:  # its error is raised here, not again by ``check``
                if future in self._pending:
                    self._pending.remove(future)

    def drain(self, category: str = "drain") -> None:
        """Wait for every queued call; raise the first error among them."""
        with self._main.track(category):
            for future in self._pending:
                future.exception()
        self.check()

    def close(self) -> None:
        """Finish the queued calls and stop the thread; errors are logged, not raised (it
        runs on the way out of an error or a signal)."""
        from optuna_hpcnas.storages import StorageUnavailable

        self._pool.shutdown(wait=True)
        for future in self._pending:
            error = future.exception()
            if isinstance(error, StorageUnavailable):  # said once, by the command's last line
                _logger.debug("A storage call failed on the way out: %r", error)
            elif error is not None:
                _logger.error("A storage call failed on the way out: %r", error)
        self._pending.clear()

    def check(self) -> None:
        """Raise the first error of the calls that have finished (and forget them)."""
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if f not in done]
        for future in done:
            error = future.exception()
            if error is not None:
                raise error
