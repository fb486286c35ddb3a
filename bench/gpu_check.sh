#!/usr/bin/env bash
# One prepared GPU check (not run in CI): bf16 correctness of every kernel against its torch
# reference, device-event timings at real-model shapes, and a short table printed last.
# Builds nothing slow; meant to finish in a few minutes on one H100/H200.
#   usage: bash bench/gpu_check.sh [--only FAMILY[,FAMILY...]] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
if ! "$PY" -c "import seer_kernels" 2>/dev/null; then
  "$PY" -m pip install -q -e . >/dev/null
fi
unset TRITON_INTERPRET
exec "$PY" -m bench.gpu_check "$@"
