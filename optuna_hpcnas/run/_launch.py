"""``launch``: ``hpcnas run`` and ``hpcnas resume`` around ``run_search``, on every rank.

Every rank loads the data first; world rank 0 checks the storage (a resume counts the trials
its stopped run left) and tells every rank the outcome; it warns when SQLite is shared
between processes, serves the Prometheus metrics and follows the progress from the storage.
After the search it saves the dashboard plots and returns the study's summary for the command
line to print.
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
from dataclasses import dataclass
import logging
import os
from pathlib import Path
from typing import Any
from typing import TYPE_CHECKING
from typing import TypeVar

from optuna_hpcnas.distributed import GroupError
from optuna_hpcnas.distributed._groups import world_comm
from optuna_hpcnas.run._search import run_search
from optuna_hpcnas.run._setup import SetupError
from optuna_hpcnas.storages import EXIT_STORAGE_UNAVAILABLE
from optuna_hpcnas.storages import mask_url
from optuna_hpcnas.storages import open_storage
from optuna_hpcnas.storages import storage_kind
from optuna_hpcnas.storages import StorageError
from optuna_hpcnas.storages import StorageUnavailable

if TYPE_CHECKING:
    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.data import TaskData
    from optuna_hpcnas.distributed import Comm
    from optuna_hpcnas.metrics import SearchMetrics

_logger = logging.getLogger(__name__)
T = TypeVar("T")
# Processes one SQLite file serves without stalls: 4 ranks of the starter spent 90-97 % of
# their loop computing on it (docs/distributed.md), the write lock's waits grow past that.
SQLITE_PROCESSES = 4


class LaunchError(Exception):
    """A user error before or during the launch (a storage, a study, a missing artifact
    store): one line, the same on every rank."""


class StorageLost(LaunchError):
    """The storage stayed unreachable past ``[storage] outage_tolerance_s`` during the run:
    one line naming it (password masked); the command exits with ``exit_status`` (75,
    ``EX_TEMPFAIL``) and ``hpcnas resume`` continues once it is back."""

    exit_status = EXIT_STORAGE_UNAVAILABLE


@dataclass(frozen=True)
class Launched:
    """What a launch did, for the command line to print.

    Attributes:
        storage: The study's storage URL.
        study_name: The study.
        rank: This process's world rank (rank 0 prints).
        ran: Whether a search ran (``False``: a resume found no trial left).
        status: ``optuna_hpcnas._summary.study_status`` of the study after the search
            (world rank 0; ``None`` elsewhere or when nothing ran).
    """

    storage: str
    study_name: str
    rank: int
    ran: bool
    status: dict[str, Any] | None = None


def launch(config: RunConfig, *, resume: bool, progress: bool = True) -> Launched:
    """Run the search of ``config`` on every rank of the job (``hpcnas run``), or (``resume``)
    exactly the trials a stopped search left (``hpcnas resume``).

    Args:
        config: The run configuration.
        resume: Run only the WAITING and RUNNING trials left in the study.
        progress: Show the progress (a bar on a terminal, one line per trial otherwise).

    Raises:
        LaunchError: On every rank, for what the user can fix (one line, password masked).
    """
    from optuna_hpcnas.config import with_overrides

    comm = world_comm()
    storage, name = config.study.resolved_storage(), config.study.name
    # the data first: a file that cannot be used is one line, before any storage is created
    data = _load_data(config)
    if resume:
        waiting = _on_root(comm, lambda: _remaining_budget(config))
        if waiting == 0:
            return Launched(storage, name, comm.Get_rank(), ran=False)
        # Run exactly the trials the stopped job left in the queue.
        config = with_overrides(config, study={"n_trials": waiting})
    else:
        _on_root(comm, lambda: _check_storage(storage))
    metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if metrics_dir:
        Path(metrics_dir).mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        metrics = None
        if comm.Get_rank() == 0:
            metrics = _observe(stack, config, resume=resume, size=comm.Get_size(), show=progress)
        try:
            run_search(config, comm=comm, metrics=metrics, data=data, resume=resume)
        except StorageUnavailable as e:  # the leader of this rank's group
            raise StorageLost(_resume_hint(str(e))) from None
        except GroupError as e:
            if e.error_type != StorageUnavailable.__name__:
                raise
            raise StorageLost(_resume_hint(e.leader_message)) from None
        except StorageError as e:  # e.g. checkpoints on a journal without an artifact store
            raise LaunchError(str(e)) from None
        except SetupError as e:  # the same line on every rank
            raise _setup_error(e) from None
        except Exception as e:
            _raise_if_out_of_space(e, "the search stopped", "run `hpcnas resume`")
            raise
    if comm.Get_rank() != 0:
        return Launched(storage, name, comm.Get_rank(), ran=True)
    return Launched(storage, name, 0, ran=True, status=_finish(config))


def _setup_error(error: SetupError) -> LaunchError:
    """A failed setup step as what the command line says: its cause's own line where it has
    one (a lost storage, a full disk), else the step's line."""
    cause = error.__cause__
    if isinstance(cause, StorageUnavailable):
        return StorageLost(_resume_hint(str(cause)))
    if isinstance(cause, StorageError):
        return LaunchError(str(cause))
    if isinstance(cause, Exception):
        try:
            _raise_if_out_of_space(cause, "the search stopped", "run `hpcnas resume`")
        except LaunchError as full:
            return full
    return LaunchError(str(error))


def _resume_hint(message: str) -> str:
    return (
        f"{message}; the running trials are retried: run `hpcnas resume` with the same "
        "config once the storage is back"
    )


def _raise_if_out_of_space(error: Exception, what: str, then: str = "") -> None:
    """A full or read-only disk (the database's, the artifact directory's) as one line."""
    from optuna_hpcnas.storages import out_of_space

    cause = out_of_space(error)
    if cause is not None:
        after = f"; free space and {then}" if then else ""
        raise LaunchError(f"{what}: {cause}{after}") from None


def _load_data(config: RunConfig) -> TaskData:
    """The task of ``[data]`` (every rank loads its own), or its ``DataError`` as one
    ``LaunchError`` line."""
    from optuna_hpcnas.data import DataError

    try:
        return config.data.load()
    except DataError as e:
        raise LaunchError(f"[data] {e}") from None


def _on_root(comm: Comm, check: Callable[[], T]) -> T:
    """``check()`` on world rank 0 (the only rank that reads the storage before the run): its
    result, or its ``LaunchError``, on every rank."""
    outcome: tuple[str | None, T | None] = (None, None)
    if comm.Get_rank() == 0:
        try:
            outcome = (None, check())
        except LaunchError as e:
            outcome = (str(e), None)
    error, value = comm.bcast(outcome, root=0)
    if error is not None:
        raise LaunchError(error)
    return value


def _check_storage(url: str) -> None:
    try:
        open_storage(url)
    except StorageError as e:
        raise LaunchError(str(e)) from None


def _remaining_budget(config: RunConfig) -> int:
    """The trials of the study to resume (``run._study.trials_to_resume``: dead trials swept
    and retried first, the recorded budget queued in full)."""
    import optuna

    from optuna_hpcnas.run._study import trials_to_resume

    url, name = config.study.resolved_storage(), config.study.name
    try:
        opened = open_storage(url, must_exist=True)
        names = [s.study_name for s in optuna.study.get_all_study_summaries(storage=opened)]
    except StorageError as e:
        raise LaunchError(str(e)) from None
    except Exception as e:
        raise LaunchError(f"cannot open storage {mask_url(url)}: {type(e).__name__}") from None
    if name not in names:
        raise LaunchError(
            f"no study {name!r} to resume in {mask_url(url)} (studies there: "
            f"{names or 'none'}); start it with `hpcnas run`"
        )
    try:
        return trials_to_resume(config)
    except Exception as e:
        _raise_if_out_of_space(e, f"cannot resume study {name!r} in {mask_url(url)}")
        raise


def _observe(
    stack: contextlib.ExitStack, config: RunConfig, *, resume: bool, size: int, show: bool
) -> SearchMetrics | None:
    """World rank 0: the launch line, the SQLite warning, the metrics server and the progress
    (both stopped by ``stack``); the metrics the run feeds."""
    storage, name = config.study.resolved_storage(), config.study.name
    _logger.info(
        "%s study %r on %s with %d process(es)",
        "Resuming" if resume else "Running",
        name,
        mask_url(storage),
        size,
    )
    warn_if_sqlite_shared(storage, n_processes=size, running_trials=_running_trials(storage, name))
    metrics = None
    if config.metrics.enabled:
        from optuna_hpcnas.metrics import SearchMetrics
        from optuna_hpcnas.metrics import serve_metrics

        metrics = SearchMetrics()
        host, port = config.metrics.host, config.metrics.port
        try:
            server = serve_metrics(metrics, port=port, host=host)
        except OSError as e:  # the port taken, the host not this machine's
            raise LaunchError(
                f"[metrics] cannot serve on {host}:{port}: {e.strerror or e}; choose another "
                "port (0 picks a free one)"
            ) from None
        stack.callback(server.close)
    if metrics is not None or show:
        from optuna_hpcnas.run._progress import ProgressReporter

        reporter = ProgressReporter(
            storage,
            name,
            n_trials=config.study.n_trials,
            interval=config.metrics.refresh_seconds,
            display=show,
            metrics=metrics,
        ).start()
        stack.callback(reporter.stop)
    return metrics


def warn_if_sqlite_shared(url: str, *, n_processes: int, running_trials: int = 0) -> bool:
    """Warn (and return True) when a SQLite storage is written by more processes than it
    serves well (more than ``SQLITE_PROCESSES``), or already has RUNNING trials; a few
    processes on one machine get an info line."""
    if storage_kind(url) != "sqlite":
        return False
    if n_processes > SQLITE_PROCESSES:
        _logger.warning(
            "SQLite storage %s is used by %d processes: SQLite locks the whole file on every "
            "write, so trials will stall or fail with 'database is locked'. Use PostgreSQL or "
            "MySQL (OPTUNA_STORAGE=postgresql+psycopg://...) or JournalStorage for several "
            "processes.",
            mask_url(url),
            n_processes,
        )
        return True
    if n_processes > 1:
        _logger.info(
            "SQLite storage %s is shared by %d processes: fine on one machine's disk; use "
            "PostgreSQL or MySQL for more processes or several nodes.",
            mask_url(url),
            n_processes,
        )
    if running_trials > 0:
        _logger.warning(
            "SQLite storage %s already has %d RUNNING trial(s): if another process is still "
            "searching, SQLite is shared between processes; use PostgreSQL or MySQL for that.",
            mask_url(url),
            running_trials,
        )
        return True
    return False


def _running_trials(url: str, name: str) -> int:
    """RUNNING trials of an existing SQLite study: a sign that another process writes to it."""
    if storage_kind(url) != "sqlite":
        return 0
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return 0
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def _finish(config: RunConfig) -> dict[str, Any]:
    """``_finish_once`` through an outage window of ``[storage] outage_tolerance_s`` (the last
    trials can be told just before an outage); past it, ``StorageLost``."""
    from optuna_hpcnas.storages import OutageWindow

    url = config.study.resolved_storage()
    window = OutageWindow(url, tolerance=config.storage.outage_tolerance_s)
    try:
        return window.call(_finish_once, config)
    except StorageUnavailable as e:
        raise StorageLost(_resume_hint(f"every trial finished, but {e}")) from None


def _finish_once(config: RunConfig) -> dict[str, Any]:
    """The dashboard's plots saved in the study (when optuna-dashboard's extra is there), and
    the study's summary."""
    import optuna

    from optuna_hpcnas._summary import study_status

    url = config.study.resolved_storage()
    try:
        storage = open_storage(url, must_exist=True)
    except StorageError as e:
        raise LaunchError(str(e)) from None
    study = optuna.load_study(study_name=config.study.name, storage=storage)
    try:
        from optuna_hpcnas.dashboard import prepare_study
        from optuna_hpcnas.dashboard import save_dashboard_plots

        prepare_study(study, list(config.objective.objectives))
        save_dashboard_plots(study)
    except ImportError:
        pass
    except Exception as e:
        _raise_if_out_of_space(e, "every trial finished, but the dashboard plots were not saved")
        raise
    return study_status(study)
