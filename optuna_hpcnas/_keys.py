"""Every storage key this package writes, in one place, namespaced ``hpcnas:<component>:<field>``.

Study and trial system attributes are shared by all workers of a study; keeping the names
here stops two components from colliding.
"""

from __future__ import annotations

# Study system attributes.
SEARCH_SPACE = "hpcnas:search_space:definition"

# Constraint names (through ``trial.set_constraint``; Optuna prefixes them itself).
CLUSTER_RANKS_CONSTRAINT = "hpcnas.cluster_ranks"

# QUBOSampler (optuna_hpcnas.samplers.QUBOSampler): trial system attribute with the sampling
# facts of one ask (fit/solve time, BQM size, feasibility rate, fallback).
QUBO_INFO = "hpcnas:qubo:info"

# EvolutionarySampler (trial system attributes).
EVOLUTION_ORIGIN = "hpcnas:evolution:origin"
"""How a trial's parameters were made: ``{"operation", "parent", "second_parent", "level",
"params"}``; ``params`` lets other workers see a running child before its parameters land."""
