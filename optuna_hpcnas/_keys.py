"""Every storage key this package writes, in one place, namespaced ``hpcnas:<component>:<field>``.

Study and trial system attributes are shared by all workers of a study; keeping the names
here stops two components from colliding.
"""

from __future__ import annotations

# Study system attributes.
SEARCH_SPACE = "hpcnas:search_space:definition"

# Constraint names (through ``trial.set_constraint``; Optuna prefixes them itself).
CLUSTER_RANKS_CONSTRAINT = "hpcnas.cluster_ranks"

# Checkpoints (issue 7). Study system attributes: one manifest per checkpoint, written last.
CHECKPOINT_MANIFEST_PREFIX = "hpcnas:checkpoints:manifest:"
# Trial system attributes set when a signal (SIGTERM/SIGUSR1) stopped the trial for a retry.
CHECKPOINT_PREEMPTED = "hpcnas:checkpoints:preempted"
# Study system attribute per generation of P finished trials: top-k trial numbers and the rest.
CHECKPOINT_GENERATION_PREFIX = "hpcnas:checkpoints:generation:"
