"""EvolutionarySampler on a hierarchical architecture space, two objectives and a constraint.

A synthetic score stands in for training (validation error of an architecture), so the example
runs in seconds; in a real search the objective trains the architecture (optuna-hpcnas's
``SupernetObjective`` does it with weight sharing).
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna_hpcnas import HierarchicalSearchSpace
import optunahub


# Loaded from this checkout; from the registry:
# optunahub.load_module("samplers/hpcnas_evolutionary").
module = optunahub.load_local_module(
    package="samplers/hpcnas_evolutionary",
    registry_root=str(Path(__file__).resolve().parents[2]),
)
space = HierarchicalSearchSpace.preset("digits-small")  # 1,536 architectures
# Per operator: validation error it adds, and its cost per channel and kernel position.
OPS = {
    "conv3x3": (0.0, 1.0),
    "sepconv3x3": (0.02, 0.4),
    "dilconv3x3": (0.04, 1.0),
    "maxpool3x3": (0.1, 0.1),
    "identity": (0.2, 0.0),
}


def objective(trial: optuna.Trial) -> tuple[float, float]:
    arch = space.suggest(trial)  # topology, per-cell operators, kernels and widths
    error = 0.05 * (arch.topology != "residual")
    cost = 0.0
    for cell in arch.cells:
        width = cell.width or 16
        error += OPS[cell.op][0] + 0.02 * 16 / width  # wider cells validate better
        cost += OPS[cell.op][1] * width * (cell.kernel or 1) ** 2
    trial.set_constraint("max_cost", cost - 600.0)  # feasible when cost <= 600
    trial.set_user_attr("architecture", arch.describe())
    return error, cost


study = optuna.create_study(
    directions=["minimize", "minimize"], sampler=module.EvolutionarySampler(seed=0)
)
study.optimize(objective, n_trials=60)
for trial in sorted(study.best_trials, key=lambda t: t.values):
    print(trial.values, trial.user_attrs["architecture"])
