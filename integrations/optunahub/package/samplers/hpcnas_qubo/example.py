"""QUBOSampler on a small architecture space with a FLOPs-like budget.

A synthetic score stands in for training (validation error of an architecture), so the example
runs in seconds. The budget is exact in the binary quadratic model: every proposal fits it.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import optuna
import optunahub
from qubo import LinearBudget


# Loaded from this checkout; from the registry: optunahub.load_module("samplers/hpcnas_qubo").
module = optunahub.load_local_module(
    package="samplers/hpcnas_qubo", registry_root=str(Path(__file__).resolve().parents[2])
)
OPS = {"conv3x3": (0.0, 9.0), "sepconv3x3": (0.03, 4.0), "skip": (0.2, 0.0)}  # error, cost
WIDTHS = [16, 32, 48, 64]


def objective(trial: optuna.Trial) -> float:
    ops = [trial.suggest_categorical(f"cell{i}", list(OPS)) for i in range(3)]
    width = trial.suggest_int("width", 16, 64, step=16)
    return sum(OPS[op][0] for op in ops) + 0.5 / width  # wider is better, up to the budget


# Cost of each (parameter, value): the budget is linear in them.
costs: dict[tuple[str, Hashable], float] = {("width", w): w / 16 for w in WIDTHS}
costs.update({(f"cell{i}", op): cost for i in range(3) for op, (_, cost) in OPS.items()})
budget = LinearBudget("cost", costs, limit=16.0)
sampler = module.QUBOSampler(seed=0, n_startup_trials=5, budgets=[budget])
study = optuna.create_study(sampler=sampler)
study.optimize(objective, n_trials=30)
print(study.best_value, study.best_params)
