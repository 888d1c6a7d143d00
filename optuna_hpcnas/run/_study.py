"""The study of a run: world rank 0 creates it and its trial budget, the other leaders load it.

The budget (``[study] n_trials``) is a set of WAITING trials without parameters that rank 0
queues first (``optuna_hpcnas._records.add_budget``), its total recorded in the study before
the first is queued; leaders pop them atomically, so the study ends with exactly ``n_trials``
new trials whatever the number of groups, and the sampler samples each of them like a new
trial. A search that was interrupted (killed, preempted, even while queuing) leaves WAITING
trials and the recorded total behind: run again or resumed (``trials_to_resume``), it finishes
those without adding new ones.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas import _records

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.distributed import Comm
    from optuna_hpcnas.distributed import EvaluationGroup
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_logger = logging.getLogger(__name__)


def _storage(url: str, config: RunConfig) -> str | optuna.storages.BaseStorage:
    """The Optuna storage of ``url`` (``optuna_hpcnas.storages.open_storage``): RDB storages
    get heartbeats and stale-trial retries from ``[checkpoints]``."""
    if url.startswith("sqlite:///:memory:"):
        return url
    from optuna_hpcnas.storages import open_storage

    c = config.checkpoints
    return open_storage(
        url,
        heartbeat_interval=c.heartbeat_interval,
        grace_period=c.grace_period,
        max_retry=c.max_retry,
        # a frozen Redis answers no call past a quarter of the tolerance: the outage window
        # then decides, and the run exits 75 within the tolerance instead of hanging
        call_timeout=call_timeout(config),
    )


def call_timeout(config: RunConfig) -> float:
    """Seconds one storage call may wait for an answer: a quarter of ``[storage]
    outage_tolerance_s`` (at least 1 s, at most ``CALL_TIMEOUT_S``)."""
    from optuna_hpcnas.storages._open import CALL_TIMEOUT_S

    return min(CALL_TIMEOUT_S, max(1.0, config.storage.outage_tolerance_s / 4))


def grace_period(config: RunConfig) -> float:
    """Seconds without heartbeat or lease renewal after which a running trial is dead."""
    c = config.checkpoints
    return float(c.grace_period or 2 * c.heartbeat_interval)


def recover_dead_trials(study: optuna.Study, config: RunConfig) -> None:
    """Fail the trials of dead workers and queue each one's retry, once: stale heartbeats
    (RDB storages), expired leases (storages without heartbeats), and trials killed before
    their first heartbeat (``optuna_hpcnas.storages.recover_expired_trials``)."""
    from optuna_hpcnas.storages import recover_expired_trials

    for number in recover_expired_trials(
        study, grace_period=grace_period(config), max_retry=config.checkpoints.max_retry
    ):
        _logger.warning("Trial %d of a dead worker was queued again.", number)


def open_study(
    config: RunConfig,
    comm: Comm,
    group: EvaluationGroup,
    *,
    resume: bool = False,
    space: HierarchicalSearchSpace | None = None,
) -> optuna.Study | None:
    """Collective over ``comm``: the study on every group leader (``None`` elsewhere).
    ``resume``: the budget is not added to (``queue_budget``). ``space``: the space searched
    (fitted to the data), which ``[study] enqueue``'s models must belong to.

    Only world rank 0 opens the storage first (an RDB storage creates its schema on first
    open, and concurrent creations collide); the other leaders open it once it exists.
    """
    import optuna

    url = config.study.resolved_storage()
    study: optuna.Study | None = None
    error: str | None = None
    if comm.Get_rank() == 0:
        try:
            study = _create(
                config,
                _storage(url, config),
                seed_offset=group.index,
                resume=resume,
                space=space,
            )
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
        storage=_storage(url, config),
        sampler=config.sampler.build(seed_offset=group.index),
        pruner=config.pruner.build(config.stages),
    )


def _create(
    config: RunConfig,
    storage: str | optuna.storages.BaseStorage,
    *,
    seed_offset: int,
    resume: bool,
    space: HierarchicalSearchSpace | None,
) -> optuna.Study:
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
    queue_budget(study, config, resume=resume, space=space)
    return study


def queue_budget(
    study: optuna.Study,
    config: RunConfig,
    *,
    resume: bool = False,
    space: HierarchicalSearchSpace | None = None,
) -> None:
    """Queue the run's budget, or resume an interrupted run's queue without adding to it.

    The budget's total is recorded in the study (``hpcnas:run:budget``) before its first trial
    is queued, so a run killed while queuing is completed to that total by the next run or
    resume, whatever was queued. A resume (``resume``) never adds beyond it.
    """
    from optuna.trial import TrialState

    recover_dead_trials(study, config)
    if _fill_budget(study) or resume:
        return
    n_trials = config.study.n_trials
    new_study = not study.get_trials(deepcopy=False)
    if n_trials is None:
        for name, params in config.enqueued_models(space) if new_study else []:
            # a timeout-only run starts with ``[study] enqueue``
            study.enqueue_trial(params, user_attrs=_reference(name))
        return
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    interrupted = len(study.get_trials(deepcopy=False)) > waiting
    if waiting and interrupted:
        _logger.info(
            "Study %r has %d trial(s) left from an interrupted run (retries included): "
            "resuming them without adding new ones.",
            study.study_name,
            waiting,
        )
        return
    new = max(0, n_trials - waiting)
    _records.record_budget(study, _records.queued_budget(study) + new)
    # A new study's first budget trials are ``[study] enqueue``'s architectures.
    fixed = config.enqueued_models(space)[:new] if new_study else []
    _records.add_budget(study, new, fixed=fixed)


def _reference(name: str | None) -> dict[str, str]:
    return {} if name is None else {_keys.OBJECTIVE_REFERENCE: name}


def _fill_budget(study: optuna.Study) -> int:
    """Queue the budget trials a run killed while queuing did not: how many."""
    total = _records.recorded_budget(study)
    missing = 0 if total is None else total - _records.queued_budget(study)
    if missing > 0:
        _logger.warning(
            "Study %r was stopped while its budget of %d trials was queued: queuing the other %d.",
            study.study_name,
            total,
            missing,
        )
        _records.add_budget(study, missing)
    return max(0, missing)


def trials_to_resume(config: RunConfig) -> int:
    """What ``hpcnas resume`` runs: the WAITING trials once the study is settled.

    First every RUNNING trial is waited for until it finishes or is found dead (at most its
    grace period, plus a margin for SQLite's whole-second clock), dead ones failed and their
    retries queued; a trial still RUNNING after that renews its heartbeat or lease (another
    worker runs it) and is not counted. Then the budget trials a kill while queuing left out
    are queued (the recorded total). So a resume never counts a dead trial as remaining, nor
    runs more than the budget.
    """
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(
        study_name=config.study.name, storage=_storage(config.study.resolved_storage(), config)
    )
    deadline = time.monotonic() + grace_period(config) + 2.0
    waited = False
    while True:
        recover_dead_trials(study, config)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running or time.monotonic() >= deadline:
            break
        if not waited:
            _logger.info(
                "Waiting up to %.0f s for %d RUNNING trial(s) to finish or be found dead "
                "before counting what is left.",
                deadline - time.monotonic(),
                len(running),
            )
            waited = True
        time.sleep(0.5)
    if running:
        _logger.warning(
            "%d trial(s) of study %r are still RUNNING with a live heartbeat or lease: another "
            "worker runs them; they are not resumed.",
            len(running),
            study.study_name,
        )
    _fill_budget(study)
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
