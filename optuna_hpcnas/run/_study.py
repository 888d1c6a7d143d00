"""The study of a run: world rank 0 creates it and its trial budget, the other leaders load it.

The budget (``[study] n_trials``) is a set of WAITING trials without parameters that rank 0
queues first (``optuna_hpcnas._records.add_budget``); leaders pop them atomically, so the study
ends with exactly ``n_trials`` new trials whatever the number of groups, and the sampler
samples each of them like a new trial. A search that was interrupted (killed, preempted)
leaves WAITING trials behind: run again, it finishes those without adding new ones.
"""

from __future__ import annotations

import logging
from typing import Any
from typing import TYPE_CHECKING
import warnings

from optuna_hpcnas import _records

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.distributed import EvaluationGroup

_logger = logging.getLogger(__name__)


def open_storage(url: str, config: RunConfig) -> Any:
    """The Optuna storage of ``url``: RDB storages get heartbeats (and stale-trial retries)."""
    if url.startswith("sqlite:///:memory:"):
        return url
    from optuna_hpcnas.checkpoints import heartbeat_storage

    return heartbeat_storage(url, config.checkpoints)


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail (and re-queue) trials whose worker stopped sending heartbeats."""
    import optuna

    if not _records.has_heartbeat(study._storage):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def open_study(config: RunConfig, comm: Any, group: EvaluationGroup) -> Any:
    """Collective over ``comm``: the study on every group leader (``None`` elsewhere).

    Only world rank 0 opens the storage first (an RDB storage creates its schema on first
    open, and concurrent creations collide); the other leaders open it once it exists.
    """
    import optuna

    url = config.study.resolved_storage()
    study: optuna.Study | None = None
    error: str | None = None
    if comm.Get_rank() == 0:
        try:
            study = _create(config, open_storage(url, config), seed_offset=group.index)
        except Exception as e:  # every rank must learn it, or they wait forever
            error = f"{type(e).__name__}: {e}"
            raise
        finally:
            comm.bcast(error, root=0)
        return study
    error = comm.bcast(None, root=0)
    if error is not None:
        raise RuntimeError(f"World rank 0 could not open the study: {error}")
    if not group.is_leader:
        return None
    return optuna.load_study(
        study_name=config.study.name,
        storage=open_storage(url, config),
        sampler=config.sampler.build(seed_offset=group.index),
        pruner=config.pruner.build(config.stages),
    )


def _create(config: RunConfig, storage: Any, *, seed_offset: int) -> optuna.Study:
    import optuna

    study = optuna.create_study(
        study_name=config.study.name,
        storage=storage,
        directions=config.directions,  # type: ignore[arg-type]
        sampler=config.sampler.build(seed_offset=seed_offset),
        pruner=config.pruner.build(config.stages),
        load_if_exists=config.study.load_if_exists,
    )
    if len(config.directions) > 1 or config.objective.objectives != ("accuracy",):
        study.set_metric_names(list(config.objective.objectives))
    _records.record_run_data(study, config.data.to_dict())
    add_budget(study, config.study.n_trials)
    return study


def add_budget(study: optuna.Study, n_trials: int | None) -> None:
    """Queue the run's budget, or resume an interrupted run's queue without adding to it."""
    from optuna.trial import TrialState

    fail_stale_trials(study)
    if n_trials is None:
        return
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    interrupted = (
        _records.has_heartbeat(study._storage) and len(study.get_trials(deepcopy=False)) > waiting
    )
    if waiting and interrupted:
        _logger.info(
            "Study %r has %d trial(s) left from an interrupted run (retries included): "
            "resuming them without adding new ones.",
            study.study_name,
            waiting,
        )
        return
    _records.add_budget(study, max(0, n_trials - waiting))
