"""Every Triton kernel config compiled for a CUDA target on a machine with no GPU (issue 33).

``python -m bench.compile_kernels --target sm_90`` calls every public ``seer_kernels`` op once at
LLaDA-8B shapes (``bench.kernel_calls.model_shape_calls``) in float32 and in bfloat16, on the
device code path (``emulate_device``) with the Triton backend forced, while Triton's driver is a
stand-in that names the target (``GPUTarget("cuda", 90, 32)``) and its launch is replaced by a
compile: each plain kernel compiles the specialisation the call asks for, and each autotuned
kernel compiles *every* config of its list (what autotuning on the GPU would try), through
Triton's own compiler down to a cubin with the ptxas that ships in the Triton wheel. Nothing runs.

Per compiled kernel config one row: kernel, config (block sizes, warps, stages), dtype, shared
memory (Triton's allocation, checked against the H200's 232,448 bytes per block), registers and
spill bytes (ptxas's ``-v`` report). Last line: ``compiled <n> kernel configs for sm_90: <e>
errors``; the exit status is 1 on any error (a compile that raised, or shared memory over the
limit). ``--json PATH`` writes every row.

Speed (the CI test runs it): a compile is keyed by kernel, specialisation and config, and a key
seen before in the run is not compiled again (one op's kernel called at several sizes, one kernel
behind two ops, or a kernel whose specialisation does not involve the dtype: it is listed under
the first dtype only); Triton's cache is a fresh directory per run (a warm cache would hide
ptxas's report), shared by ``--jobs`` worker processes that split the compiles between them
(each worker makes the same calls in the same order and compiles every ``jobs``-th new key).

Measured (bench/RESULTS.md, 2 shared cores, 2 jobs): the full set, 102 configs, 454 s (float32's
``ieee`` dots at Hopper tile sizes take three quarters of it); ``--quick`` (float32: each autotuned
kernel's first config), 74 configs, 70-96 s: what CI runs (``tests/test_compile_kernels.py``).

Must run with ``TRITON_INTERPRET`` unset (the interpreter replaces the compiler); when it is set
(pytest's conftest sets it) :func:`main` re-runs itself in a subprocess without it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: shared memory per thread block on an H200 (sm_90: 227 KiB usable of the 228 KiB per SM)
H200_SHARED_PER_BLOCK = 232_448
TARGETS = {"sm_90": 90}
DTYPES = ("float32", "bfloat16")

_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _fake_driver(capability: int):
    """A stand-in for Triton's active driver: the target it names, device 0, stream 0."""
    from triton.backends.compiler import GPUTarget

    class TargetOnlyDriver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

    return TargetOnlyDriver()


def _describe(value) -> object:
    """A launch argument as its specialisation sees it: a tensor's dtype, an int's value."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "data_ptr"):
        return f"*{dtype}"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


class _Compiler:
    """Replaces Triton's launch with a compile for one worker (module docstring)."""

    def __init__(self, *, worker: int, jobs: int, dtype: str, first_config_only: bool = False) -> None:
        self.worker, self.jobs, self.dtype = worker, jobs, dtype
        self.first_config_only = first_config_only  # an autotuned kernel's first config alone
        self.seen: dict[tuple, int] = {}  # compile key -> its number in the run
        self.rows: list[dict] = []
        self.op = ""

    def compile(self, jit_run, fn, args, kwargs, config: dict | None) -> object:
        """One kernel specialisation (``config``: the autotune config's kwargs, merged in ``kwargs``)."""
        name = fn.fn.__name__
        params = [p.name for p in fn.params]
        bound = dict(zip(params, args))
        bound.update(kwargs)
        spec = tuple((k, _describe(v)) for k, v in sorted(bound.items()) if k not in ("grid", "warmup"))
        key = (name, spec)
        if key in self.seen:
            return None
        number = self.seen[key] = len(self.seen)
        if number % self.jobs != self.worker:
            return None
        shown = {k: v for k, v in (config or {}).items()}
        if not shown:  # a plain kernel: its block-size constexprs
            shown = {p.name: bound[p.name] for p in fn.params if p.is_constexpr and p.name.isupper()
                     and isinstance(bound.get(p.name), int)}
        config_text = ", ".join(f"{k}={v}" for k, v in shown.items())
        row = {"number": number, "op": self.op, "kernel": name, "config": config_text, "dtype": self.dtype,
               "shared": None, "registers": None, "spill_bytes": None, "seconds": None, "error": None}
        log = io.StringIO()
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(log):
                kernel = jit_run(fn, *args, **kwargs)
            row["shared"] = int(kernel.metadata.shared)
            regs = _REGISTERS.findall(log.getvalue())
            spills = _SPILLS.findall(log.getvalue())
            row["registers"] = max(int(r) for r in regs) if regs else None
            row["spill_bytes"] = sum(int(s) + int(lo) for s, lo in spills) if spills else None
            if row["shared"] > H200_SHARED_PER_BLOCK:
                row["error"] = f"shared memory {row['shared']} B over the H200's {H200_SHARED_PER_BLOCK} B per block"
        except Exception as exc:  # noqa: BLE001 - every config is tried; each failure is a row
            row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        row["seconds"] = round(time.perf_counter() - start, 2)
        self.rows.append(row)
        return None


@contextlib.contextmanager
def _compile_instead_of_launch(compiler: _Compiler, capability: int):
    """Triton's driver names the target; a launch compiles (every config of an autotuned kernel)."""
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    original_run, original_autotune = JITFunction.run, Autotuner.run
    previous_driver = driver._active  # None on a machine without a GPU: there is no driver to go back to

    def jit_run(fn, *args, **kwargs):
        kwargs.pop("warmup", None)
        return original_run(fn, *args, warmup=True, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):
        return compiler.compile(jit_run, self, args, dict(kwargs, grid=grid), None)

    def autotune_run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        try:
            configs = self.prune_configs(kwargs)
            for config in configs[:1] if compiler.first_config_only else configs:
                inner = self.fn
                while not isinstance(inner, JITFunction):
                    inner = inner.fn
                merged = dict(kwargs, **config.all_kwargs())
                shown = dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
                compiler.compile(jit_run, inner, args, merged, shown)
        finally:
            self.nargs = None

    driver.set_active(_fake_driver(capability))
    JITFunction.run, Autotuner.run = run, autotune_run
    try:
        yield
    finally:
        JITFunction.run, Autotuner.run = original_run, original_autotune
        driver._active = previous_driver


def compile_worker(worker: int, jobs: int, dtypes: tuple[str, ...], capability: int, only: tuple[str, ...],
                   first_config_only: tuple[str, ...] = ()) -> list:
    """Every op's call at 8B shapes in each dtype, compiling this worker's share of the kernels
    (the dtypes in ``first_config_only``: an autotuned kernel's first config alone)."""
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on"):
        raise RuntimeError("compile_kernels needs TRITON_INTERPRET unset (the interpreter replaces the compiler)")
    import torch
    from triton import knobs

    import seer_kernels
    from bench.kernel_calls import model_shape_calls
    from seer_kernels import _dispatch

    knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report (registers, spills) printed per compile
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the kernels' behaviour today, without the warning
    rows: list[dict] = []
    original_use_triton = _dispatch.use_triton
    _dispatch.use_triton = lambda tensor: _dispatch.current_backend() != "reference"
    try:
        compiler = _Compiler(worker=worker, jobs=jobs, dtype=dtypes[0])  # one key table: a kernel whose
        for dtype_name in dtypes:  # specialisation does not depend on the dtype compiles once
            compiler.dtype = dtype_name
            compiler.first_config_only = dtype_name in first_config_only
            calls = model_shape_calls("cpu", getattr(torch, dtype_name))
            with _compile_instead_of_launch(compiler, capability):
                for op, (fn, args, kwargs) in calls.items():
                    if only and op not in only:
                        continue
                    compiler.op = op
                    try:
                        with seer_kernels.kernel_backend("triton"), _dispatch.emulate_device():
                            fn(*args, **kwargs)
                    except Exception as exc:  # noqa: BLE001 - an op whose launcher fails is an error row
                        if worker == 0:
                            compiler.rows.append({"number": -1, "op": op, "kernel": "(launcher)", "config": "",
                                                  "dtype": dtype_name, "shared": None, "registers": None,
                                                  "spill_bytes": None, "seconds": None,
                                                  "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        rows += compiler.rows
    finally:
        _dispatch.use_triton = original_use_triton
    return rows


def compile_all(*, target: str = "sm_90", dtypes: tuple[str, ...] = DTYPES, jobs: int = 1,
                only: tuple[str, ...] = (), quick: bool = False) -> list[dict]:
    """Every row (module docstring), ordered by op and dtype as the calls ran. ``quick``: float32
    compiles every plain kernel but only the first config of each autotuned one (the one the
    interpreter tests run): its ``ieee`` dots at Hopper tile sizes take most of the full run."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {sorted(TARGETS)}, got {target!r}")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f"dtypes: {unknown} not in {DTYPES}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    capability = TARGETS[target]
    first_only = ("float32",) if quick else ()
    with tempfile.TemporaryDirectory(prefix="seer-triton-cache-") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # fresh: every config compiles and ptxas reports
        if jobs == 1:
            rows = compile_worker(0, 1, dtypes, capability, only, first_only)
        else:
            with ProcessPoolExecutor(jobs) as pool:
                parts = [pool.submit(compile_worker, w, jobs, dtypes, capability, only, first_only)
                         for w in range(jobs)]
                rows = [r for p in parts for r in p.result()]
    return sorted(rows, key=lambda r: r["number"])


def format_table(rows: list[dict]) -> str:
    """A markdown table of the rows: kernel, config, dtype, shared memory, registers, spills."""
    lines = ["| op | kernel | config | dtype | shared B | registers | spill B | s | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["op"], r["kernel"], r["config"], r["dtype"], r["shared"], r["registers"], r["spill_bytes"],
                 r["seconds"], r["error"] or ""]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def summary_line(rows: list[dict], target: str) -> str:
    errors = sum(1 for r in rows if r["error"])
    return f"compiled {len(rows)} kernel configs for {target}: {errors} errors"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="sm_90", choices=sorted(TARGETS))
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {DTYPES}")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--only", default="", help="comma-separated op names (default: every op)")
    parser.add_argument("--json", default="", help="write every row to this file")
    parser.add_argument("--quick", action="store_true",
                        help="float32: an autotuned kernel's first config alone (bfloat16: every config)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        cmd = [sys.executable, "-m", "bench.compile_kernels", *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    start = time.perf_counter()
    rows = compile_all(target=args.target, dtypes=dtypes, jobs=args.jobs,
                       only=tuple(o for o in args.only.split(",") if o), quick=args.quick)
    print(format_table(rows))
    print(f"{len({(r['op'], r['dtype']) for r in rows})} op calls, {args.jobs} jobs, "
          f"{time.perf_counter() - start:.0f} s; shared memory limit {H200_SHARED_PER_BLOCK} B per block")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(summary_line(rows, args.target))
    return 1 if any(r["error"] for r in rows) or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
