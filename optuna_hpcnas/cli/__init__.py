"""The ``hpcnas`` command: init, run, resume, status, best, export, deploy, serve, dashboard,
template.

``hpcnas run --config nas.toml`` runs a search from a TOML file (also as
``mpirun -n N python -m mpi4py -m optuna_hpcnas run --config nas.toml``); the other commands
read a study from its storage: ``--storage URL``, the ``[study]`` table of ``--config`` (or of
``./nas.toml``), or ``OPTUNA_STORAGE`` (as Optuna's own CLI). A user error prints one line and
exits with 2; a run whose storage stayed away past ``[storage] outage_tolerance_s`` prints one
line and exits with 75 (``EX_TEMPFAIL``: ``hpcnas resume`` continues it).
"""

from __future__ import annotations

from optuna_hpcnas.cli._common import CLIError
from optuna_hpcnas.cli._init import STARTER
from optuna_hpcnas.cli._init import starter
from optuna_hpcnas.cli._init import starter_presets
from optuna_hpcnas.cli._main import main
from optuna_hpcnas.cli._parser import build_parser

__all__ = ["CLIError", "STARTER", "build_parser", "main", "starter", "starter_presets"]
