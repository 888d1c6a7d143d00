"""Checkpoint settings: one frozen dataclass, constructible from a TOML table.

``CheckpointConfig(**tomllib.load(f)["checkpoints"])`` is the intended way to build it from a
run file; every field is validated at construction so a typo fails before training starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields
from typing import Any

from optuna_hpcnas._validation import check_bool
from optuna_hpcnas._validation import check_heartbeat
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas._validation import check_str


@dataclass(frozen=True)
class CheckpointConfig:
    """How often, how and how many checkpoints are written.

    Args:
        every_n_steps: Save the supernet state (weights, optimizer, RNG, sampler cursor) every
            ``N`` training steps.
        full_every: Every ``K``-th checkpoint of a chain is a full one, so a load never decodes
            more than ``K`` blobs. ``1`` disables incremental checkpoints.
        every_p_trials: Every ``P`` finished trials, store the full state of the ``top_k``
            best architectures and metadata for all others.
        top_k: How many architectures keep their full state (3 in the source articles).
        keep_chains: Retention: how many chains (a full checkpoint and its increments) of
            each namespace are kept, the one being written included; older ones are removed
            when a new full checkpoint is written.
        zstd_level: zstd level used by Arrow's IPC compression (1 is fast, 19 is small).
        shard_bytes: Tensors larger than this are split into several records.
        chunk_bytes: Row size used by :class:`RDBArtifactStore` for large blobs.
        heartbeat_interval: Seconds between RDB heartbeats of a running trial.
        grace_period: Seconds without heartbeat after which a trial is declared dead and
            retried. Defaults to ``2 * heartbeat_interval`` (Optuna's default).
        max_retry: How often a trial of a dead or preempted worker is retried.
        exit_deadline: Seconds between SIGTERM/SIGUSR1 and a forced exit.
        enabled: ``hpcnas run`` saves supernet checkpoints (weights, optimizer, RNG, the
            run's cursor) every ``every_n_steps`` supernet steps, the top-k architectures
            every ``every_p_trials`` finished trials, and restores the newest valid one at
            start. Heartbeats and retries apply to every RDB storage, enabled or not.
        artifact_store: Directory of an Optuna ``FileSystemArtifactStore`` for checkpoints
            on storages that are not a database (journal, gRPC proxy); RDB storages keep
            them in the study's own database.
    """

    every_n_steps: int = 100
    full_every: int = 10
    every_p_trials: int = 10
    top_k: int = 3
    keep_chains: int = 2
    zstd_level: int = 1
    shard_bytes: int = 64 * 1024 * 1024
    chunk_bytes: int = 1024 * 1024
    heartbeat_interval: int = 60
    grace_period: int | None = None
    max_retry: int | None = 3
    exit_deadline: float = 25.0
    enabled: bool = False
    artifact_store: str | None = None

    def __post_init__(self) -> None:
        minimums = {
            "every_n_steps": 1,
            "full_every": 1,
            "every_p_trials": 1,
            "top_k": 0,
            "keep_chains": 1,
            "zstd_level": 1,
            "shard_bytes": 1024,
            "chunk_bytes": 1024,
        }
        for name, minimum in minimums.items():
            check_int(name, getattr(self, name), minimum)
        if self.zstd_level > 22:
            raise ValueError(f"`zstd_level` is {self.zstd_level}, but must be <= 22.")
        check_heartbeat(self.heartbeat_interval, self.grace_period, self.max_retry)
        check_bool("enabled", self.enabled)
        check_str("artifact_store", self.artifact_store, what="a directory path", allow_none=True)
        check_number("exit_deadline", self.exit_deadline, positive=False)
        if not 0 < self.exit_deadline <= 30:
            raise ValueError(
                f"`exit_deadline` is {self.exit_deadline}, but must be in (0, 30] seconds."
            )

    @classmethod
    def from_toml(cls, table: dict[str, Any]) -> CheckpointConfig:
        """Build from a TOML table, naming unknown keys instead of a bare ``TypeError``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"Unknown checkpoint settings {unknown}; known are {sorted(known)}.")
        return cls(**table)
