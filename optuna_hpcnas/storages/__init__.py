"""Every Optuna storage from one string, leases for storages without heartbeats, the gRPC proxy.

``open_storage(url)`` is what the CLI, the runner and the dashboard call with ``--storage`` /
``OPTUNA_STORAGE``; :class:`TrialLease` and :func:`recover_expired_trials` recover dead workers'
trials where Optuna's heartbeats do not exist (journal file, Redis journal, gRPC proxy);
:func:`artifact_store_for` says where checkpoints of a storage go. Imports neither torch nor
any database driver until a storage is opened.
"""

from __future__ import annotations

from optuna_hpcnas.storages._artifacts import artifact_store_for
from optuna_hpcnas.storages._lease import lease_expiry
from optuna_hpcnas.storages._lease import recover_expired_trials
from optuna_hpcnas.storages._lease import TrialLease
from optuna_hpcnas.storages._open import describe_storage
from optuna_hpcnas.storages._open import open_storage
from optuna_hpcnas.storages._open import parse_grpc_url
from optuna_hpcnas.storages._open import storage_kind
from optuna_hpcnas.storages._open import StorageError
from optuna_hpcnas.storages._open import supports_heartbeat
from optuna_hpcnas.storages._proxy import add_storage_proxy_arguments
from optuna_hpcnas.storages._proxy import run_storage_proxy
from optuna_hpcnas.storages._proxy import start_storage_proxy
from optuna_hpcnas.storages._proxy import storage_proxy_command

__all__ = [
    "StorageError",
    "TrialLease",
    "add_storage_proxy_arguments",
    "artifact_store_for",
    "describe_storage",
    "lease_expiry",
    "open_storage",
    "parse_grpc_url",
    "recover_expired_trials",
    "run_storage_proxy",
    "start_storage_proxy",
    "storage_kind",
    "storage_proxy_command",
    "supports_heartbeat",
]
