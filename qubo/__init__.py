"""Small architecture spaces as binary quadratic models (numpy + dimod, no optuna or torch).

The flow: ``OneHotEncoding`` (bits) -> a ``Surrogate`` draws a ``QuadraticModel`` from
``(bits, objective)`` pairs -> ``QUBOProblem.build_bqm`` adds one-hot, conditional, budget and
evaluated-code penalties -> ``solve`` samples it with any ``dimod.Sampler`` and decodes.
"""

from __future__ import annotations

from qubo._bqm import conditional_pairs
from qubo._bqm import LinearBudget
from qubo._bqm import QUBOProblem
from qubo._encoding import OneHotEncoding
from qubo._solve import annealing_schedule
from qubo._solve import default_sampler
from qubo._solve import Solution
from qubo._solve import solve
from qubo._surrogate import BayesianPosterior
from qubo._surrogate import BayesianQuadratic
from qubo._surrogate import FactorizationMachine
from qubo._surrogate import QuadraticModel
from qubo._surrogate import Surrogate

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
