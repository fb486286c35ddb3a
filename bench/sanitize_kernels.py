"""compute-sanitizer over every Triton kernel at small shapes (issue 20), the last and optional
stage of ``bash bench/gpu_check.sh`` (issue 33).

``python -m bench.sanitize_kernels`` is the program the sanitizer runs: every public op of
``bench/kernel_calls.py`` forced onto its Triton kernel (``kernel_backend("triton")``), in float32
and in bfloat16, each call followed by a synchronize; one line per call; exit status 1 if a call
raised. ``--dry-run``: the same calls on the CPU with the torch references.

:func:`run` first runs the program once without the sanitizer (Triton's cache warmed: every kernel
compiled, and with ``TRITON_CACHE_AUTOTUNING=1`` each autotuned kernel's choice at these shapes kept,
so the sanitized run launches cached kernels instead of compiling and benchmarking every config
under the tool), then under ``compute-sanitizer --tool memcheck`` (PyTorch's caching allocator
off, so an access past a tensor is past its allocation): ok when the program exited 0 with no
error. ``tools=("memcheck", "racecheck")`` (``SEER_SANITIZER_TOOLS``) adds racecheck, whose hazards
are reported "to inspect", not failed: Triton's cross-warp reductions go through shared memory
with barriers racecheck is known to flag (triton-lang/triton#7264). A sanitizer that is missing or
refuses the device (it does on gVisor machines: "Device not supported") gives a row that says it
did not run, never a pass. Each process runs in a session of its own and is killed with its
children at its share of ``deadline_s``; whatever it printed by then is still shown.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import row

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck")
DEFAULT_TOOLS = ("memcheck",)
RACE_ISSUE = "triton-lang/triton#7264"
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


def run_captured(cmd: list[str], env: dict, timeout_s: float) -> tuple[int | None, str, float]:
    """``cmd`` in a session of its own: ``(returncode, output, seconds)``; at ``timeout_s`` the whole
    process group is killed and the output printed until then is returned with returncode None."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    text = out.decode("utf-8", "replace") if isinstance(out, bytes) else (out or "")
    return code, text, time.perf_counter() - start


def _env() -> dict:
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", TRITON_CACHE_AUTOTUNING="1")
    env.pop("TRITON_INTERPRET", None)
    return env


def warm_cache(timeout_s: float) -> dict:
    """The program once without the sanitizer: every kernel compiled and autotuned into Triton's cache."""
    cmd = [sys.executable, "-m", "bench.sanitize_kernels"]
    code, output, seconds = run_captured(cmd, _env(), timeout_s)
    check = "Triton cache warmed (the program without the sanitizer)"
    if code is None:
        print(output[-2000:], flush=True)
        return row(check, None, f"timed out after {timeout_s:.0f} s", ok=False)
    failed = [line.strip() for line in output.splitlines() if ": FAILED " in line]
    note = f"rc {code}, {seconds:.0f} s" + (f"; {'; '.join(failed[:3])}" if failed else "")
    return row(check, None, note, ok=code == 0)


def sanitize(tool: str, sanitizer: str, *, timeout_s: float) -> dict:
    """One tool over the program: a row (see the module docstring)."""
    cmd = command(sanitizer, tool)
    print(f"$ {' '.join(cmd)}", flush=True)
    code, output, seconds = run_captured(cmd, _env(), timeout_s)
    check = f"compute-sanitizer --tool {tool}"
    if code is None:
        print(output[-4000:], flush=True)
        counts = summary_counts(tool, output)
        ran = sum(1 for line in output.splitlines() if line.rstrip().endswith(": ran"))
        return row(check, None, f"timed out after {timeout_s:.0f} s ({ran} calls had run; process group killed)",
                   ok=False)
    print(output[-4000:], flush=True)
    if any(s in output for s in REFUSED) and summary_counts(tool, output) is None:
        return row(check, None, f"not run: the sanitizer refused the device (rc {code}); no verdict")
    counts = summary_counts(tool, output)
    failed = [line.strip() for line in output.splitlines() if ": FAILED " in line]
    if counts is None:
        return row(check, None, f"no sanitizer summary (rc {code}, {seconds:.0f} s)", ok=False)
    errors, warnings = counts
    note = f"{errors} errors, {warnings} warnings, {len(failed)} calls failed (rc {code}, {seconds:.0f} s)"
    if failed:
        note += "; " + "; ".join(failed[:3])
    if tool == "racecheck":  # hazards are leads to read beside the upstream issue, not verdicts
        if errors or warnings:
            note += f"; hazards to inspect (Triton's cross-warp reductions: {RACE_ISSUE})"
        return row(check, None, note, ok=False if failed or code not in (0, 3) else None)
    return row(check, None, note, ok=code == 0 and errors == 0 and not failed)


def tools_wanted() -> tuple[str, ...]:
    """``SEER_SANITIZER_TOOLS`` (comma-separated, of :data:`TOOLS`), default memcheck alone."""
    wanted = tuple(t for t in os.environ.get("SEER_SANITIZER_TOOLS", ",".join(DEFAULT_TOOLS)).split(",") if t)
    unknown = [t for t in wanted if t not in TOOLS]
    if unknown:
        raise ValueError(f"SEER_SANITIZER_TOOLS: unknown tools {unknown}; choose from {TOOLS}")
    return wanted


def run(quick: bool = False, dry_run: bool = False, *, deadline_s: float = 180.0,
        tools: tuple[str, ...] | None = None) -> list[dict]:
    """gpu_check's sanitizer stage: the cache warmed, then one row per tool, all within ``deadline_s``
    (dry run: the calls in this process on the CPU, and the command lines)."""
    tools = tools or tools_wanted()
    if dry_run:
        failures = exercise("cpu", "reference")
        rows = [row("every op, float32 and bfloat16, on the references", None, f"{failures} calls failed",
                    ok=failures == 0)]  # fmt: skip
        for tool in tools:
            rows.append(row(f"compute-sanitizer --tool {tool}", None,
                            "dry run: would run " + " ".join(command("compute-sanitizer", tool))))
        return rows
    sanitizer = sanitizer_path()
    if sanitizer is None:
        return [row(f"compute-sanitizer --tool {tool}", None, "not run: compute-sanitizer not found") for tool in tools]
    start = time.perf_counter()
    rows = [warm_cache(max(10.0, deadline_s * 0.4))]
    for i, tool in enumerate(tools):
        left = deadline_s - (time.perf_counter() - start) - 2
        share = left / (len(tools) - i)
        if share < 10:
            rows.append(row(f"compute-sanitizer --tool {tool}", None, f"not run: {left:.0f} s left"))
            continue
        rows.append(sanitize(tool, sanitizer, timeout_s=share))
    return rows


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
