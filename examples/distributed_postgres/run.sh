#!/usr/bin/env bash
# Launch examples/distributed_postgres/nas.toml with the mpirun wrapper of integrations/.
# Extra arguments go to `hpcnas run`, e.g. --n-trials 10 or --set distributed.group_size=1.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
: "${OPTUNA_STORAGE:?export OPTUNA_STORAGE=postgresql+psycopg://USER@HOST:5432/DB first}"
export OPTUNA_STORAGE
exec "${HERE}/../../integrations/mpirun/hpcnas-mpirun.sh" -n "${RANKS:-4}" \
    run --config "${HERE}/nas.toml" "$@"
