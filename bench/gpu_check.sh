#!/usr/bin/env bash
# One prepared GPU command that fits a device loan (issue 33): a smoke stage first, then the timed
# full-depth rows, the kernel-level profile, the gpu-marked tests, the kernel harnesses and, last and
# optional, compute-sanitizer; each stage in a process of its own under a deadline, rows printed as
# they come, everything written to $OUT when it is set, a short summary last (bench/gpu_check.py).
# Nothing is installed (the device has no network): a missing package is a "not run" row.
#   usage: bash bench/gpu_check.sh [--deadline-s S] [--only STAGE,...] [--skip STAGE,...] [--dry-run | --plan-only]
#   stages: smoke, end_to_end, profile, tests, kernels, sanitizer
#   SEER_SANITIZER_TOOLS=memcheck,racecheck adds racecheck (its hazards are reported to inspect)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1
exec "$PY" -m bench.gpu_check "$@"
