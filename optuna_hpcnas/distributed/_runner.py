"""``run_search``: the search loop every rank of an MPI job runs (and one process alone).

Flow per rank::

    form_groups (node-local first)  ->  world rank 0 creates the study and the trial budget
    leader: pull next trial (ask + suggest) -> infeasible layout? constraint, tell, pull again
          -> share TrialTask with the group
    group:  torch world of dp x pp ranks -> supernet steps (leader) -> engine fine-tunes the
            candidate's layers -> each epoch: leader scores, reports, shares the prune decision
    leader: tell -> every `sync_interval` trials, start an asynchronous hierarchical average
            of the supernet weights between groups
    end:    finish averaging rounds, gather utilisation on rank 0, store it in the study

The trial budget (``n_trials``) is a set of WAITING trials that world rank 0 enqueues first;
leaders pop them atomically through the storage, so two groups never take the same trial and
the study ends with exactly ``n_trials`` new trials, whatever the number of groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
import contextlib
from contextlib import contextmanager
import json
import logging
import math
import threading
import time
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas.distributed._groups import EvaluationGroup
from optuna_hpcnas.distributed._groups import form_groups
from optuna_hpcnas.distributed._groups import world_comm
from optuna_hpcnas.distributed._protocol import GroupChannel
from optuna_hpcnas.distributed._protocol import Stop
from optuna_hpcnas.distributed._protocol import TrialTask
from optuna_hpcnas.distributed._scheduler import DynamicScheduler
from optuna_hpcnas.distributed._scheduler import Task
from optuna_hpcnas.distributed._utilisation import format_table
from optuna_hpcnas.distributed._utilisation import RankUtilisation
from optuna_hpcnas.distributed._utilisation import UtilisationTracker

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna
    from torch import nn

    from optuna_hpcnas.checkpoints import CheckpointPolicy
    from optuna_hpcnas.checkpoints import PreemptionGuard
    from optuna_hpcnas.config import RunConfig
    from optuna_hpcnas.distributed._evaluator import GroupEvaluator
    from optuna_hpcnas.metrics import SearchMetrics
    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_logger = logging.getLogger(__name__)


def _resolve_device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _group_size(config: Any, space: HierarchicalSearchSpace) -> int:
    """``[distributed] group_size``, or (0) the largest layout of the space."""
    if config.group_size:
        return int(config.group_size)
    d = space.to_dict()
    largest = max(d["data_parallel"]) * max(d["pipeline_stages"])
    return min(largest, space.max_ranks) if space.max_ranks is not None else largest


def run_search(
    config: RunConfig,
    *,
    comm: Any = None,
    evaluator_factory: Callable[[RunConfig, HierarchicalSearchSpace, str], GroupEvaluator]
    | None = None,
    metrics: SearchMetrics | None = None,
) -> None:
    """Run the search a ``RunConfig`` describes on every rank of ``comm``.

    With one process (``comm=None`` and no MPI launch) this is a plain single-process search.
    Under ``mpirun -n N python -m mpi4py -m optuna_hpcnas run --config nas.toml`` every rank
    calls it; ranks form evaluation groups of ``[distributed] group_size`` and only group
    leaders touch the storage.

    Args:
        config: The run configuration (``optuna_hpcnas.config.load_config``).
        comm: An mpi4py communicator; ``MPI.COMM_WORLD`` (or one process) by default.
        evaluator_factory: Builds the ``GroupEvaluator`` on every rank; the supernet one
            from ``[data]``/``[training]`` by default.
        metrics: ``SearchMetrics`` that get the checkpoint bytes written and the sampler's
            seconds per trial (world rank 0).

    Fault tolerance: on an RDB storage every running trial sends heartbeats
    (``[checkpoints] heartbeat_interval``); when the search is started again, trials silent
    for ``grace_period`` are failed and re-queued (``RetryHeartbeatStaleTrialCallback``)
    and the interrupted budget is resumed. With ``[checkpoints] enabled`` world rank 0 saves
    the supernet (weights, optimizer, RNG, step and trial counters) into the study's
    database every ``every_n_steps`` supernet steps, every leader restores the newest valid
    checkpoint at start, and SIGTERM/SIGUSR1 checkpoint at once, re-queue the running trial
    and exit within ``exit_deadline`` seconds (``PreemptionGuard``).
    """
    comm = comm if comm is not None else world_comm()
    runner = _Runner(config, comm, evaluator_factory, metrics)
    try:
        runner.run()
    finally:
        runner.close()


class _Runner:
    def __init__(
        self,
        config: RunConfig,
        comm: Any,
        evaluator_factory: Callable[..., GroupEvaluator] | None,
        metrics: SearchMetrics | None = None,
    ) -> None:
        self.config = config
        self.ccfg = config.checkpoints
        self.metrics = metrics
        self.policy: CheckpointPolicy | None = None
        self.guard: PreemptionGuard | None = None
        self._heartbeat = False
        self.supernet_steps = 0  # cumulative, restored from the checkpoint
        self._saved_step = 0
        self.dcfg = config.distributed
        self.comm = comm
        self.tracker = UtilisationTracker()
        self._factory = evaluator_factory
        self.group: EvaluationGroup | None = None
        self.world: Any = None
        self.study: optuna.Study | None = None
        self.averager: Any = None
        self.trials_done = 0
        self.trials_infeasible = 0
        self._current: tuple[Any, Any] | None = None
        self._best: tuple[float, dict[str, float]] | None = None
        self._reached: tuple[int, str | None] = (0, None)
        self._last_told = -1

    # ------------------------------------------------------------------ setup
    def run(self) -> None:
        with self.tracker.track("setup"):
            import torch

        storage = self.config.study.resolved_storage()
        if storage is None and self.comm.Get_size() > 1:
            from optuna_hpcnas.config import ConfigError

            raise ConfigError(
                "[study] storage is not set (nor OPTUNA_STORAGE): several ranks need a shared "
                "storage, e.g. storage = 'sqlite:///nas.db' or a PostgreSQL URL."
            )
        with self.tracker.track("setup"):
            self.space = self.config.space.build()
        with self.tracker.track("communication"):
            self.group = group = form_groups(self.comm, _group_size(self.dcfg, self.space))
        self.channel = GroupChannel(group.comm, group_index=group.index)
        self.device = _resolve_device(self.config.training.device)
        if self.device == "cuda":
            # one GPU per rank of a node (LOCAL_RANK of the torch world says the same)
            torch.cuda.set_device(group.context.local_rank % torch.cuda.device_count())
        torch.manual_seed(self.config.training.seed)
        with self.tracker.track("setup"):
            if self._factory is not None:
                self.evaluator = self._factory(self.config, self.space, self.device)
            else:
                from optuna_hpcnas.distributed._evaluator import default_evaluator

                self.evaluator = default_evaluator(self.config, self.space, self.device)
        from optuna_hpcnas.distributed._engine import TorchWorld

        self.world = TorchWorld(group, self.dcfg, self.device)
        self._open_study(storage)
        if storage is not None and self.ccfg.enabled:
            self._setup_checkpoints()
        if group.is_leader and group.num_groups > 1 and self.dcfg.sync_interval > 0:
            from optuna_hpcnas.distributed._averaging import ParameterAverager

            with self.tracker.track("communication"):
                _broadcast_tensors(group.leaders, self.evaluator.shared_tensors())
            self.averager = ParameterAverager(
                group,
                self.evaluator.shared_tensors(),
                interval=self.dcfg.sync_interval,
                compression=self.dcfg.compression,
                powersgd_rank=self.dcfg.powersgd_rank,
                seed=self.config.training.seed,
            )
        self._start = time.monotonic()
        if group.is_leader:
            self.scheduler = DynamicScheduler(
                num_groups=1,
                source=self._pull,
                cost_aware=self.dcfg.scheduler == "cost_aware",
                lookahead=self.dcfg.lookahead if self.dcfg.scheduler == "cost_aware" else 1,
            )
        self._loop_started = time.perf_counter()
        from optuna_hpcnas.checkpoints import PreemptionGuard

        save = self._checkpoint_now if self.policy is not None else None
        self.guard = PreemptionGuard.from_config(self.ccfg, checkpoint=save)
        # signal handlers can only be installed from the main thread
        in_main = threading.current_thread() is threading.main_thread()
        with self.guard if in_main else contextlib.nullcontext(self.guard):
            self._loop()
            if self.policy is not None and self.supernet_steps > self._saved_step:
                self._checkpoint_now()  # the last trials' steps
        if self.averager is not None:
            with self.tracker.track("idle"):  # waiting for the last group to finish its trial
                target = self.averager.agree_rounds()
            with self.tracker.track("communication"):
                self.averager.finish(target)
        self._finish()

    def close(self) -> None:
        if self.world is not None:
            self.world.close()
        if self.group is not None:
            self.group.free()
            self.group = None

    def _open_study(self, storage: str | None) -> None:
        """World rank 0 creates the study and the budget; then the other leaders load it."""
        import optuna

        assert self.group is not None
        cfg = self.config
        error: str | None = None
        if self.comm.Get_rank() == 0:
            try:
                with self.tracker.track("storage"):
                    self.study = optuna.create_study(
                        study_name=cfg.study.name,
                        storage=self._storage(storage),
                        directions=list(cfg.study.directions),  # type: ignore[arg-type]
                        sampler=cfg.sampler.build(seed_offset=0),
                        pruner=cfg.pruner.build(),
                        load_if_exists=cfg.study.load_if_exists,
                    )
                    if len(cfg.study.directions) > 1 or cfg.objective.metrics != ("accuracy",):
                        self.study.set_metric_names(list(cfg.objective.metrics))
                    self._enqueue_budget()
            except Exception as e:  # every rank must learn it, or they wait forever
                error = f"{type(e).__name__}: {e}"
                raise
            finally:
                self.comm.bcast(error, root=0)
        else:
            with self.tracker.track("idle"):  # rank 0 creates the study and the budget
                error = self.comm.bcast(None, root=0)
            if error is not None:
                raise RuntimeError(f"World rank 0 could not open the study: {error}")
            if self.group.is_leader:
                with self.tracker.track("storage"):
                    assert storage is not None  # several ranks: checked in run()
                    self.study = optuna.load_study(
                        study_name=cfg.study.name,
                        storage=self._storage(storage),
                        sampler=cfg.sampler.build(seed_offset=self.group.index),
                        pruner=cfg.pruner.build(),
                    )

    def _storage(self, url: str | None) -> Any:
        """An RDB storage with heartbeats (and stale-trial retries) for a URL."""
        if url is None or url == "sqlite:///:memory:":
            return url
        from optuna_hpcnas.checkpoints import heartbeat_storage

        self._heartbeat = True
        return heartbeat_storage(url, self.ccfg)

    def _fail_stale_trials(self) -> None:
        """Fail (and re-queue) trials whose worker stopped sending heartbeats."""
        import warnings

        import optuna

        assert self.study is not None
        if not self._heartbeat:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def _enqueue_budget(self) -> None:
        import optuna

        assert self.study is not None
        n = self.config.study.n_trials
        self._fail_stale_trials()
        if n is None:
            return
        waiting = len(
            self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        )
        if waiting and self._heartbeat and len(self.study.get_trials(deepcopy=False)) > waiting:
            # An interrupted search (killed, preempted): finish its budget, add none.
            _logger.info(
                "Study %r has %d trial(s) left from an interrupted run (retries included): "
                "resuming them without adding new ones.",
                self.study.study_name,
                waiting,
            )
            return
        for _ in range(max(0, n - waiting)):
            self.study.enqueue_trial({}, skip_if_exists=False)

    # ------------------------------------------------------------------ checkpoints
    def _setup_checkpoints(self) -> None:
        """Leaders restore the newest supernet checkpoint; world rank 0 owns the chain."""
        from optuna_hpcnas.checkpoints import CheckpointPolicy
        from optuna_hpcnas.checkpoints import RDBArtifactStore
        from optuna_hpcnas.checkpoints import restore_training_state

        assert self.group is not None
        if not self.group.is_leader:
            return
        assert self.study is not None
        store = RDBArtifactStore(
            self.study._storage,  # type: ignore[arg-type]  # the cached RDBStorage
            chunk_bytes=self.ccfg.chunk_bytes,
        )
        policy = CheckpointPolicy(
            study=self.study,
            artifact_store=store,
            architecture_state=self._architecture_state,
            config=self.ccfg,
        )
        with self.tracker.track("storage"):
            latest = policy.supernet.load_latest()
        if latest is None:
            _logger.info("No supernet checkpoint in the study yet: starting from initial weights.")
        else:
            model, optimizer = self._supernet_parts()
            meta = restore_training_state(latest, model, optimizer)
            self.supernet_steps = self._saved_step = int(meta.get("supernet_steps", latest.step))
            _logger.info(
                "Restored the supernet from checkpoint %s (step %d, %d trial(s) finished "
                "when saved).",
                latest.info.checkpoint_id,
                latest.step,
                int(meta.get("trials_finished", 0)),
            )
        if self.comm.Get_rank() == 0:
            self.policy = policy

    def _supernet_parts(self) -> tuple[nn.Module, Any]:
        from optuna_hpcnas.checkpoints import CheckpointError

        model = getattr(self.evaluator, "supernet", None)
        if model is None:
            raise CheckpointError(
                f"[checkpoints] enabled needs an evaluator with a `supernet` module; "
                f"{type(self.evaluator).__name__} has none."
            )
        return model, getattr(self.evaluator, "_optimizer", None)

    def _supernet_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        import optuna

        from optuna_hpcnas.checkpoints import training_state

        assert self.study is not None
        model, optimizer = self._supernet_parts()
        finished = len(
            self.study.get_trials(
                deepcopy=False,
                states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED),
            )
        )
        return training_state(
            model,
            optimizer,
            extra={"supernet_steps": self.supernet_steps, "trials_finished": finished},
        )

    def _checkpoint_now(self) -> None:
        """Save the supernet at once (world rank 0; also on SIGTERM/SIGUSR1)."""
        if self.policy is None:
            return
        with self.tracker.track("storage"):
            tensors, metadata = self._supernet_state()
            info = self.policy.supernet.save(tensors, step=self.supernet_steps, metadata=metadata)
        self._saved_step = self.supernet_steps
        if self.metrics is not None:
            self.metrics.add_checkpoint_bytes(info.size)
        _logger.info(
            "Saved supernet checkpoint %s (step %d, %s, %d bytes).",
            info.checkpoint_id,
            info.step,
            info.kind,
            info.size,
        )

    def _maybe_checkpoint(self) -> None:
        """Every ``every_n_steps`` supernet steps (checked at trial boundaries)."""
        if self.policy is None:
            return
        if self.supernet_steps - self._saved_step >= self.ccfg.every_n_steps:
            self._checkpoint_now()

    def _architecture_state(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        """The inherited weights of one trial's path (the top-k states of a generation)."""
        from optuna_hpcnas.search_space import Architecture

        text = trial.user_attrs.get(_keys.OBJECTIVE_ARCH)
        if not isinstance(text, str):
            return {}
        layers = self.evaluator.layers(Architecture.from_json(text))
        return {
            f"layer{i}.{k}": v.detach().cpu()
            for i, layer in enumerate(layers)
            for k, v in layer.state_dict().items()
        }

    # ------------------------------------------------------------------ leader: pulling work
    def _timed_out(self) -> bool:
        timeout = self.config.study.timeout
        return timeout is not None and time.monotonic() - self._start >= timeout

    def _pop(self) -> optuna.trial.Trial | None:
        import optuna

        assert self.study is not None
        if self._timed_out():
            return None
        with self.tracker.track("storage"):
            self._fail_stale_trials()
            if self.config.study.n_trials is None:
                return self.study.ask()
            # as study.ask does: let the sampler see trials other groups finished meanwhile
            self.study._thread_local.cached_all_trials = None
            with _sqlite_pop_lock(self.config.study.resolved_storage()):
                trial_id = self.study._pop_waiting_trial_id()
            if trial_id is None:
                return None
            return optuna.trial.Trial(self.study, trial_id)

    def _pull(self) -> Task | None:
        """The scheduler's source: the next feasible trial of the study (leader only)."""
        assert self.group is not None
        while True:
            trial = self._pop()
            if trial is None:
                return None
            started = time.perf_counter()
            with self.tracker.track("sampler"):
                arch = self.space.suggest(trial)
            if self.metrics is not None:
                self.metrics.observe_ask(time.perf_counter() - started)
            excess = arch.cluster.ranks - self.group.size
            if excess > 0:
                self._tell_infeasible(trial, arch, excess)
                continue
            cost = 0.0
            if self.dcfg.scheduler == "cost_aware":
                with self.tracker.track("sampler"):
                    cost = self.evaluator.predicted_cost(arch)
            return Task(key=(trial, arch), cost=cost, submitted=time.monotonic())

    def _tell_infeasible(self, trial: optuna.trial.Trial, arch: Architecture, excess: int) -> None:
        """``dp x pp`` exceeds the group: a constraint > 0 and the worst values, no training."""
        import optuna

        assert self.study is not None and self.group is not None
        reason = (
            f"data_parallel x pipeline_stages = {arch.cluster.ranks} exceeds the "
            f"{self.group.size} ranks of evaluation group {self.group.index}"
        )
        with self.tracker.track("storage"):
            key = f"constraints:{_keys.CLUSTER_RANKS_CONSTRAINT}"
            # the space records the same constraint itself when it knows max_ranks
            if key not in trial.storage.get_trial_system_attrs(trial._trial_id):
                trial.set_constraint(_keys.CLUSTER_RANKS_CONSTRAINT, float(excess))
            trial.set_user_attr(_keys.OBJECTIVE_ARCH, arch.to_json())
            trial.set_user_attr(_keys.OBJECTIVE_ARCH_DESCRIPTION, arch.describe())
            trial.storage.set_trial_system_attr(
                trial._trial_id, _keys.DISTRIBUTED_INFEASIBLE, reason
            )
            worst = [
                -math.inf if d == "maximize" else math.inf for d in self.config.study.directions
            ]
            self.study.tell(trial, worst, state=optuna.trial.TrialState.COMPLETE)
        self.trials_infeasible += 1
        _logger.info("Trial %d infeasible: %s.", trial.number, reason)

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        assert self.group is not None
        group, channel = self.group, self.channel
        while True:
            message: Any = None
            if group.is_leader:
                with channel.leader_section("while asking for the next trial"):
                    # storage and sampler time are tracked inside the scheduler's source
                    task = self.scheduler.next_task(0, time.monotonic())
                message = Stop() if task is None else self._task_message(task)
                if task is not None:
                    self._current = task.key
            with self.tracker.track("idle"):
                message = channel.share(message)
            if isinstance(message, Stop):
                return
            with self._trial_heartbeat():
                self._evaluate(message)
            self._check_signal()

    def _check_signal(self) -> None:
        if self.guard is not None:
            self.guard.check()

    @contextmanager
    def _trial_heartbeat(self) -> Iterator[None]:
        """Leaders: heartbeats for the running trial, which a signal re-queues."""
        if self._current is None or self.study is None:
            yield
            return
        from optuna.storages._heartbeat import get_heartbeat_thread

        trial = self._current[0]
        assert self.guard is not None
        with get_heartbeat_thread(trial._trial_id, self.study._storage):
            with self.guard.watch(trial):
                yield

    def _task_message(self, task: Task) -> TrialTask:
        trial, arch = task.key
        c = arch.cluster
        return TrialTask(
            trial_number=trial.number,
            architecture=arch.to_json(),
            data_parallel=c.data_parallel,
            pipeline_stages=c.pipeline_stages,
            micro_batch_size=c.micro_batch_size,
            seed=self.config.training.seed + trial.number,
        )

    def _evaluate(self, msg: TrialTask) -> None:
        from optuna_hpcnas.distributed._engine import build_engine
        from optuna_hpcnas.search_space import Architecture

        assert self.group is not None
        group, channel, tcfg = self.group, self.channel, self.config.training
        arch = Architecture.from_json(msg.architecture)
        dp, pp = msg.data_parallel, msg.pipeline_stages
        members = dp * pp
        use_world = members > 1 or self.dcfg.engine == "deepspeed"
        with self.tracker.track("setup"):
            active = self.world.ensure(members) if use_world else group.is_leader
        if group.is_leader:
            with channel.leader_section("training the supernet"), self.tracker.track("compute"):
                self.evaluator.supernet_step(
                    arch,
                    steps=tcfg.supernet_steps,
                    batch_size=msg.micro_batch_size,
                    seed=msg.seed,
                )
            self.supernet_steps += tcfg.supernet_steps
            self._check_signal()
        engine = None
        layers: list[nn.Module] = []
        schedule = self._schedule
        if active:
            with self.tracker.track("setup"):
                layers = self.evaluator.layers(arch)
            if members > 1:
                with self.tracker.track("communication"):
                    _broadcast_layers(layers, [0] * len(layers))
            with self.tracker.track("setup"):
                engine = build_engine(
                    layers,
                    self.evaluator.loss_fn,
                    data_parallel=dp,
                    pipeline_stages=pp,
                    micro_batch_size=msg.micro_batch_size,
                    config=self.dcfg,
                    lr=schedule[0][0],
                    weight_decay=tcfg.weight_decay,
                    optimizer=tcfg.optimizer,
                    momentum=tcfg.momentum,
                    device=self.device,
                    group_rank=group.rank,
                )
            batches = self.evaluator.train_batches(
                batch_size=msg.micro_batch_size,
                replica=group.rank % dp,
                num_replicas=dp,
                seed=msg.seed,
            )
        pruned = False
        metrics: dict[str, float] = {}
        self._best = None
        for epoch, (lr, stage) in enumerate(schedule, start=1):
            if active:
                assert engine is not None
                engine.set_lr(lr)
                with self.tracker.track("compute"):
                    for _ in range(tcfg.steps_per_epoch):
                        engine.train_step(batches)
                        if self.averager is not None:
                            self.averager.poll()
                        self._check_signal()
                with self.tracker.track("communication"):
                    engine.copy_back(layers, group.rank)
                    if pp > 1:
                        _broadcast_layers(layers, engine.owners)
            decision = None
            if group.is_leader:
                with channel.leader_section("scoring the candidate"):
                    with self.tracker.track("compute"):
                        metrics = self.evaluator.validate(layers, self.config.objective.metrics)
                    decision = self._report(metrics, epoch, stage)
            with self.tracker.track("idle"):
                decision = channel.share(decision)
            if decision is not None:
                pruned = decision == "prune"
                break
        del engine
        if use_world:
            # DeepSpeed creates new process groups per engine; ending the world frees them
            # (sockets would pile up over hundreds of trials). A new one takes milliseconds.
            with self.tracker.track("setup"):
                self.world.close()
        if group.is_leader:
            values = [metrics[m] for m in self.config.objective.metrics]
            if self._best is not None and len(values) == 1:
                values = [self._best[0]]  # the best epoch (early stopping finishes with it)
                metrics = self._best[1]
            with channel.leader_section("telling the result"):
                self._tell(values, pruned, arch, msg, metrics)
            with channel.leader_section("averaging weights"), self.tracker.track("communication"):
                if self.averager is not None:
                    self.averager.trial_finished()
            if self.policy is not None:
                with channel.leader_section("checkpointing"):
                    self._maybe_checkpoint()
                    self._close_generation()

    def _report(self, metrics: dict[str, float], epoch: int, stage: str | None) -> str | None:
        """Report one epoch; ``"prune"``, ``"stop"`` (early stopping) or ``None``."""
        assert self._current is not None and self.study is not None
        trial = self._current[0]
        self._reached = (epoch, stage)  # written once with the result (fewer storage writes)
        if len(self.config.study.directions) > 1:
            return None  # Optuna does not prune multi-objective trials
        value = metrics[self.config.objective.metrics[0]]
        maximize = self.config.study.directions[0] == "maximize"
        if self._best is None or (value > self._best[0]) == maximize:
            self._best = (value, dict(metrics))
        with self.tracker.track("storage"):
            trial.report(value, epoch)
            if not trial.should_prune():
                return None
            if stage is not None:
                from optuna_hpcnas.pruners import StagedPruner

                if StagedPruner.early_stopped(trial):
                    trial.set_user_attr(_keys.OBJECTIVE_EARLY_STOPPED, epoch)
                    return "stop"
            return "prune"

    @property
    def _schedule(self) -> list[tuple[float, str | None]]:
        """(learning rate, stage name) per epoch: the staged plan, or ``[training]``."""
        if self.config.pruner.name == "staged" and len(self.config.study.directions) == 1:
            plan = self.config.pruner.build().plan
            return [
                (plan.stages[plan.stage_index(e)].lr, plan.stages[plan.stage_index(e)].name)
                for e in range(1, plan.boundaries[-1] + 1)
            ]
        return [(self.config.training.lr, None)] * self.config.training.epochs

    def _tell(
        self,
        values: Sequence[float],
        pruned: bool,
        arch: Architecture,
        msg: TrialTask,
        metrics: dict[str, float],
    ) -> None:
        import optuna

        assert self.study is not None and self.group is not None and self._current is not None
        trial = self._current[0]
        members = msg.data_parallel * msg.pipeline_stages
        engine = "deepspeed" if members > 1 or self.dcfg.engine == "deepspeed" else "plain"
        layout = (
            f"dp{msg.data_parallel}xpp{msg.pipeline_stages} on {self.group.size} ranks ({engine})"
        )
        with self.tracker.track("storage"):
            trial.set_user_attr(_keys.OBJECTIVE_ARCH, arch.to_json())
            trial.set_user_attr(_keys.OBJECTIVE_ARCH_DESCRIPTION, arch.describe())
            for k, v in metrics.items():
                if k == "accuracy" or k in self.config.objective.metrics:
                    trial.set_user_attr({"latency": _keys.OBJECTIVE_LATENCY}.get(k, k), v)
            epoch, stage = self._reached
            trial.set_user_attr(_keys.OBJECTIVE_EPOCHS, epoch)
            if stage is not None:
                trial.set_user_attr(_keys.OBJECTIVE_STAGE, stage)
            trial.storage.set_trial_system_attr(
                trial._trial_id, _keys.DISTRIBUTED_GROUP, self.group.index
            )
            trial.storage.set_trial_system_attr(trial._trial_id, _keys.DISTRIBUTED_LAYOUT, layout)
            if pruned:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                self.study.tell(trial, list(values))
        self.trials_done += 1
        self._last_told = trial._trial_id
        self._current = None

    def _close_generation(self) -> None:
        """The policy's per-trial callback: top-k states every ``every_p_trials`` trials."""
        assert self.policy is not None and self.study is not None
        with self.tracker.track("storage"):
            frozen = self.study._storage.get_trial(self._last_told)
            self.policy(self.study, frozen)

    # ------------------------------------------------------------------ end of run
    def _finish(self) -> None:
        assert self.group is not None
        self.tracker.stop()
        report = self.tracker.report(
            rank=self.comm.Get_rank(),
            loop_seconds=time.perf_counter() - self._loop_started,
            group=self.group.index,
            leader=self.group.is_leader,
            trials=self.trials_done if self.group.is_leader else 0,
            infeasible=self.trials_infeasible,
            sync_bytes=self.averager.bytes_sent if self.averager is not None else 0,
            sync_rounds=self.averager.rounds_done if self.averager is not None else 0,
        )
        reports = self.comm.gather(report, root=0)  # after tracker.stop(): not counted
        if self.comm.Get_rank() != 0:
            return
        assert self.study is not None and reports is not None
        _logger.info("Utilisation per rank:\n%s", format_table(reports))
        _store_utilisation(self.study, reports)


@contextmanager
def _sqlite_pop_lock(url: str | None) -> Iterator[None]:
    """Serialise popping WAITING trials among the processes of one SQLite file.

    Optuna pops a waiting trial with a read-then-update that relies on ``SELECT ... FOR
    UPDATE``; SQLite ignores row locks, and two leaders were seen to pop the same trial. A
    file lock next to the database closes that window (SQLite is single-machine anyway);
    PostgreSQL and MySQL lock the row themselves.
    """
    if not url or not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        yield
        return
    import fcntl

    path = url[len("sqlite:///") :].split("?", 1)[0] + ".hpcnas-lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _store_utilisation(study: optuna.Study, reports: Sequence[RankUtilisation]) -> None:
    """Append this run's per-rank shares to the study (one entry per ``run_search`` call)."""
    storage, sid = study._storage, study._study_id
    previous = storage.get_study_system_attrs(sid).get(_keys.DISTRIBUTED_UTILISATION)
    runs = json.loads(previous) if isinstance(previous, str) else []
    runs.append({"ranks": [r.to_dict() for r in reports], "finished_at": time.time()})
    storage.set_study_system_attr(sid, _keys.DISTRIBUTED_UTILISATION, json.dumps(runs))
    storage.set_study_system_attr(
        sid,
        _keys.DISTRIBUTED_SYNC_BYTES,
        int(sum(int(r.labels.get("sync_bytes", 0)) for r in reports)),
    )


def utilisation_from_study(study: optuna.Study) -> list[dict[str, Any]]:
    """The per-rank utilisation records ``run_search`` stored, one list entry per run."""
    text = study._storage.get_study_system_attrs(study._study_id).get(
        _keys.DISTRIBUTED_UTILISATION
    )
    return json.loads(text) if isinstance(text, str) else []


def _broadcast_tensors(comm: Any, tensors: Sequence[Any]) -> None:
    """MPI broadcast of tensors from rank 0 of ``comm`` (in place; CPU copies for GPU)."""
    import numpy as np
    import torch

    if comm is None or comm.Get_size() == 1 or not tensors:
        return
    flat = np.concatenate([t.detach().cpu().reshape(-1).float().numpy() for t in tensors])
    flat = np.ascontiguousarray(flat, dtype=np.float32)
    comm.Bcast(flat, root=0)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(torch.from_numpy(flat[offset : offset + n]).view_as(t).to(t.dtype))
            offset += n


def _broadcast_layers(layers: Sequence[nn.Module], owners: Sequence[int]) -> None:
    """torch.distributed broadcast of each layer's state from its owner (one flat buffer per
    layer and dtype)."""
    import torch
    from torch._utils import _flatten_dense_tensors
    from torch._utils import _unflatten_dense_tensors
    import torch.distributed as dist

    for layer, owner in zip(layers, owners):
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in layer.state_dict().values():
            by_dtype.setdefault(t.dtype, []).append(t)
        for tensors in by_dtype.values():
            flat = _flatten_dense_tensors([t.detach() for t in tensors])
            dist.broadcast(flat, src=owner)
            with torch.no_grad():
                for t, new in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                    t.copy_(new)
