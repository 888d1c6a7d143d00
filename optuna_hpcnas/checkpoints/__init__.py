"""Arrow incremental checkpoints inside Optuna's RDB storage, and resume after faults.

The blobs go to an Optuna artifact store: on RDB storages ``RDBArtifactStore`` (the storage
room's, ``optuna_hpcnas.storages``, re-exported here). Nothing here imports pyarrow,
SQLAlchemy or torch until it is used.
"""

from __future__ import annotations

from optuna_hpcnas.checkpoints._config import CheckpointConfig
from optuna_hpcnas.checkpoints._format import CheckpointChecksumError
from optuna_hpcnas.checkpoints._format import CheckpointFormatError
from optuna_hpcnas.checkpoints._manager import Checkpoint
from optuna_hpcnas.checkpoints._manager import CheckpointError
from optuna_hpcnas.checkpoints._manager import CheckpointInfo
from optuna_hpcnas.checkpoints._manager import CheckpointManager
from optuna_hpcnas.checkpoints._manager import InvalidCheckpointWarning
from optuna_hpcnas.checkpoints._policy import CheckpointPolicy
from optuna_hpcnas.checkpoints._resume import heartbeat_storage
from optuna_hpcnas.checkpoints._resume import mark_trial_for_retry
from optuna_hpcnas.checkpoints._resume import Preempted
from optuna_hpcnas.checkpoints._resume import PreemptionGuard
from optuna_hpcnas.checkpoints._torch import restore_training_state
from optuna_hpcnas.checkpoints._torch import training_state
from optuna_hpcnas.storages import ArtifactCorruptedError
from optuna_hpcnas.storages import RDBArtifactStore

__all__ = [
    "ArtifactCorruptedError",
    "Checkpoint",
    "CheckpointChecksumError",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointPolicy",
    "InvalidCheckpointWarning",
    "Preempted",
    "PreemptionGuard",
    "RDBArtifactStore",
    "heartbeat_storage",
    "mark_trial_for_retry",
    "restore_training_state",
    "training_state",
]
