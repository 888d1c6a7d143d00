"""Evaluation of architectures: the one trial-evaluation core, stand-alone training, FLOPs,
parameters, latency.

The configuration classes import no torch; everything else loads torch on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna_hpcnas._lazy import lazy_attributes
from optuna_hpcnas.evaluation._config import lr_scale
from optuna_hpcnas.evaluation._config import ObjectiveConfig
from optuna_hpcnas.evaluation._config import resolve_batch_size
from optuna_hpcnas.evaluation._config import ScratchTrainingConfig
from optuna_hpcnas.evaluation._config import TrainingSchedule
from optuna_hpcnas.evaluation._finalists import choose_finalists
from optuna_hpcnas.evaluation._finalists import enqueue_finalists

if TYPE_CHECKING:
    from optuna_hpcnas.evaluation._core import Decision
    from optuna_hpcnas.evaluation._core import Engine
    from optuna_hpcnas.evaluation._core import EngineSession
    from optuna_hpcnas.evaluation._core import FineTuning
    from optuna_hpcnas.evaluation._core import is_out_of_memory
    from optuna_hpcnas.evaluation._core import LocalEngine
    from optuna_hpcnas.evaluation._core import OptunaTrialLink
    from optuna_hpcnas.evaluation._core import Outcome
    from optuna_hpcnas.evaluation._core import report_round
    from optuna_hpcnas.evaluation._core import TrialEvaluator
    from optuna_hpcnas.evaluation._core import TrialLink
    from optuna_hpcnas.evaluation._core import TrialPlan
    from optuna_hpcnas.evaluation._core import verdict_needed
    from optuna_hpcnas.evaluation._latency import LatencyPredictor
    from optuna_hpcnas.evaluation._measure import count_flops
    from optuna_hpcnas.evaluation._measure import count_parameters
    from optuna_hpcnas.evaluation._measure import measure_latency
    from optuna_hpcnas.evaluation._objective import SupernetObjective
    from optuna_hpcnas.evaluation._train import evaluate
    from optuna_hpcnas.evaluation._train import NonFiniteLossError
    from optuna_hpcnas.evaluation._train import train_from_scratch
    from optuna_hpcnas.evaluation._train import train_model
    from optuna_hpcnas.evaluation._train import training_set

# Names whose modules import torch, loaded on first use: the torch-free configuration
# classes above can then be imported (by a run configuration) without torch.
_LAZY = {
    "Decision": "optuna_hpcnas.evaluation._core",
    "Engine": "optuna_hpcnas.evaluation._core",
    "EngineSession": "optuna_hpcnas.evaluation._core",
    "FineTuning": "optuna_hpcnas.evaluation._core",
    "is_out_of_memory": "optuna_hpcnas.evaluation._core",
    "LocalEngine": "optuna_hpcnas.evaluation._core",
    "OptunaTrialLink": "optuna_hpcnas.evaluation._core",
    "Outcome": "optuna_hpcnas.evaluation._core",
    "report_round": "optuna_hpcnas.evaluation._core",
    "TrialEvaluator": "optuna_hpcnas.evaluation._core",
    "TrialLink": "optuna_hpcnas.evaluation._core",
    "TrialPlan": "optuna_hpcnas.evaluation._core",
    "verdict_needed": "optuna_hpcnas.evaluation._core",
    "LatencyPredictor": "optuna_hpcnas.evaluation._latency",
    "count_flops": "optuna_hpcnas.evaluation._measure",
    "count_parameters": "optuna_hpcnas.evaluation._measure",
    "measure_latency": "optuna_hpcnas.evaluation._measure",
    "SupernetObjective": "optuna_hpcnas.evaluation._objective",
    "evaluate": "optuna_hpcnas.evaluation._train",
    "NonFiniteLossError": "optuna_hpcnas.evaluation._train",
    "train_from_scratch": "optuna_hpcnas.evaluation._train",
    "train_model": "optuna_hpcnas.evaluation._train",
    "training_set": "optuna_hpcnas.evaluation._train",
}
__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "Decision",
    "choose_finalists",
    "enqueue_finalists",
    "Engine",
    "EngineSession",
    "FineTuning",
    "LatencyPredictor",
    "LocalEngine",
    "NonFiniteLossError",
    "ObjectiveConfig",
    "OptunaTrialLink",
    "Outcome",
    "ScratchTrainingConfig",
    "SupernetObjective",
    "TrialEvaluator",
    "TrialLink",
    "TrialPlan",
    "TrainingSchedule",
    "count_flops",
    "count_parameters",
    "evaluate",
    "is_out_of_memory",
    "lr_scale",
    "measure_latency",
    "report_round",
    "resolve_batch_size",
    "train_from_scratch",
    "train_model",
    "training_set",
    "verdict_needed",
]
