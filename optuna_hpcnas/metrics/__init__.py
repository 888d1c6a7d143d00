"""Prometheus metrics of a search: ``hpcnas_*`` series in base units, MPI-safe.

Importing this package does not import ``prometheus_client``; the classes do when built.
"""

from __future__ import annotations

from optuna_hpcnas.metrics._metrics import METRIC_NAMES
from optuna_hpcnas.metrics._metrics import MetricsCallback
from optuna_hpcnas.metrics._metrics import SearchMetrics
from optuna_hpcnas.metrics._metrics import TimedSampler
from optuna_hpcnas.metrics._server import DEFAULT_METRICS_PORT
from optuna_hpcnas.metrics._server import enable_multiprocess
from optuna_hpcnas.metrics._server import MetricsServer
from optuna_hpcnas.metrics._server import serve_metrics

__all__ = [
    "DEFAULT_METRICS_PORT",
    "METRIC_NAMES",
    "MetricsCallback",
    "MetricsServer",
    "SearchMetrics",
    "TimedSampler",
    "enable_multiprocess",
    "serve_metrics",
]
