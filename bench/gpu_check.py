"""Driver of ``bash bench/gpu_check.sh``: one prepared command that fits a device loan (issue 33).

Stages, in order of value, each in a process of its own under a deadline (killed with its process
group when it passes it; the rows it printed stay):

1. ``smoke`` (under a minute): versions, ``nvidia-smi``, compute-sanitizer's presence, imports, the
   two ceilings (a device-to-device copy, a bf16 matrix product: the rates every later estimate
   uses), one real CUDA-graph capture and replay equal to eager, and a tiny ``generate`` with
   ``graphs="cuda"`` equal to the eager one with zero capture failures (a failed capture is an error
   here, not a warning).
2. ``end_to_end``: the timed full-depth rows (``bench/gpu_end_to_end.py``), default rows first.
3. ``profile``: one steady step per mode under ``torch.profiler`` (``bench/gpu_profile.py``).
4. ``tests``: ``pytest -m gpu tests/kernels tests/runtime`` (bf16 correctness of every kernel, the
   CUDA-graph capture of DyLLM's op sequence, the graph cache's real capture).
5. ``kernels``: the kernel harnesses (``bench_seer_kernels``, ``bench_dyllm_kernels``,
   ``bench_varlen_kernels``) with ``quick=True``.
6. ``sanitizer`` (last, optional): compute-sanitizer's memcheck (``bench/sanitize_kernels.py``).

Each stage's share of ``--deadline-s`` is :data:`BUDGET_S` plus whatever earlier stages left unused;
the default deadline fits one 10-minute device command with two minutes to spare. Rows print as
they come; with ``$OUT`` set, ``gpu_check.log`` (everything), ``gpu_rows.json`` (every row, rewritten
after each stage) and ``gpu_summary.md`` (the summary, under 8,000 characters, printed last) are
written there, and the profile stage's files. Nothing is installed: a missing package is a "not run"
row. The exit status is 1 when a row failed.

``--dry-run`` (CI): prints the plan (every row's shapes, an estimated device time from its FLOPs and
bytes at the H200's rates, its planned peak memory; last ``plan: <rows> rows, estimated device time
<S> s, peak memory <G> GiB``), writes it to ``$OUT/gpu_plan.json``, refuses (exit 1) a plan whose
estimate passes the deadline or any row over 120 GB, then runs every stage at tiny shapes on the
CPU through the same processes and deadlines. ``--plan-only``: the plan alone.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from bench.common import format_row, row, table

ROOT = Path(__file__).resolve().parent.parent
ROW_PREFIX = "@@ROW "
STAGES = ("smoke", "end_to_end", "profile", "tests", "kernels", "sanitizer")
#: each stage's planned seconds (the defaults' sum is the default deadline)
BUDGET_S = {"smoke": 60, "end_to_end": 200, "profile": 50, "tests": 70, "kernels": 45, "sanitizer": 55}
DEFAULT_DEADLINE_S = 480  # one 10-minute command (600 s) with two minutes to spare
SUMMARY_LIMIT = 8000
MEMORY_LIMIT_GB = 120
KERNEL_FAMILIES = ("bench.bench_seer_kernels", "bench.bench_dyllm_kernels", "bench.bench_varlen_kernels")

# kept for the kernel harnesses' ``python -m bench.bench_<family>`` entry points
FAMILIES = {"seer_kernels": "bench.bench_seer_kernels", "dyllm_kernels": "bench.bench_dyllm_kernels",
            "varlen_kernels": "bench.bench_varlen_kernels"}


# ------------------------------------------------------------------------------------- the plan
def build_plan(deadline_s: float) -> dict:
    """Every planned row (end_to_end and profile from their modules, the other stages as their
    budgets) and the totals of the default ones."""
    from bench import gpu_end_to_end, gpu_profile

    entries = [{"stage": "smoke", "row": "versions, nvidia-smi, imports, ceilings, graph capture, tiny generate",
                "shape": "tiny model; 1 GiB copy; 8192^3 bf16 product", "default": True,
                "device_s": 30.0, "peak_gib": 3.0}]
    entries += [dict(e, device_s=e["device_s"] + (15.0 if i == 0 else 0.0))  # the 8B model built once
                for i, e in enumerate(gpu_end_to_end.plan_summary())]
    entries += [dict(e, device_s=e["device_s"] + (15.0 if i == 0 else 0.0)) for i, e in enumerate(gpu_profile.plan())]
    entries += [
        {"stage": "tests", "row": "pytest -m gpu tests/kernels tests/runtime", "shape": "the tests' own (small)",
         "default": True, "device_s": float(BUDGET_S["tests"]), "peak_gib": None},
        {"stage": "kernels", "row": "kernel harnesses, quick", "shape": "LLaDA-8B layer shapes",
         "default": True, "device_s": float(BUDGET_S["kernels"]), "peak_gib": None},
        {"stage": "sanitizer", "row": "compute-sanitizer memcheck (optional)", "shape": "bench/kernel_calls.py",
         "default": True, "device_s": float(BUDGET_S["sanitizer"]), "peak_gib": None},
    ]
    default = [e for e in entries if e["default"]]
    peaks = [e["peak_gib"] for e in entries if e.get("peak_gib") is not None]
    return {"deadline_s": deadline_s, "rows": entries, "default_rows": len(default),
            "device_s": round(sum(e["device_s"] for e in default), 1), "peak_gib": max(peaks),
            "memory_limit_gb": MEMORY_LIMIT_GB}


def print_plan(plan: dict) -> list[str]:
    """The plan's lines (one per row) and the problems that make it refuse."""
    lines = []
    for e in plan["rows"]:
        peak = "-" if e.get("peak_gib") is None else f"{e['peak_gib']:.1f} GiB"
        extra = "" if e["default"] else " [extended: only with time left]"
        batches = e.get("micro_batches")
        split = f", micro-batches {batches}" if batches and len(batches) > 1 else ""
        lines.append(f"  [{e['stage']}] {e['row']}: {e['shape']}; ~{e['device_s']:.1f} s, peak {peak}{split}{extra}")
    problems = []
    if plan["device_s"] > plan["deadline_s"]:
        problems.append(f"the default plan's estimate {plan['device_s']:.0f} s passes the deadline "
                        f"{plan['deadline_s']:.0f} s")
    over = [e["row"] for e in plan["rows"] if e.get("peak_gib") is not None
            and e["peak_gib"] * 2**30 > MEMORY_LIMIT_GB * 1e9]
    if over:
        problems.append(f"rows over {MEMORY_LIMIT_GB} GB: {over}")
    for line in lines:
        print(line)
    print(f"plan: {plan['default_rows']} rows, estimated device time {plan['device_s']:.0f} s, "
          f"peak memory {plan['peak_gib']:.1f} GiB")
    return problems


# ------------------------------------------------------------------------------------ the stages
def emit_row(r: dict) -> None:
    """A stage process's row, for the driver to read (one JSON line)."""
    print(ROW_PREFIX + json.dumps(r, default=str), flush=True)


def stage_smoke(dry_run: bool, deadline_s: float, out_dir: str | None, rates: dict | None) -> None:
    """Versions, tools, imports, the ceilings, one real graph capture, a tiny generate with graphs."""
    import platform

    import torch

    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for name in ("triton", "numpy", "pytest", "hypothesis"):
        spec = importlib.util.find_spec(name)
        versions.append(f"{name} {importlib.import_module(name).__version__ if spec else 'MISSING'}")
    emit_row(row("versions", None, ", ".join(versions) + f", CUDA {torch.version.cuda}"))
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw"
        done = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20)
        emit_row(row("nvidia-smi", None, (done.stdout.strip() or done.stderr.strip())[:300], ok=done.returncode == 0))
    else:
        emit_row(row("nvidia-smi", None, "not found" + ("" if dry_run else " (no NVIDIA driver tools)"),
                     ok=None if dry_run else False))
    from bench.sanitize_kernels import sanitizer_path

    sanitizer = sanitizer_path()
    emit_row(row("compute-sanitizer", None, f"found at {sanitizer}" if sanitizer else "not found (its stage will "
                                                                                      "say not run)"))
    try:
        for module in ("seer_kernels", "seer_runtime.generation", "model_adapters", "bench.gpu_end_to_end"):
            importlib.import_module(module)
        emit_row(row("imports", None, "seer_kernels, seer_runtime, model_adapters, bench", ok=True))
    except Exception as exc:  # noqa: BLE001
        emit_row(row("imports", None, f"failed: {exc!r}"[:300], ok=False))
        return
    if dry_run:
        emit_row(row("ceilings", None, "dry run: the documented rates (gpu_end_to_end.RATES)"))
    else:
        measured = measure_ceilings()
        emit_row(dict(row("ceilings", None, f"device copy {measured['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + "
                                            f"write), bf16 8192^3 product {measured['bf16_flops_per_s'] / 1e12:.0f} "
                                            "TFLOP/s (random data)"), rates=measured))
        emit_row(graph_capture_check())
    emit_row(tiny_generate_check(dry_run))


def measure_ceilings() -> dict:
    """The two ceilings (METHOD.md): a 1 GiB device copy and an 8192^3 bf16 product, medians of 10
    event-timed runs after 3 warm-ups, on random data."""
    import torch

    def median_ms(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(10):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    copy = {"src": torch.randn(2**28, device="cuda")}  # 1 GiB of float32
    copy["dst"] = torch.empty_like(copy["src"])
    copy_ms = median_ms(lambda: copy["dst"].copy_(copy["src"]))
    copy.clear()
    n = 8192
    product = {k: torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for k in ("a", "b")}
    mm_ms = median_ms(lambda: product["a"] @ product["b"])
    product.clear()
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": 2 * 2**30 / (copy_ms * 1e-3), "bf16_flops_per_s": 2 * n**3 / (mm_ms * 1e-3)}


def graph_capture_check() -> dict:
    """One real ``torch.cuda.CUDAGraph``: captured, replayed on new inputs, equal to eager."""
    import torch

    check = "CUDA graph capture and replay"
    try:
        w = torch.randn(512, 512, device="cuda")
        static_in = torch.randn(64, 512, device="cuda")

        def fn(x):
            return torch.softmax(torch.relu(x @ w), dim=-1).sum(dim=0)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn(static_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fn(static_in)
        worst = 0.0
        for seed in range(3):
            x = torch.randn(64, 512, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
            static_in.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            worst = max(worst, float((static_out - fn(x)).abs().max()))
        return row(check, None, f"3 replays, max |replay - eager| = {worst:.3g}", ok=worst == 0.0)
    except Exception as exc:  # noqa: BLE001
        return row(check, None, f"failed: {exc!r}"[:300], ok=False)


def tiny_generate_check(dry_run: bool) -> dict:
    """A tiny LLaDA decoded with ``graphs="cuda"`` and eagerly: the same tokens, graphs captured and
    replayed, no capture failure (a failure's RuntimeWarning is an error here)."""
    import warnings

    import torch

    import model_adapters as ma
    from seer_runtime import GenerationConfig, generate
    check = "tiny generate, graphs='cuda' vs eager"
    device = "cpu" if dry_run else "cuda"
    try:
        torch.manual_seed(0)
        model = ma.build_model(ma.tiny_config("llada-8b-instruct"), device=device, dtype=torch.float32)
        ids = torch.randint(0, 200, (4, 12), device=device)
        gen = GenerationConfig(gen_length=32, steps=32, block_length=16, tie_break="stable")
        eager = generate(model, ids, gen=gen, graphs=None)
        if dry_run:
            return row(check, None, "dry run: eager only (no CUDA)", ok=eager.sequences.shape[1] == 44)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a failed capture must not pass as eager
            graphed = generate(model, ids, gen=gen, graphs="cuda")
        counters = graphed.stats.extra.get("graphs") or {}
        same = bool(torch.equal(graphed.sequences, eager.sequences))
        ok = same and counters.get("failures", 0) == 0 and counters.get("captures", 0) > 0 \
            and counters.get("replays", 0) > 0
        differ = int((graphed.sequences != eager.sequences).sum())
        return row(check, None, f"{'same tokens' if same else f'{differ} tokens differ'}; graphs: {counters}", ok=ok)
    except Exception as exc:  # noqa: BLE001 - a failed capture raises here
        return row(check, None, f"failed: {type(exc).__name__}: {exc}"[:400], ok=False)


def stage_end_to_end(dry_run: bool, deadline_s: float, out_dir: str | None, rates: dict | None) -> None:
    from bench import gpu_end_to_end

    gpu_end_to_end.run(dry_run=dry_run, deadline_s=deadline_s, emit=emit_row, rates=rates)


def stage_profile(dry_run: bool, deadline_s: float, out_dir: str | None, rates: dict | None) -> None:
    from bench import gpu_profile

    gpu_profile.run(dry_run=dry_run, deadline_s=deadline_s, emit=emit_row, out_dir=out_dir)


def stage_tests(dry_run: bool, deadline_s: float, out_dir: str | None, rates: dict | None) -> None:
    """``pytest -m gpu``: every gpu-marked test (kernels, DyLLM's captured sequence, a real graph capture)."""
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/kernels", "tests/runtime", "-p", "no:cacheprovider",
           "-rfEs", "--benchmark-disable"]
    check = "pytest -m gpu tests/kernels tests/runtime"
    if missing:
        emit_row(row(check, None, f"not run: {', '.join(missing)} not installed", ok=False))
        return
    # a dry run collects; a run prints one line per test, counted if the deadline cuts it short
    cmd += ["-q", "--collect-only"] if dry_run else ["-vv"]  # pytest.ini adds -q
    env = dict(os.environ, TRITON_INTERPRET="0")  # tests/conftest.py would default it to 1
    from bench.sanitize_kernels import run_captured

    code, output, seconds = run_captured(cmd, env, max(5.0, deadline_s - 5))
    print(output[-6000:], flush=True)
    if code is None:  # killed at the deadline: what ran so far
        passed, failed = output.count(" PASSED"), output.count(" FAILED") + output.count(" ERROR")
        emit_row(row(check, None, f"cut at the stage deadline ({seconds:.0f} s): {passed} passed, {failed} failed "
                                  "so far", ok=False if failed else None))
        return
    summary = next((line.strip(" =") for line in reversed(output.splitlines())
                    if any(w in line for w in (" passed", " failed", " error", " skipped", " deselected"))), None)
    if summary is None:  # --collect-only -q prints "path: count" per file
        counts = [int(line.rsplit(":", 1)[1]) for line in output.splitlines()
                  if line.startswith("tests/") and line.rsplit(":", 1)[-1].strip().isdigit()]
        summary = f"{sum(counts)} gpu tests collected in {len(counts)} files" if counts else "no summary"
    ok = code == 0 if not dry_run else code in (0, 5)
    emit_row(row(check, None, f"{summary} (rc {code}, {seconds:.0f} s)", ok=ok))


def stage_kernels(dry_run: bool, deadline_s: float, out_dir: str | None, rates: dict | None) -> None:
    """The kernel harnesses with ``quick=True`` (``SEER_GPU_CHECK_FAMILIES``: some of :data:`FAMILIES`)."""
    start = time.perf_counter()
    chosen = [f for f in os.environ.get("SEER_GPU_CHECK_FAMILIES", "").split(",") if f]
    for module_name in [FAMILIES[f] for f in chosen] or KERNEL_FAMILIES:
        family = module_name.rsplit(".", 1)[1].removeprefix("bench_")
        if time.perf_counter() - start > deadline_s * 0.9:
            emit_row(row(f"{family}", None, "not run: the stage deadline"))
            continue
        try:
            module = importlib.import_module(module_name)
            rows = module.run(quick=True, dry_run=dry_run)
        except Exception as exc:  # noqa: BLE001 - one family failing must not hide the others
            traceback.print_exc()
            rows = [row("crashed", None, repr(exc)[:200], ok=False)]
        for r in rows:
            r["check"] = f"{family}: {r['check']}"
            emit_row(r)


def stage_sanitizer(dry_run: bool, deadline_s: float, out_dir: str | None, rates: dict | None) -> None:
    from bench import sanitize_kernels

    for r in sanitize_kernels.run(dry_run=dry_run, deadline_s=deadline_s):
        emit_row(r)


STAGE_FUNCTIONS = {"smoke": stage_smoke, "end_to_end": stage_end_to_end, "profile": stage_profile,
                   "tests": stage_tests, "kernels": stage_kernels, "sanitizer": stage_sanitizer}


# ------------------------------------------------------------------------------------ the driver
class Log:
    """Prints to the console and appends to ``$OUT/gpu_check.log`` when OUT is set."""

    def __init__(self, out_dir: str | None) -> None:
        self.file = open(Path(out_dir, "gpu_check.log"), "a") if out_dir else None  # noqa: SIM115

    def __call__(self, text: str, *, console: bool = True) -> None:
        if console:
            print(text, flush=True)
        if self.file:
            self.file.write(text + "\n")
            self.file.flush()


def run_stage(stage: str, limit_s: float, *, dry_run: bool, out_dir: str | None, rates: dict | None,
              log: Log) -> list[dict]:
    """One stage in a process of its own (its own session: killed with its children at ``limit_s``);
    rows print as they come (a dry run prints only failed ones: the rest go to the log), other output
    goes to the log (its tail to the console on failure)."""
    cmd = [sys.executable, "-m", "bench.gpu_check", "--stage", stage, "--stage-deadline-s", f"{limit_s:.0f}"]
    if dry_run:
        cmd.append("--dry-run")
    if rates:
        cmd += ["--rates", json.dumps(rates)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    if dry_run:
        env["SEER_KERNEL_BACKEND"] = "reference"  # the Triton interpreter would take minutes at these shapes
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()

    def reader():
        for raw in proc.stdout:
            lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    rows: list[dict] = []
    tail: list[str] = []
    start = time.perf_counter()
    timed_out = False
    while True:
        left = limit_s - (time.perf_counter() - start)
        try:
            line = lines.get(timeout=max(0.1, left))
        except queue.Empty:
            line = ""
            if time.perf_counter() - start >= limit_s:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                break
            continue
        if line is None:
            break
        if line.startswith(ROW_PREFIX):
            r = json.loads(line[len(ROW_PREFIX):])
            r["family"] = stage
            rows.append(r)
            log(format_row(stage, r), console=not dry_run or r.get("ok") is False)
        else:
            tail = (tail + [line])[-15:]
            log(line, console=False)
    proc.wait()
    seconds = time.perf_counter() - start
    if timed_out:
        rows.append(dict(row("stage deadline", None, f"killed after {limit_s:.0f} s; the {len(rows)} rows before "
                                                     "it are kept", ok=False), family=stage))
        log(format_row(stage, rows[-1]))
    elif proc.returncode != 0:
        rows.append(dict(row("stage process", None, f"exited with {proc.returncode}", ok=False), family=stage))
        log(format_row(stage, rows[-1]))
        log("\n".join("    | " + t for t in tail))
    log(f"[{stage}] done in {seconds:.1f} s (limit {limit_s:.0f} s)")
    return rows


def summary(rows: list[dict], started: float, deadline_s: float, *, dry_run: bool = False) -> str:
    """The final summary, under :data:`SUMMARY_LIMIT` characters: a head line, the failed rows, then
    every row but the kernel harnesses' (counted in one line; all are in ``gpu_rows.json``), notes cut
    shorter until it fits. A dry run: one line per stage."""
    failed = [r for r in rows if r.get("ok") is False]
    head = (f"## gpu_check{' (dry run)' if dry_run else ''}: {len(rows)} rows, {len(failed)} failed, "
            f"{time.perf_counter() - started:.0f} s of {deadline_s:.0f} s")
    stages = {}
    for r in rows:
        stages.setdefault(r.get("family", "?"), []).append(r)
    per_stage = [f"- {stage}: {len(rs)} rows, {sum(1 for r in rs if r.get('ok') is False)} failed"
                 for stage, rs in stages.items()]
    if dry_run:
        lines = [head, *per_stage] + [f"FAILED [{r['family']}] {r['check']}: {str(r.get('note', ''))[:200]}"
                                      for r in failed]
        return "\n".join(lines)[:SUMMARY_LIMIT]
    shown = [r for r in rows if r.get("family") != "kernels" or r.get("ok") is False]
    kernels = stages.get("kernels", [])
    for width in (300, 200, 140, 100, 70, 40):
        short = [dict(r, note=str(r.get("note", ""))[:width], check=str(r["check"])[:110]) for r in shown]
        text = "\n".join([head, *per_stage]) + "\n" + table(short)
        if kernels:
            text += f"\nkernel harness rows: {len(kernels)} (gpu_rows.json)"
        if len(text) <= SUMMARY_LIMIT:
            return text
    return text[: SUMMARY_LIMIT - 40] + "\n... (cut: see gpu_rows.json)"


def drive(args) -> int:
    out_dir = os.environ.get("OUT") or None
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    plan = build_plan(args.deadline_s)
    print(f"gpu_check plan (deadline {args.deadline_s:.0f} s, H200 rates {rates_note()}):", flush=True)
    problems = print_plan(plan)
    if out_dir and (args.dry_run or args.plan_only):
        Path(out_dir, "gpu_plan.json").write_text(json.dumps(plan, indent=1))
    if problems:
        print("gpu_check: refusing the plan: " + "; ".join(problems), file=sys.stderr)
        return 1
    if args.plan_only:
        return 0
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device (--dry-run runs every stage on the CPU at tiny shapes)", file=sys.stderr)
            return 2
    log = Log(out_dir)
    started = time.perf_counter()
    wanted = [s for s in STAGES if (not args.only or s in args.only) and s not in args.skip]
    rows: list[dict] = []
    rates = None
    bank = 0.0
    for i, stage in enumerate(wanted):
        elapsed = time.perf_counter() - started
        later = sum(BUDGET_S[s] for s in wanted[i + 1:] if s != "sanitizer") * 0.5  # keep half for later stages
        limit = min(BUDGET_S[stage] + bank, args.deadline_s - elapsed - later)
        if limit < 10:
            rows.append(dict(row("stage", None, f"not run: {args.deadline_s - elapsed:.0f} s left"), family=stage))
            log(format_row(stage, rows[-1]))
            continue
        stage_start = time.perf_counter()
        stage_rows = run_stage(stage, limit, dry_run=args.dry_run, out_dir=out_dir, rates=rates, log=log)
        bank = max(0.0, limit - (time.perf_counter() - stage_start))
        rows += stage_rows
        for r in stage_rows:
            if r.get("rates"):
                rates = r["rates"]
        if out_dir:
            Path(out_dir, "gpu_rows.json").write_text(json.dumps(rows, indent=1, default=str))
    text = summary(rows, started, args.deadline_s, dry_run=args.dry_run)
    if out_dir:
        Path(out_dir, "gpu_summary.md").write_text(text)
    log("\n" + text)
    return 1 if any(r.get("ok") is False for r in rows) else 0


def rates_note() -> str:
    from bench.gpu_end_to_end import EFFICIENCY, RATES

    return (f"copy {RATES['copy_bytes_per_s'] / 1e12:.1f} TB/s at {EFFICIENCY['memory']:.0%}, bf16 "
            f"{RATES['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s at {EFFICIENCY['matmul']:.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                        help=f"seconds for every stage together (default {DEFAULT_DEADLINE_S})")
    parser.add_argument("--dry-run", action="store_true", help="the plan, then every stage on the CPU at tiny shapes")
    parser.add_argument("--plan-only", action="store_true", help="the plan alone")
    parser.add_argument("--only", default="", help=f"comma-separated stages of {STAGES} (or kernel families of "
                                                   f"{list(FAMILIES)}: the kernels stage with those alone)")
    parser.add_argument("--skip", default="", help="comma-separated stages to leave out (e.g. sanitizer)")
    parser.add_argument("--stage", default="", help=argparse.SUPPRESS)  # a stage process (the driver runs these)
    parser.add_argument("--stage-deadline-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--rates", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    families = [f for f in args.only.split(",") if f in FAMILIES]
    if families:  # ``--only dyllm_kernels``: the kernels stage with that harness alone
        os.environ["SEER_GPU_CHECK_FAMILIES"] = ",".join(families)
        args.only = ",".join(dict.fromkeys("kernels" if f in FAMILIES else f for f in args.only.split(",") if f))
    for name in ("only", "skip"):
        chosen = [s for s in getattr(args, name).split(",") if s]
        unknown = [s for s in chosen if s not in STAGES]
        if unknown:
            parser.error(f"--{name}: unknown stages {unknown}; choose from {list(STAGES)}")
        setattr(args, name, chosen)
    if args.deadline_s <= 0:
        parser.error(f"--deadline-s must be > 0, got {args.deadline_s}")
    if args.stage:
        if args.stage not in STAGE_FUNCTIONS:
            parser.error(f"--stage: unknown stage {args.stage!r}")
        rates = json.loads(args.rates) if args.rates else None
        STAGE_FUNCTIONS[args.stage](args.dry_run, args.stage_deadline_s, os.environ.get("OUT") or None, rates)
        return 0
    return drive(args)


def main_for_family(family: str, parser: argparse.ArgumentParser) -> None:
    """``python -m bench.bench_<family>``: that kernel harness alone (no tests)."""
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at tiny shapes")
    args = parser.parse_args()
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(f"{family}: no CUDA device (--dry-run runs the harness on the CPU)", file=sys.stderr)
            sys.exit(2)
    module = importlib.import_module(FAMILIES[family])
    rows = module.run(quick=args.quick, dry_run=args.dry_run)
    for r in rows:
        r["family"] = family
        print(format_row(family, r), flush=True)
    print("\n" + table(rows))
    sys.exit(1 if any(r.get("ok") is False for r in rows) else 0)


if __name__ == "__main__":
    sys.exit(main())
