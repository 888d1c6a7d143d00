"""Deployment: verified FP32 and INT8 ONNX models that take raw data, a server speaking KServe
v1 and the Open Inference Protocol (v2), a container and a Helm chart, and the latency of the
deployed model for the search.

Importing this package imports neither torch nor onnxruntime; the functions do.
"""

from __future__ import annotations

from optuna_hpcnas.deploy._container import dockerfile
from optuna_hpcnas.deploy._container import helm_chart
from optuna_hpcnas.deploy._container import probe_timeout_seconds
from optuna_hpcnas.deploy._holdout import split_holdout
from optuna_hpcnas.deploy._pipeline import deploy_model
from optuna_hpcnas.deploy._pipeline import DeploymentRefused
from optuna_hpcnas.deploy._pipeline import DeployReport
from optuna_hpcnas.deploy._pipeline import load_report
from optuna_hpcnas.deploy._pipeline import ModelFigures
from optuna_hpcnas.deploy._preprocess import standardisation
from optuna_hpcnas.deploy._protocol import ServeLimits
from optuna_hpcnas.deploy._serve import add_serve_arguments
from optuna_hpcnas.deploy._serve import build_app
from optuna_hpcnas.deploy._serve import serve
from optuna_hpcnas.deploy._serve import serve_command
from optuna_hpcnas.deploy._targets import check_target
from optuna_hpcnas.deploy._targets import tensorrt_available
from optuna_hpcnas.evaluation._onnx import onnx_latency

__all__ = [
    "DeployReport",
    "DeploymentRefused",
    "ModelFigures",
    "ServeLimits",
    "add_serve_arguments",
    "build_app",
    "check_target",
    "deploy_model",
    "dockerfile",
    "helm_chart",
    "load_report",
    "onnx_latency",
    "probe_timeout_seconds",
    "serve",
    "serve_command",
    "split_holdout",
    "standardisation",
    "tensorrt_available",
]
