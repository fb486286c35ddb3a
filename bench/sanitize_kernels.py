"""compute-sanitizer over every Triton kernel at small shapes (issue 20), a family of
``bench/gpu_check.sh``.

``python -m bench.sanitize_kernels`` is the program the sanitizer runs: every public op of
``bench/kernel_calls.py`` forced onto its Triton kernel (``kernel_backend("triton")``; the first
call of an autotuned kernel runs every one of its configurations), in float32 and in bfloat16,
each call followed by a synchronize; one line per call; exit status 1 if a call raised.
``--dry-run``: the same calls on the CPU with the torch references.

:func:`run` (gpu_check's ``sanitizer`` family) runs that program under ``compute-sanitizer
--tool memcheck`` and ``--tool racecheck`` (PyTorch's caching allocator off, so an access past a
tensor is past its allocation), one row each: ok when the program exited 0 and the sanitizer
reports no error and no hazard. A sanitizer that is missing or refuses the device (it does on
gVisor machines: "Device not supported") gives a row that says it did not run, never a pass.
Dry run: the calls in this process on the CPU, and the command lines it would run. Each tool
gets 180 s (120 with ``--quick``); ``bash bench/gpu_check.sh --only sanitizer`` runs it alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import row

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck")
REFUSED = ("Device not supported", "Error 999", "error 999", "unknown error")


def exercise(device: str, backend: str) -> int:
    """Every op once per dtype on ``device`` under ``backend``; prints a line per call, returns the failures."""
    import torch

    from bench.kernel_calls import kernel_calls
    from seer_kernels import kernel_backend

    failures = 0
    for dtype in (torch.float32, torch.bfloat16):
        for name, (fn, args, kwargs) in kernel_calls(device, dtype).items():
            try:
                with kernel_backend(backend):
                    fn(*args, **kwargs)
                if device == "cuda":
                    torch.cuda.synchronize()
                print(f"  {name} {dtype}: ran", flush=True)
            except Exception as exc:  # noqa: BLE001 - every op is tried; each failure is printed and counted
                failures += 1
                print(f"  {name} {dtype}: FAILED {type(exc).__name__}: {exc}", flush=True)
    return failures


def sanitizer_path() -> str | None:
    """``compute-sanitizer`` on the PATH or in the CUDA toolkit's bin directory (None: absent)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidate = Path(home) / "bin" / "compute-sanitizer"
    return str(candidate) if candidate.exists() else None


def command(sanitizer: str, tool: str) -> list[str]:
    """The sanitizer's command line for ``tool`` over this module's program."""
    return [sanitizer, "--tool", tool, "--error-exitcode", "3", "--target-processes", "application-only",
            sys.executable, "-m", "bench.sanitize_kernels"]  # fmt: skip


def summary_counts(tool: str, output: str) -> tuple[int, int] | None:
    """(errors, warnings) from the sanitizer's summary line; None when it printed none."""
    if tool == "racecheck":
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", output)
        return (int(m.group(2)), int(m.group(3))) if m else None
    m = re.search(r"ERROR SUMMARY: (\d+) errors?", output)
    return (int(m.group(1)), 0) if m else None


def sanitize(tool: str, sanitizer: str, *, timeout_s: float) -> dict:
    """One tool over the program: a row (see the module docstring)."""
    cmd = command(sanitizer, tool)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env.pop("TRITON_INTERPRET", None)
    print(f"$ {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or "")[-2000:] if isinstance(exc.stdout, str) else ""
        print(tail, flush=True)
        return row(f"compute-sanitizer --tool {tool}", None, f"timed out after {timeout_s:.0f} s", ok=False)
    output = done.stdout + done.stderr
    print(output[-4000:], flush=True)
    seconds = time.perf_counter() - start
    check = f"compute-sanitizer --tool {tool}"
    if any(s in output for s in REFUSED) and summary_counts(tool, output) is None:
        return row(check, None, f"not run: the sanitizer refused the device (rc {done.returncode}); no verdict")
    counts = summary_counts(tool, output)
    failed = [line.strip() for line in output.splitlines() if ": FAILED " in line]
    if counts is None:
        return row(check, None, f"no sanitizer summary (rc {done.returncode}, {seconds:.0f} s)", ok=False)
    errors, warnings = counts
    note = f"{errors} errors, {warnings} warnings, {len(failed)} calls failed (rc {done.returncode}, {seconds:.0f} s)"
    if failed:
        note += "; " + "; ".join(failed[:3])
    return row(check, None, note, ok=done.returncode == 0 and errors == 0 and warnings == 0 and not failed)


def run(quick: bool = False, dry_run: bool = False) -> list[dict]:
    """gpu_check's family: one row per tool (dry run: the calls on the CPU, the command lines)."""
    if dry_run:
        failures = exercise("cpu", "reference")
        rows = [row("every op, float32 and bfloat16, on the references", None, f"{failures} calls failed",
                    ok=failures == 0)]  # fmt: skip
        for tool in TOOLS:
            rows.append(row(f"compute-sanitizer --tool {tool}", None,
                            "dry run: would run " + " ".join(command("compute-sanitizer", tool))))
        return rows
    sanitizer = sanitizer_path()
    if sanitizer is None:
        return [row(f"compute-sanitizer --tool {tool}", None, "not run: compute-sanitizer not found") for tool in TOOLS]
    return [sanitize(tool, sanitizer, timeout_s=120 if quick else 180) for tool in TOOLS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU with the torch references")
    args = parser.parse_args(argv)
    if args.dry_run:
        return 1 if exercise("cpu", "reference") else 0
    import torch

    if not torch.cuda.is_available():
        print("sanitize_kernels: no CUDA device (--dry-run runs the calls on the CPU)", file=sys.stderr)
        return 2
    return 1 if exercise("cuda", "triton") else 0


if __name__ == "__main__":
    sys.exit(main())
