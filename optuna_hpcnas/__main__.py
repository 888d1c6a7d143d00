"""``python -m optuna_hpcnas ...`` (and ``python -m mpi4py -m optuna_hpcnas run ...``)."""

from __future__ import annotations

import sys

from optuna_hpcnas.cli import main

if __name__ == "__main__":
    sys.exit(main())
