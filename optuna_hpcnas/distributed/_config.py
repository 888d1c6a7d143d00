"""``DistributedConfig``: the ``[distributed]`` table of a run configuration."""

from __future__ import annotations

from dataclasses import dataclass

from optuna_hpcnas._validation import check_choice
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas._validation import check_str

ENGINES = ("auto", "deepspeed")
BACKENDS = ("auto", "gloo", "nccl")
SHM_OP = ("skip", "build")
COMPRESSIONS = ("none", "powersgd")
SCHEDULERS = ("dynamic", "cost_aware")


@dataclass(frozen=True)
class DistributedConfig:
    """How the MPI job is cut into evaluation groups and how each group trains.

    Args:
        group_size: Ranks per evaluation group (node-local first); 0 sizes groups from the
            space's cluster parameters (the largest ``data_parallel * pipeline_stages``,
            capped by ``max_ranks``). A candidate whose ``data_parallel * pipeline_stages``
            exceeds its group is infeasible.
        sync_interval: Trials a group finishes between two averaging rounds of the shared
            supernet weights across groups; 0 never averages.
        compression: ``"none"`` or ``"powersgd"`` (low-rank, error feedback) for averaging.
        powersgd_rank: Rank of the PowerSGD factorisation.
        zero_stage: DeepSpeed ZeRO stage (0-1 with pipelines, 0-3 without).
        engine: ``"auto"`` (plain PyTorch when dp = pp = 1, DeepSpeed otherwise) or
            ``"deepspeed"`` (always).
        backend: torch.distributed backend: ``"auto"`` (gloo on CPU, NCCL on GPU).
        master_addr: Rendezvous address of a group's torch world; empty: 127.0.0.1 when the
            group is on one node, else the leader's host address.
        master_port: First rendezvous port (each new world uses the next); 0 picks free ports.
        collective_timeout_s: Timeout of torch.distributed collectives (seconds).
        shm_op: ``"skip"`` DeepSpeed's shared-memory op (no ~50 s compile) or ``"build"`` it.
        scheduler: ``"dynamic"`` (idle leader asks the study) or ``"cost_aware"`` (the leader
            asks ``lookahead`` candidates and runs the one with the most predicted FLOPs
            first).
        lookahead: Candidates the cost-aware scheduler considers.
        ask_ahead: ``"on"``: a leader asks for its next trial (pop, sampler, heartbeat) on
            its storage thread while the current one trains, so the sampler sees every
            finished trial but the running ones; ``"off"``: it asks after the tell, as
            ``study.optimize`` does; ``"auto"``: on with several groups, off with one (a
            one-process ``hpcnas run`` then samples exactly as the Python API).
        one_shot_batch: One-shot mode: inherited candidates a leader asks and tells on a
            local copy of the study and writes to it at once (one transaction on an RDB
            storage; ``run._batches``); 1 asks and tells each on the study, as the Python API
            does.
        processes: Ranks ``hpcnas run`` starts on this machine when no launcher started it
            (it re-runs itself under the ``mpirun`` of ``optuna-hpcnas[mpi]``): ``1`` runs in
            this process; ``"auto"`` one rank per CPU the process may use (affinity, cgroup
            quota) divided by ``[training] threads``. Under ``mpirun``/``srun`` the launcher
            decides and this is ignored.
    """

    group_size: int = 1
    sync_interval: int = 1
    compression: str = "none"
    powersgd_rank: int = 4
    zero_stage: int = 0
    engine: str = "auto"
    backend: str = "auto"
    master_addr: str = ""
    master_port: int = 0
    collective_timeout_s: float = 300.0
    shm_op: str = "skip"
    scheduler: str = "dynamic"
    lookahead: int = 4
    ask_ahead: str = "auto"
    one_shot_batch: int = 32
    processes: int | str = 1

    def __post_init__(self) -> None:
        check_int("group_size", self.group_size, 0)
        check_int("sync_interval", self.sync_interval, 0)
        check_choice("compression", self.compression, COMPRESSIONS)
        check_int("powersgd_rank", self.powersgd_rank, 1)
        check_int("zero_stage", self.zero_stage, 0)
        if self.zero_stage > 3:
            raise ValueError(f"`zero_stage` is {self.zero_stage}, but must be 0, 1, 2 or 3.")
        check_choice("engine", self.engine, ENGINES)
        check_choice("ask_ahead", self.ask_ahead, ("auto", "on", "off"))
        check_choice("backend", self.backend, BACKENDS)
        check_str("master_addr", self.master_addr)
        check_int("master_port", self.master_port, 0)
        check_number("collective_timeout_s", self.collective_timeout_s)
        check_choice("shm_op", self.shm_op, SHM_OP)
        check_choice("scheduler", self.scheduler, SCHEDULERS)
        check_int("lookahead", self.lookahead, 1)
        check_int("one_shot_batch", self.one_shot_batch, 1)
        if self.processes != "auto":
            if isinstance(self.processes, str):
                raise ValueError(
                    f"`processes` is {self.processes!r}, but must be 'auto' or an integer >= 1."
                )
            check_int("processes", self.processes, 1)
