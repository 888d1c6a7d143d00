"""Helpers of the command line that are worth testing on their own: masking passwords in
storage URLs, finding the MPI rank without importing mpi4py, the SQLite-sharing warning and
progress lines (``--set key=value`` is parsed by ``optuna_hpcnas.config.parse_overrides``).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import sys
import threading
import time
from typing import Any
from typing import TextIO

_logger = logging.getLogger(__name__)

_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@\s]*:)(?P<pw>[^@\s]*)@")


def mask_url(text: str) -> str:
    """Replace the password of every URL in ``text`` with ``***``.

    Example:
        >>> mask_url("postgresql+psycopg://nas:s3cret@db:5432/optuna")
        'postgresql+psycopg://nas:***@db:5432/optuna'
        >>> mask_url("sqlite:///nas.db")
        'sqlite:///nas.db'
    """
    return _URL_PASSWORD.sub(lambda m: m.group("head") + "***@", text)


class MaskingFilter(logging.Filter):
    """A logging filter that masks URL passwords in every record (ours and the libraries')."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_url(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def mpi_rank_and_size() -> tuple[int, int]:
    """This process's rank and the world size: from mpi4py when it is already imported
    (``python -m mpi4py``), else from the launcher's environment, else ``(0, 1)``.
    """
    if "mpi4py.MPI" in sys.modules:
        comm = sys.modules["mpi4py.MPI"].COMM_WORLD
        return int(comm.Get_rank()), int(comm.Get_size())
    for rank_var, size_var in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("PMIX_RANK", "PMIX_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def warn_if_sqlite_shared(url: str, *, n_processes: int, running_trials: int = 0) -> bool:
    """Warn (and return True) when a SQLite storage is written by more than one process."""
    if not is_sqlite(url):
        return False
    if n_processes > 1:
        _logger.warning(
            "SQLite storage %s is used by %d processes: SQLite locks the whole file on every "
            "write, so trials will stall or fail with 'database is locked'. Use PostgreSQL or "
            "MySQL (OPTUNA_STORAGE=postgresql+psycopg://...) or JournalStorage for several "
            "processes.",
            mask_url(url),
            n_processes,
        )
        return True
    if running_trials > 0:
        _logger.warning(
            "SQLite storage %s already has %d RUNNING trial(s): if another process is still "
            "searching, SQLite is shared between processes; use PostgreSQL or MySQL for that.",
            mask_url(url),
            running_trials,
        )
        return True
    return False


def format_duration(seconds: float) -> str:
    """``3725`` -> ``'1h02m05s'``."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


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
        metrics: Any = None,
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
        self._opened: Any = None  # the storage object, for storages that are not RDB URLs
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

    def poll(self, study: Any) -> None:
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
                self._observe(t)
            self._metrics.update_from_study(study, n_trials=total)
            self._compute_shares(study)
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

    def _compute_shares(self, study: Any) -> None:
        # The distributed runner stores each rank's time shares when a run ends.

        from optuna_hpcnas._records import compute_shares

        for rank, share in compute_shares(study).items():
            self._metrics.set_compute_share(rank, min(1.0, share))

    def _observe(self, trial: Any) -> None:
        if trial.datetime_start is None or trial.datetime_complete is None:
            return
        seconds = max(0.0, (trial.datetime_complete - trial.datetime_start).total_seconds())
        from optuna_hpcnas._records import group_of

        self._metrics.trial_finished(trial.state, seconds, rank=group_of(trial))


def _best_text(study: Any) -> str:
    try:
        if len(study.directions) == 1:
            return f"best={study.best_value:.6g}"
        return f"pareto={len(study.best_trials)}"
    except ValueError:
        return ""
