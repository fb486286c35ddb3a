#!/usr/bin/env bash
# One prepared GPU check (not run in CI): the gpu-marked tests (bf16 correctness of every kernel
# against its torch reference, `pytest -m gpu tests/kernels`), then the timing harnesses at
# real-model shapes, then compute-sanitizer (memcheck, racecheck) over every Triton kernel at
# small shapes; rows printed as they come and a short table last. Fits one 10-minute command on
# an H200. Needs the dev extras (pytest, hypothesis) for the tests.
#   usage: bash bench/gpu_check.sh [--only FAMILY[,FAMILY...]] [--quick] [--dry-run]
#   families: seer_kernels, dyllm_kernels, varlen_kernels, end_to_end, sanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
if ! "$PY" -c "import seer_kernels, pytest, hypothesis" 2>/dev/null; then
  "$PY" -m pip install -q -e ".[dev]" >/dev/null || echo "gpu_check: could not install the dev extras" >&2
fi
unset TRITON_INTERPRET
exec "$PY" -m bench.gpu_check "$@"
