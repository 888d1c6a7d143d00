"""``run_search``: the composition root of ``hpcnas run``, in one process or on every MPI rank.

It only wires parts that live elsewhere::

    threads per process -> evaluation groups (node-local first) -> the data and the
    evaluation core (SupernetObjective, exactly as the Python API builds it)
    -> the study and its budget (world rank 0) -> the leader's StudyCalls and LeaderQueue
    -> checkpoint restore, else the k-path supernet warm-up (leaders) -> weight averaging
    between groups -> GroupLoop -> final checkpoint, averaging rounds, per-rank utilisation
    stored in the study
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from optuna_hpcnas._threads import configure_threads
from optuna_hpcnas.distributed import form_groups
from optuna_hpcnas.distributed import GroupChannel
from optuna_hpcnas.distributed import UtilisationTracker
from optuna_hpcnas.distributed._groups import world_comm
from optuna_hpcnas.distributed._utilisation import format_table
from optuna_hpcnas.run._calls import StudyCalls
from optuna_hpcnas.run._loop import GroupLoop
from optuna_hpcnas.run._loop import LoopHooks
from optuna_hpcnas.run._queue import LeaderQueue
from optuna_hpcnas.run._setup import agreed
from optuna_hpcnas.run._study import open_study
from optuna_hpcnas.storages import quiet_disconnect_warnings

if TYPE_CHECKING:
    from optuna_hpcnas.checkpoints import PreemptionGuard
    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.data import TaskData
    from optuna_hpcnas.distributed import Comm
    from optuna_hpcnas.distributed import DistributedConfig
    from optuna_hpcnas.distributed import EvaluationGroup
    from optuna_hpcnas.distributed._averaging import ParameterAverager
    from optuna_hpcnas.evaluation import SupernetObjective
    from optuna_hpcnas.metrics import SearchMetrics
    from optuna_hpcnas.run._checkpointing import SupernetCheckpoints
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_logger = logging.getLogger(__name__)


def resolve_device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def group_size(config: DistributedConfig, space: HierarchicalSearchSpace) -> int:
    """``[distributed] group_size``, or (0) the largest layout of the space."""
    if config.group_size:
        return int(config.group_size)
    d = space.to_dict()
    largest = max(d["data_parallel"]) * max(d["pipeline_stages"])
    return min(largest, space.max_ranks) if space.max_ranks is not None else largest


def build_objective(
    config: RunConfig, space: HierarchicalSearchSpace, data: TaskData, device: str
) -> SupernetObjective:
    """The evaluation core of a run: the ``SupernetObjective`` the Python API would build
    from the same ``[training]``, ``[objective]`` and ``[stages]`` tables."""
    from optuna_hpcnas.evaluation import SupernetObjective

    return SupernetObjective(
        space,
        data,
        training=config.training.supernet,
        plan=config.stages,
        config=config.objective,
        device=device,
        seed=config.training.supernet.seed,
        threads=None,  # each rank set its share of the node (run_search)
    )


def run_search(
    config: RunConfig,
    *,
    comm: Comm | None = None,
    metrics: SearchMetrics | None = None,
    data: TaskData | None = None,
    resume: bool = False,
) -> None:
    """Run the search a ``RunConfig`` describes on every rank of ``comm``.

    With one process (``comm=None`` and no MPI launch) this is a plain single-process search.
    Under ``mpirun -n N python -m mpi4py -m optuna_hpcnas run --config nas.toml`` every rank
    calls it; ranks form evaluation groups of ``[distributed] group_size`` and only group
    leaders touch the storage. Every trial is evaluated by the same core as
    ``SupernetObjective`` (the Python API): the same seed, architecture and settings give the
    same validation metric through the API, one process, or a group.

    Fault tolerance: on an RDB storage every running trial sends heartbeats
    (``[checkpoints] heartbeat_interval``); when the search is started again, trials silent
    for ``grace_period`` are failed and re-queued and the interrupted budget is resumed. With
    ``[checkpoints] enabled`` the supernet is checkpointed into the study's database and
    restored at start, and SIGTERM/SIGUSR1 checkpoint at once, re-queue the running trial and
    exit within ``exit_deadline`` seconds. ``data``: the ``[data]`` task if the caller loaded
    it already (``hpcnas run`` does, before it touches the storage). ``resume``: run what the
    study has left (``hpcnas resume``), never adding to its budget.
    """
    comm = comm if comm is not None else world_comm()
    tracker = UtilisationTracker()
    space = config.space.build()
    group = form_groups(comm, group_size(config.distributed, space))
    # only layouts every group can run: no trial is spent on one that cannot
    space = space.fitting(min(group.sizes))
    try:
        with quiet_disconnect_warnings():  # an outage is said once, by the OutageWindow
            _run(config, comm, group, space, tracker, metrics, data, resume)
    finally:
        group.free()


def _run(
    config: RunConfig,
    comm: Comm,
    group: EvaluationGroup,
    space: HierarchicalSearchSpace,
    tracker: UtilisationTracker,
    metrics: SearchMetrics | None,
    data: TaskData | None,
    resume: bool,
) -> None:
    from optuna_hpcnas.distributed._group_engine import GroupEngine

    device = _compute_device(config, comm, group)
    with tracker.track("setup"):
        task = data if data is not None else config.data.load()
        objective = agreed(
            comm,
            "cannot build the search for this data",
            lambda: build_objective(config, space, task, device),
        )
    space = objective.space  # without what the data's shape rules out
    with tracker.track("storage"):
        study = open_study(config, comm, group, resume=resume, space=space)
    calls = StudyCalls(study, config) if study is not None else None  # leaders
    checkpoints = _checkpoints(config, comm, group, calls, objective)
    queue = None
    if calls is not None:
        queue = LeaderQueue(
            calls,
            config=config,
            space=space,
            group=group,
            tracker=tracker,
            observe_ask=metrics.observe_ask if metrics is not None else None,
            cost=objective.core.predicted_flops,
        )
        queue.prefetch()  # asking ahead: the first ask overlaps the warm-up
    try:
        with tracker.track("compute"):
            agreed(
                comm,
                "the supernet warm-up failed",
                lambda: (
                    _warm_up(config, objective, checkpoints, comm.Get_rank())
                    if calls is not None
                    else None
                ),
            )
        averager = _averager(config, group, objective, tracker)
        batch = objective.core.batch_size  # "auto" resolved for the data
        engine = GroupEngine(group, config.distributed, device, batch_size=batch)
        guard = _guard(config, comm, group, calls, checkpoints, queue)
    except BaseException:  # the prefetched trial goes back, its keep-alive stops
        if queue is not None:
            queue.close()
        raise
    timeout = config.study.timeout
    if calls is not None and timeout is not None and config.objective.mode == "one-shot":
        calls.finalists_from = time.monotonic() + timeout * (1 - config.objective.finalists_share)
    loop = GroupLoop(
        group=group,
        channel=GroupChannel(group.comm, group_index=group.index),
        core=objective.core,
        engine=engine,
        tracker=tracker,
        queue=queue,
        hooks=_hooks(tracker, guard, averager, checkpoints, metrics),
        timeout=config.study.timeout,
    )
    # signal handlers can only be installed from the main thread
    in_main = threading.current_thread() is threading.main_thread()
    try:
        with guard if in_main else contextlib.nullcontext(guard):
            loop.run()
        _finish_training(tracker, checkpoints, averager)
    finally:
        engine.close()
    _store_utilisation(comm, group, calls, tracker, queue, averager)


def _compute_device(config: RunConfig, comm: Comm, group: EvaluationGroup) -> str:
    """This process's share of the cores, and its device (one GPU per rank of a node)."""
    configure_threads(
        requested=config.training.threads,
        ranks_on_node=group.context.local_size,
        rank=comm.Get_rank(),
    )
    device = resolve_device(config.training.device)
    if device == "cuda":
        import torch

        torch.cuda.set_device(group.context.local_rank % torch.cuda.device_count())
    return device


def _checkpoints(
    config: RunConfig,
    comm: Comm,
    group: EvaluationGroup,
    calls: StudyCalls | None,
    objective: SupernetObjective,
) -> SupernetCheckpoints | None:
    if calls is None or not config.checkpoints.enabled:
        return None
    from optuna_hpcnas.run._checkpointing import SupernetCheckpoints

    return SupernetCheckpoints(
        calls,
        objective.trainer,
        config.checkpoints,
        group=group.index,
        generations=comm.Get_rank() == 0,
    )


def _warm_up(
    config: RunConfig,
    objective: SupernetObjective,
    checkpoints: SupernetCheckpoints | None,
    rank: int,
) -> None:
    """Restore the newest supernet checkpoint, or train the shared weights (k paths)."""
    if checkpoints is not None and checkpoints.restore():
        return
    supernet = config.training.supernet
    if supernet.epochs == 0:
        return
    start = time.perf_counter()
    losses = objective.train_supernet(max_batches=config.training.warmup_max_batches)
    if rank == 0 and losses:
        _logger.info(
            "Supernet warm-up: %d epoch(s) x %d path(s) per batch in %.1f s (loss %.3f -> %.3f).",
            supernet.epochs,
            supernet.paths_per_batch,
            time.perf_counter() - start,
            losses[0],
            losses[-1],
        )
    if checkpoints is not None:
        checkpoints.save()


def _averager(
    config: RunConfig,
    group: EvaluationGroup,
    objective: SupernetObjective,
    tracker: UtilisationTracker,
) -> ParameterAverager | None:
    """Averaging of the shared supernet weights between groups (leaders; several groups)."""
    d = config.distributed
    if not (group.is_leader and group.num_groups > 1 and d.sync_interval > 0):
        return None
    from optuna_hpcnas.distributed._averaging import broadcast_tensors
    from optuna_hpcnas.distributed._averaging import ParameterAverager

    supernet = objective.supernet
    shared = [p.data for p in supernet.parameters()]
    shared += [b for b in supernet.buffers() if b.is_floating_point()]
    with tracker.track("communication"):
        broadcast_tensors(group.leaders, shared)
    return ParameterAverager(
        group,
        shared,
        interval=d.sync_interval,
        compression=d.compression,
        powersgd_rank=d.powersgd_rank,
        seed=config.training.supernet.seed,
    )


def _guard(
    config: RunConfig,
    comm: Comm,
    group: EvaluationGroup,
    calls: StudyCalls | None,
    checkpoints: SupernetCheckpoints | None,
    queue: LeaderQueue | None,
) -> PreemptionGuard:
    """SIGINT (Ctrl-C), SIGTERM, SIGUSR1: checkpoint, fail the leader's running trial and
    queue its retry; on several ranks, a signal one rank got stops every group (collective:
    every rank). A forced exit writes the leader's one-shot batch told and not written."""
    from optuna_hpcnas.checkpoints import PreemptionGuard

    peers = None
    if comm.Get_size() > 1:
        from optuna_hpcnas.distributed._stop import JobStop

        peers = JobStop(comm, group)
    save = checkpoints.save if checkpoints is not None else None
    requeue = calls.requeue if calls is not None else None
    batches = queue.batches if queue is not None else None
    return PreemptionGuard.from_config(
        config.checkpoints,
        checkpoint=save,
        requeue=requeue,
        peers=peers,
        signals=("SIGINT", "SIGTERM", "SIGUSR1"),
        before_exit=batches.flush if batches is not None else None,
    )


def _hooks(
    tracker: UtilisationTracker,
    guard: PreemptionGuard,
    averager: ParameterAverager | None,
    checkpoints: SupernetCheckpoints | None,
    metrics: SearchMetrics | None,
) -> LoopHooks:
    """Signals and averaging after every step; averaging and checkpoints after a trial."""

    def on_step() -> None:
        if averager is not None:
            averager.poll()
        guard.check()

    def after_trial(trial_id: int) -> None:
        if averager is not None:
            with tracker.track("communication"):
                averager.trial_finished()
        if checkpoints is not None:
            with tracker.track("storage"):
                before = checkpoints.bytes_written
                checkpoints.after_trial(trial_id)
                if metrics is not None and checkpoints.bytes_written > before:
                    metrics.add_checkpoint_bytes(checkpoints.bytes_written - before)

    return LoopHooks(
        on_step=on_step,
        after_trial=after_trial,
        reads_told_trial=checkpoints is not None,  # the policy reads the told trial
        watch=guard.watch,
    )


def _finish_training(
    tracker: UtilisationTracker,
    checkpoints: SupernetCheckpoints | None,
    averager: ParameterAverager | None,
) -> None:
    """The last checkpoint, then the last averaging rounds (waiting for the other groups)."""
    if checkpoints is not None:
        with tracker.track("storage"):
            checkpoints.finish()
    if averager is not None:
        with tracker.track("drain"):  # waiting for the last group to finish its trial
            target = averager.agree_rounds()
        with tracker.track("communication"):
            averager.finish(target)


def _store_utilisation(
    comm: Comm,
    group: EvaluationGroup,
    calls: StudyCalls | None,
    tracker: UtilisationTracker,
    queue: LeaderQueue | None,
    averager: ParameterAverager | None,
) -> None:
    """Gather every rank's time shares on world rank 0 and store them in the study."""
    tracker.stop()
    report = tracker.report(
        rank=comm.Get_rank(),
        group=group.index,
        leader=group.is_leader,
        trials=queue.trials_done if queue is not None else 0,
        infeasible=queue.trials_infeasible if queue is not None else 0,
        storage_thread=queue.storage_thread_seconds if queue is not None else {},
        sync_bytes=averager.bytes_sent if averager is not None else 0,
        sync_rounds=averager.rounds_done if averager is not None else 0,
    )
    reports = comm.gather(report, root=0)  # after tracker.stop(): not counted
    if comm.Get_rank() != 0:
        return
    assert calls is not None and reports is not None
    _logger.info("Utilisation per rank:\n%s", format_table(reports))
    calls.store_utilisation([r.to_dict() for r in reports])
