"""Small architecture spaces as binary quadratic models (numpy + dimod, no optuna or torch).

``OneHotEncoding`` imports without dimod; the solver parts need the ``qubo`` extra.
"""

from __future__ import annotations

from qubo._encoding import OneHotEncoding

__all__ = ["OneHotEncoding"]
