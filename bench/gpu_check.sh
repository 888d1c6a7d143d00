#!/usr/bin/env bash
# GPU readiness in one script (under 8 minutes on one GPU): the evaluation core's engine vs a
# plain PyTorch loop (fp32, bf16), several candidates at once on one device vs one at a time,
# a one-rank DeepSpeed engine vs plain PyTorch; one table of ratios (bench/gpu_check.py).
#
#   bash bench/gpu_check.sh                        # on the GPU machine
#   bash bench/gpu_check.sh --device cpu --quick   # the CPU fallback (CI runs it)
#
# On a lent machine without the project's packages, put wheels for its Python into
# bench/wheels/ (pip download / pip wheel here) and they are installed first, offline.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="${HERE}/..${PYTHONPATH:+:${PYTHONPATH}}"
if ! "${PYTHON}" -c "import optuna, deepspeed" >/dev/null 2>&1 && [ -d "${HERE}/wheels" ]; then
    "${PYTHON}" -m pip install -q --no-index --find-links "${HERE}/wheels" \
        optuna deepspeed dimod dwave-samplers hjson pydantic
fi
exec timeout 470 "${PYTHON}" "${HERE}/gpu_check.py" "$@"
