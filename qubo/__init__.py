"""Small architecture spaces as binary quadratic models (numpy + dimod, no optuna or torch).

The flow: ``OneHotEncoding`` (bits) -> a ``Surrogate`` draws a ``QuadraticModel`` from
``(bits, objective)`` pairs -> ``QUBOProblem.build_bqm`` adds one-hot, conditional, budget and
evaluated-code penalties -> ``solve`` samples it with any ``dimod.Sampler`` and decodes.

Everything but ``solve``, ``Solution``, ``default_sampler`` and ``annealing_schedule`` imports
without dimod; those need the ``qubo`` extra (``pip install optuna-hpcnas[qubo]``).
"""

from __future__ import annotations

from typing import Any

from qubo._bqm import conditional_pairs
from qubo._bqm import LinearBudget
from qubo._bqm import QUBOProblem
from qubo._encoding import OneHotEncoding
from qubo._surrogate import BayesianPosterior
from qubo._surrogate import BayesianQuadratic
from qubo._surrogate import FactorizationMachine
from qubo._surrogate import QuadraticModel
from qubo._surrogate import Surrogate

_DIMOD_NAMES = ("Solution", "annealing_schedule", "default_sampler", "solve")

__all__ = [
    "BayesianPosterior",
    "BayesianQuadratic",
    "FactorizationMachine",
    "LinearBudget",
    "OneHotEncoding",
    "QUBOProblem",
    "QuadraticModel",
    "Solution",
    "Surrogate",
    "annealing_schedule",
    "conditional_pairs",
    "default_sampler",
    "solve",
]


def __getattr__(name: str) -> Any:
    if name in _DIMOD_NAMES:
        try:
            from qubo import _solve
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"qubo.{name} needs dimod and dwave-samplers: pip install 'optuna-hpcnas[qubo]'."
            ) from e
        return getattr(_solve, name)
    raise AttributeError(f"module 'qubo' has no attribute {name!r}")
