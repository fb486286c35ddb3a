"""Driver for ``bench/gpu_check.sh``: the ``gpu``-marked tests, then the GPU timing harnesses.

1. ``pytest -m gpu tests/kernels`` (``TRITON_INTERPRET=0``): bf16 correctness of every kernel
   against its torch reference and the CUDA-graph capture of DyLLM's op sequence; with
   ``--only``, the tests of those families (their op markers). Its output streams as it comes.
2. Each family's timing harness ``run(quick, dry_run)`` (:data:`FAMILIES`): rows (``check``,
   ``ok``, ``ms``, ``note``; see ``bench/common.py``) are printed as they come. The last family,
   ``sanitizer`` (``bench/sanitize_kernels.py``), runs compute-sanitizer's memcheck and racecheck
   over every Triton kernel at small shapes.

A short table of every row comes last; the exit status is 1 when the tests or any row failed.
``--dry-run`` runs every harness on the CPU at tiny shapes (no tests, no CUDA; the end-to-end
one also builds its full-size models on the meta device): it checks that they work, not the
numbers (``tests/test_gpu_check_dry_run.py`` runs it in CI). Budget: one 10-minute command on an H200 (``--quick``
trims shapes and repeats).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.common import format_row, row, table

ROOT = Path(__file__).resolve().parent.parent

# family -> (module with run(quick, ...), pytest markers of its ops, whether run() takes dry_run)
FAMILIES = {
    "seer_kernels": ("bench.bench_seer_kernels", ("mlp_sparsity", "snr_boundary"), True),
    "dyllm_kernels": (
        "bench.bench_dyllm_kernels",
        ("cosine_saliency", "row_gather_scatter", "partial_attention", "row_linear"),
        True,
    ),
    "varlen_kernels": ("bench.bench_varlen_kernels", ("varlen_attention", "slice_repack"), True),
    "end_to_end": ("bench.gpu_end_to_end", (), True),
    "sanitizer": ("bench.sanitize_kernels", (), True),
}


def run_gpu_tests(families: list[str], quick: bool) -> dict | None:
    """``pytest -m 'gpu and (<markers>)' tests/kernels`` in a subprocess; one row (None: no markers)."""
    markers = sorted({m for f in families for m in FAMILIES[f][1]})
    if not markers:
        return None
    expression = f"gpu and ({' or '.join(markers)})"
    check = f"pytest -m '{expression}' tests/kernels"
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        return row(check, None, f"not run: {', '.join(missing)} not installed (pip install -e '.[dev]')", ok=False)
    cmd = [sys.executable, "-m", "pytest", "-m", expression, "tests/kernels", "-p", "no:cacheprovider", "-rfEs"]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ, TRITON_INTERPRET="0")  # tests/conftest.py would default it to 1
    print(f"$ {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    summary = ""
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            print(line, end="", flush=True)
            if re.search(r"\d+ (passed|failed|error|errors|skipped|deselected)", line):
                summary = line.strip(" =\n")
    seconds = time.perf_counter() - start
    return row(check, None, f"{summary or 'no summary'} (rc {p.returncode}, {seconds:.0f} s)", ok=p.returncode == 0)


def run_harness(family: str, *, quick: bool, dry_run: bool) -> list[dict]:
    """The rows of one family's harness, each tagged with the family and printed as it comes."""
    module_name, _, has_dry_run = FAMILIES[family]
    if dry_run and not has_dry_run:
        rows = [row("timings", None, "skipped: this harness has no dry run")]
    else:
        try:
            module = importlib.import_module(module_name)
            rows = module.run(quick=quick, dry_run=True) if dry_run else module.run(quick=quick)
        except Exception as exc:  # one family failing must not hide the others' numbers
            traceback.print_exc()
            rows = [row("crashed", None, repr(exc)[:200], ok=False)]
    for r in rows:
        r.setdefault("family", family)
        if not r.pop("printed", False):  # a harness may print its rows as they come
            print(format_row(family, r), flush=True)
    return rows


def _check_device(dry_run: bool) -> int | None:
    import torch

    if dry_run:
        print(f"dry run on the CPU (tiny shapes, torch references)  torch {torch.__version__}", flush=True)
        return None
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to check (--dry-run runs the harnesses on the CPU)", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help=f"comma-separated families (default: all of {list(FAMILIES)})")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument("--dry-run", action="store_true", help="the kernel harnesses on the CPU, tiny shapes, no tests")
    args = parser.parse_args(argv)
    wanted = [f for f in args.only.split(",") if f] or list(FAMILIES)
    unknown = [f for f in wanted if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {list(FAMILIES)}")
    status = _check_device(args.dry_run)
    if status is not None:
        return status

    rows: list[dict] = []
    if not args.dry_run:
        tests = run_gpu_tests(wanted, args.quick)
        if tests is not None:
            tests["family"] = "tests"
            print(format_row("tests", tests), flush=True)
            rows.append(tests)
    for family in wanted:
        start = time.perf_counter()
        rows += run_harness(family, quick=args.quick, dry_run=args.dry_run)
        print(f"[{family}] done in {time.perf_counter() - start:.1f}s", flush=True)
    print("\n" + table(rows))
    return 1 if any(r.get("ok") is False for r in rows) else 0


def main_for_family(family: str, parser: argparse.ArgumentParser) -> None:
    """``python -m bench.bench_<family>`` : that family's harness alone (no tests)."""
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at tiny shapes")
    args = parser.parse_args()
    status = _check_device(args.dry_run)
    if status is not None:
        sys.exit(status)
    rows = run_harness(family, quick=args.quick, dry_run=args.dry_run)
    print("\n" + table(rows))
    sys.exit(1 if any(r.get("ok") is False for r in rows) else 0)


if __name__ == "__main__":
    sys.exit(main())
