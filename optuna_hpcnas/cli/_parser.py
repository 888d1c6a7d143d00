"""The ``hpcnas`` argument parser: one sub-command per command, each with its arguments."""

from __future__ import annotations

import argparse
import logging
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas.cli._common import STORAGE_ENV
from optuna_hpcnas.cli._init import starter_presets

if TYPE_CHECKING:
    pass


_logger = logging.getLogger("optuna_hpcnas.cli")


# ---------------------------------------------------------------------------- parser
def _add_study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help=f"storage URL (default: ${STORAGE_ENV})")
    p.add_argument("--study-name", help="study name (default: the only study in the storage)")
    p.add_argument(
        "--config",
        help="a nas.toml whose [study] gives storage and name (default: ./nas.toml when "
        "there is one and no --storage is given)",
    )


def _add_init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="nas.toml", help="file to write (default: nas.toml)")
    p.add_argument(
        "--preset",
        default="digits-small",
        choices=starter_presets(),
        help="the search space and data the starter is written for (default: digits-small, "
        "scikit-learn's digits; signal-1d: MNIST-1D; the -elastic ones search by inherited "
        "weights, one-shot)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing file")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="the search's nas.toml")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set study.n_trials=20 (repeatable)",
    )
    p.add_argument("--n-trials", type=int, help="same as --set study.n_trials=N")
    p.add_argument("--storage", help=f"storage URL (default: config, then ${STORAGE_ENV})")
    p.add_argument("--study-name", help="study name (default: from the config)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")


def _add_status_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_best_args(p: argparse.ArgumentParser) -> None:
    _add_status_args(p)
    p.add_argument("--top", type=int, default=5, help="how many (single objective)")


def _add_data_factory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-factory",
        metavar="MODULE:FUNCTION",
        help="the [data] factory to call (a factory recorded in the study is never run)",
    )


def _add_export_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    _add_data_factory_arg(p)
    p.add_argument("--trial", type=int, help="export this trial instead of the best")
    p.add_argument("--out", default="hpcnas-export", help="output directory")
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX file")
    p.add_argument(
        "--input",
        choices=["standardised", "raw"],
        default="standardised",
        help="what the files take: the model's standardised inputs (default), or raw data "
        "with the recorded standardisation as the graph's first step",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="optimisation steps of the training (default: [export] steps, else 4000)",
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--finetune",
        action="store_true",
        help="continue from the supernet's weights instead of retraining from scratch",
    )
    how.add_argument(
        "--untrained", action="store_true", help="write the module without any training"
    )
    p.add_argument(
        "--weights",
        help="supernet state_dict (torch.save, read with weights_only=True) for --finetune "
        "(default: the study's newest supernet checkpoint)",
    )


def _add_dashboard_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--artifact-dir", help="a FileSystemArtifactStore directory")
    p.add_argument(
        "--refresh-plots",
        action="store_true",
        help="recompute the Pareto-front and trajectory plots before serving",
    )


def _add_template_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "kind",
        choices=["slurm", "mpirun", "mpijob", "grafana", "prometheus", "all"],
        help="which file",
    )
    p.add_argument("--out", help="output file (directory for 'all'); default: stdout")
    p.add_argument("--config-path", default="nas.toml", help="config path used by the job")
    p.add_argument("--nodes", type=int, default=2, help="nodes of the job (default 2)")
    p.add_argument("--ranks-per-node", type=int, default=4, help="MPI ranks per node (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=4, help="0 for CPU-only nodes")
    p.add_argument("--time", default="24:00:00", help="Slurm time limit")
    p.add_argument("--partition", help="Slurm partition")
    p.add_argument("--account", help="Slurm account")


def _add_deploy_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    _add_data_factory_arg(p)
    p.add_argument("--out", default="hpcnas-deploy", help="output directory")
    p.add_argument("--trial", type=int, help="deploy this trial instead of the best")
    p.add_argument(
        "--limit",
        action="append",
        metavar="NAME=VALUE",
        help="choose the best trial (of the Pareto front) within a cost limit: flops, params "
        "or latency (seconds); repeatable",
    )
    p.add_argument(
        "--holdout-fraction",
        type=float,
        default=0.1,
        help="share of all samples, from the test split the search never saw, to verify on "
        "(default 0.1)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.02,
        help="refuse when the verified accuracy is more than this below the search's "
        "estimate (default 0.02)",
    )
    p.add_argument(
        "--target",
        help="onnx-cpu | tensorrt | npu-no-grouped (default: the space's target, else onnx-cpu)",
    )
    p.add_argument("--name", default="model", help="model name in the KServe routes")
    p.add_argument(
        "--input",
        choices=["raw", "standardised"],
        default="raw",
        help="what the models take: raw data, standardised by the graph itself (default), or "
        "inputs the client standardised upstream",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="optimisation steps of the training (default: [export] steps, else 4000)",
    )
    p.add_argument(
        "--finetune", action="store_true", help="train from the supernet's weights instead"
    )
    p.add_argument("--weights", help="supernet state_dict for --finetune (weights_only=True)")


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    from optuna_hpcnas.deploy import add_serve_arguments

    add_serve_arguments(p)


def _add_storage_proxy_args(p: argparse.ArgumentParser) -> None:
    from optuna_hpcnas.storages import add_storage_proxy_arguments

    add_storage_proxy_arguments(p)


# name -> (one-line help, description, argument adder)
_SUBCOMMANDS: dict[str, tuple[str, str, Any]] = {
    "init": ("write a commented starter nas.toml", "write a starter config", _add_init_args),
    "run": (
        "run a search from a TOML config",
        "run a search from a TOML config. Exit status: 0 done, 2 a user error, 75 the "
        "storage stayed unreachable past [storage] outage_tolerance_s (run `hpcnas resume` "
        "once it is back), 128+N a signal N",
        _add_run_args,
    ),
    "resume": (
        "continue a stopped search (same config)",
        "run exactly the trials a stopped search left (exit status as `hpcnas run`: 75 when "
        "the storage stays unreachable past [storage] outage_tolerance_s)",
        _add_run_args,
    ),
    "status": (
        "progress, trials by state, utilisation",
        "progress, trials by state, throughput and per-rank compute share",
        _add_status_args,
    ),
    "best": (
        "top architectures, or the Pareto front",
        "top architectures (single objective) or the Pareto front",
        _add_best_args,
    ),
    "export": (
        "the best architecture, trained, as files",
        "train the best architecture (retrained from scratch by default) and write it as a "
        "torch.export program and ONNX; prints its held-out test accuracy",
        _add_export_args,
    ),
    "deploy": (
        "the best architecture, trained, verified, as FP32/INT8 ONNX + container + chart",
        "train the chosen architecture, verify it on held-out data, write FP32 and INT8 ONNX "
        "models, benchmark them (report.json), a Dockerfile and a Helm chart",
        _add_deploy_args,
    ),
    "serve": (
        "serve a deployed model over HTTP (KServe v1 and v2)",
        "serve the INT8 (or FP32) model of an `hpcnas deploy` directory with the KServe v1 "
        "protocol and the Open Inference Protocol (v2), with Prometheus metrics on /metrics "
        "(127.0.0.1 by default); the container's entry point",
        _add_serve_args,
    ),
    "storage-proxy": (
        "an Optuna gRPC storage proxy for many workers",
        "serve a storage to many workers through Optuna's gRPC proxy (127.0.0.1 by default); "
        "workers use --storage grpc://HOST:PORT",
        _add_storage_proxy_args,
    ),
    "dashboard": (
        "optuna-dashboard on the study's storage",
        "serve optuna-dashboard (with the checkpoints as artifacts)",
        _add_dashboard_args,
    ),
    "template": (
        "write a Slurm / mpirun / Kubernetes / Grafana file",
        "write a launch or operations file",
        _add_template_args,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from optuna_hpcnas import __version__

    parser = argparse.ArgumentParser(
        prog="hpcnas",
        description="Neural architecture search with Optuna, from a laptop to an HPC cluster.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.add_argument("--version", action="version", version=f"optuna-hpcnas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, description, add_arguments) in _SUBCOMMANDS.items():
        add_arguments(sub.add_parser(name, help=text, description=description))
    return parser
