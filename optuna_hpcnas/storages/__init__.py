"""The storage room: every Optuna storage from one string, what a storage string says,
keeping running trials recoverable, artifacts in the study's database, the gRPC proxy.

``open_storage(url)`` is what the CLI, the runner and the dashboard call with ``--storage`` /
``OPTUNA_STORAGE`` (``rdb_storage`` is its one RDB constructor); ``storage_kind``,
``sqlite_file`` and ``mask_url`` read a storage string without opening it;
:class:`TrialLease` and :func:`recover_expired_trials` recover dead workers' trials where
Optuna's heartbeats do not exist (journal file, Redis journal, gRPC proxy), and
:func:`fail_and_requeue` is the one way a running trial is failed and queued again;
:class:`OutageWindow` rides out a storage that goes away (``is_connection_error``,
:class:`Backoff`, :class:`StorageUnavailable`) and :class:`TrialHeartbeat` sends Optuna's
heartbeats through it; :class:`RDBArtifactStore` keeps blobs in the study's own database and
:func:`artifact_store_for` says where checkpoints of a storage go. Imports neither torch nor
any database driver until a storage is opened; never imports the checkpoints or the CLI.
"""

from __future__ import annotations

from optuna_hpcnas.storages._artifacts import artifact_store_for
from optuna_hpcnas.storages._lease import fail_and_requeue
from optuna_hpcnas.storages._lease import lease_expiry
from optuna_hpcnas.storages._lease import recover_expired_trials
from optuna_hpcnas.storages._lease import TrialHeartbeat
from optuna_hpcnas.storages._lease import TrialLease
from optuna_hpcnas.storages._open import CALL_TIMEOUT_S
from optuna_hpcnas.storages._open import describe_storage
from optuna_hpcnas.storages._open import open_storage
from optuna_hpcnas.storages._open import parse_grpc_url
from optuna_hpcnas.storages._open import rdb_storage
from optuna_hpcnas.storages._open import SQLITE_TIMEOUT
from optuna_hpcnas.storages._open import StorageError
from optuna_hpcnas.storages._open import supports_heartbeat
from optuna_hpcnas.storages._outage import Backoff
from optuna_hpcnas.storages._outage import EXIT_STORAGE_UNAVAILABLE
from optuna_hpcnas.storages._outage import is_connection_error
from optuna_hpcnas.storages._outage import OutageWindow
from optuna_hpcnas.storages._outage import quiet_disconnect_warnings
from optuna_hpcnas.storages._outage import StorageUnavailable
from optuna_hpcnas.storages._proxy import add_storage_proxy_arguments
from optuna_hpcnas.storages._proxy import run_storage_proxy
from optuna_hpcnas.storages._proxy import start_storage_proxy
from optuna_hpcnas.storages._proxy import storage_proxy_command
from optuna_hpcnas.storages._rdb_artifacts import ArtifactCorruptedError
from optuna_hpcnas.storages._rdb_artifacts import RDBArtifactStore
from optuna_hpcnas.storages._space import out_of_space
from optuna_hpcnas.storages._urls import mask_url
from optuna_hpcnas.storages._urls import sqlite_file
from optuna_hpcnas.storages._urls import storage_kind

__all__ = [
    "CALL_TIMEOUT_S",
    "EXIT_STORAGE_UNAVAILABLE",
    "SQLITE_TIMEOUT",
    "ArtifactCorruptedError",
    "Backoff",
    "OutageWindow",
    "RDBArtifactStore",
    "StorageError",
    "StorageUnavailable",
    "TrialHeartbeat",
    "TrialLease",
    "add_storage_proxy_arguments",
    "artifact_store_for",
    "describe_storage",
    "fail_and_requeue",
    "is_connection_error",
    "lease_expiry",
    "mask_url",
    "open_storage",
    "out_of_space",
    "parse_grpc_url",
    "quiet_disconnect_warnings",
    "rdb_storage",
    "recover_expired_trials",
    "run_storage_proxy",
    "sqlite_file",
    "start_storage_proxy",
    "storage_kind",
    "storage_proxy_command",
    "supports_heartbeat",
]
