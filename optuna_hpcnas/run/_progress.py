"""The progress of a running search, read from its storage: a bar or one line per finished
trial, and the study-wide series of ``/metrics`` (world rank 0 of ``hpcnas run``)."""

from __future__ import annotations

import datetime
import logging
import sys
import threading
import time
from typing import Any
from typing import TextIO
from typing import TYPE_CHECKING

from optuna_hpcnas._records import compute_shares
from optuna_hpcnas._records import group_of

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.metrics import SearchMetrics

_logger = logging.getLogger(__name__)


class ProgressReporter:
    """Follow a study from the storage in a background thread (rank 0 only).

    Shows a progress bar on a TTY and a plain log line per finished trial otherwise, and,
    given a ``SearchMetrics``, keeps its study-wide series (trials by state, progress, best,
    evaluation seconds of every finished trial) up to date for ``/metrics``. Reading the
    storage keeps it independent of how the trials are run (one process or MPI groups).

    Args:
        n_trials: The run's trial budget; the total shown is the larger of it and the number
            of trials in the study (a resumed run enqueues its budget on top of old trials).
            ``None``: no total.
    """

    def __init__(
        self,
        storage: str,
        study_name: str,
        *,
        n_trials: int | None,
        interval: float = 2.0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        display: bool = True,
        metrics: SearchMetrics | None = None,
    ) -> None:
        self._storage = storage
        self._study_name = study_name
        self._n_trials = n_trials
        self._interval = interval
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._display = display
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: set[int] | None = None
        # the storage object, for storages that are not RDB URLs
        self._opened: optuna.storages.BaseStorage | None = None
        self._bar: Any = None
        # Optuna stores naive local datetimes.
        self._started = datetime.datetime.now()

    def start(self) -> ProgressReporter:
        self._thread = threading.Thread(target=self._loop, name="hpcnas-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._bar is not None:
            self._bar.close()

    def _study_created(self) -> bool:
        from optuna_hpcnas.storages import storage_kind

        if storage_kind(self._storage) in ("journal-file", "journal-redis", "grpc"):
            return self._journal_study_created()
        # Read-only look first: opening an RDBStorage creates the schema, which would race
        # with the runner creating it.
        import sqlalchemy

        engine = sqlalchemy.create_engine(self._storage)
        try:
            if not sqlalchemy.inspect(engine).has_table("studies"):
                return False
            with engine.connect() as conn:
                found = conn.execute(
                    sqlalchemy.text("SELECT 1 FROM studies WHERE study_name = :n"),
                    {"n": self._study_name},
                ).first()
            return found is not None
        finally:
            engine.dispose()

    def _journal_study_created(self) -> bool:
        import optuna

        from optuna_hpcnas.storages import open_storage

        if self._opened is None:
            self._opened = open_storage(self._storage)
        names = [s.study_name for s in optuna.get_all_study_summaries(storage=self._opened)]
        return self._study_name in names

    def _loop(self) -> None:
        import optuna

        study = None
        while True:
            stopping = self._stop.is_set()
            try:
                if study is None and self._study_created():
                    storage = self._opened if self._opened is not None else self._storage
                    study = optuna.load_study(study_name=self._study_name, storage=storage)
                if study is not None:
                    self.poll(study)
            except Exception as e:  # keep the search alive whatever the display does
                _logger.debug("Progress poll failed: %s", e)
            if stopping:
                return
            self._stop.wait(self._interval)

    def poll(self, study: optuna.Study) -> None:
        """Report the trials that finished since the last poll."""
        trials = study.get_trials(deepcopy=False)
        seen = self._seen if self._seen is not None else set()
        finished = [t for t in trials if t.state.is_finished() and t.number not in seen]
        # Trials that finished before this reporter started are counted, not reported.
        new = [
            t
            for t in finished
            if t.datetime_complete is None or t.datetime_complete >= self._started
        ]
        done = sum(1 for t in trials if t.state.is_finished())
        total = max(self._n_trials, len(trials)) if self._n_trials else None
        if self._metrics is not None:
            for t in new:
                _observe(self._metrics, t)
            self._metrics.update_from_study(study, n_trials=total)
            for rank, share in compute_shares(study).items():  # stored when a run ends
                self._metrics.set_compute_share(rank, min(1.0, share))
        if self._display and self._tty:
            if self._bar is None:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, file=self._stream, unit="trial")
            self._bar.total = total
            self._bar.n = done
            best = _best_text(study)
            if best:
                self._bar.set_postfix_str(best, refresh=False)
            self._bar.refresh()
        elif self._display:
            # in finishing order, each line with the count at its own finish (several groups
            # finish trials between two polls)
            ordered = sorted(new, key=lambda t: (t.datetime_complete or self._started, t.number))
            for k, t in enumerate(ordered, start=done - len(ordered) + 1):
                target = f"/{total}" if total else ""
                values = ""
                if t.values is not None:
                    values = " values=" + ",".join(f"{v:.6g}" for v in t.values)
                self._stream.write(
                    f"{time.strftime('%H:%M:%S')} trial {t.number} {t.state.name}{values} "
                    f"[{k}{target} finished] {_best_text(study)}\n"
                )
            self._stream.flush()
        seen.update(t.number for t in finished)
        self._seen = seen


def _observe(metrics: SearchMetrics, trial: optuna.trial.FrozenTrial) -> None:
    from optuna_hpcnas._summary import evaluation_seconds

    seconds = evaluation_seconds(trial)
    if seconds is not None:
        metrics.trial_finished(trial.state, max(0.0, seconds), rank=group_of(trial))


def _best_text(study: optuna.Study) -> str:
    try:
        if len(study.directions) == 1:
            return f"best={study.best_value:.6g}"
        return f"pareto={len(study.best_trials)}"
    except ValueError:
        return ""
