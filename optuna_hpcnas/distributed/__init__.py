"""Distributed evaluation: MPI evaluation groups, DeepSpeed engines, scheduling, averaging.

Importing this package imports neither torch, deepspeed nor mpi4py; the functions that need
them import them.
"""

from __future__ import annotations
