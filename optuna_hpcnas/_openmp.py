"""OpenMP threads that sleep while they wait, set before anything loads torch.

GNU OpenMP (torch's CPU wheels) reads ``OMP_WAIT_POLICY`` once, when the library loads; its
default spins for a while before sleeping, which takes a busy core from whatever else runs
there and slows both. The processes the project starts call ``passive_openmp`` first, and so
does ``import optuna_hpcnas``; this module imports nothing, so calling it cannot load torch
itself.
"""

from __future__ import annotations

from collections.abc import MutableMapping
import os
import sys


def passive_openmp(environ: MutableMapping[str, str] | None = None) -> bool:
    """Make OpenMP threads sleep while they wait (``OMP_WAIT_POLICY=passive``) unless the
    environment says otherwise; ``False`` when torch was loaded already (its OpenMP runtime
    read the environment then, so this process keeps spinning)."""
    env = os.environ if environ is None else environ
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return "torch" not in sys.modules
