"""bench/gpu_check.sh before any device time is spent on it (issue 33): its default plan fits the
deadline and 120 GB, its dry run runs every stage on the CPU through the same processes and
deadlines, its sanitizer stage reads summaries and survives timeouts, and the GPU test selection
holds every kernel's gpu tests and the graph cache's real capture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import gpu_check, gpu_end_to_end
from seer_runtime.memory import GB, ModelDims

ROOT = Path(__file__).resolve().parent.parent


def test_default_plan_fits_the_deadline_and_120_gb(tmp_path, capsys, monkeypatch):
    """``--plan-only``: every row's shapes, device time and peak memory, the totals last, the plan in
    $OUT/gpu_plan.json; the default rows' estimate is under the default deadline, every row under 120 GB."""
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--plan-only"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    m = re.fullmatch(r"plan: (\d+) rows, estimated device time (\d+) s, peak memory ([\d.]+) GiB", out[-1])
    assert m, out[-1]
    plan = json.loads((tmp_path / "gpu_plan.json").read_text())
    assert int(m.group(1)) == plan["default_rows"] == sum(e["default"] for e in plan["rows"])
    assert plan["device_s"] < gpu_check.DEFAULT_DEADLINE_S
    assert all(e["peak_gib"] is None or e["peak_gib"] * 2**30 <= 120 * GB for e in plan["rows"])
    stages = {e["stage"] for e in plan["rows"]}
    assert stages == set(gpu_check.STAGES)
    rows = {e["row"] for e in plan["rows"]}
    for needed in ("baseline", "dyllm", "seer (oracle L*)", "threshold (a block per forward)",
                   "serving batch 64: router", "serving batch 256: router", "dyllm sparse step 6"):
        assert needed in rows
    # batch 256 with a 1000-position prefix does not fit at once: it is planned in micro-batches
    big = next(e for e in plan["rows"] if e["row"] == "serving batch 256: vanilla")
    assert len(big["micro_batches"]) > 1 and sum(big["micro_batches"]) == 256


def test_plan_over_the_deadline_is_refused(capsys):
    assert gpu_check.main(["--plan-only", "--deadline-s", "60"]) == 1
    assert "refusing the plan" in capsys.readouterr().err


def test_plan_dims_are_the_8b_model():
    import model_adapters as ma

    model = ma.build_model(ma.tiny_config("llada-8b-instruct", **gpu_end_to_end.LLADA_8B), device="meta",
                           dtype=torch.bfloat16)
    assert ModelDims.from_model(model) == gpu_end_to_end.LLADA_8B_DIMS


@pytest.mark.slow
def test_dry_run_runs_every_stage(tmp_path):
    """``bash bench/gpu_check.sh --dry-run``: the plan, then every stage at tiny shapes on the CPU in its
    own process; a short output, the rows and the summary in $OUT."""
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert len(done.stdout) < 8000
    for stage in gpu_check.STAGES:
        assert f"[{stage}] done in" in done.stdout
        assert re.search(rf"- {stage}: \d+ rows, 0 failed", done.stdout)
    rows = json.loads((tmp_path / "gpu_rows.json").read_text())
    checks = {r["check"] for r in rows}
    assert "tiny generate, graphs='cuda' vs eager" in checks
    assert any(c.startswith("profile: dyllm sparse step 6") for c in checks)
    tests = next(r for r in rows if r["family"] == "tests")
    assert re.match(r"\d+ gpu tests collected in 11 files", tests["note"]), tests["note"]
    for name in ("gpu_check.log", "gpu_plan.json", "gpu_summary.md", "gpu_profile.json"):
        assert (tmp_path / name).exists()
    assert len((tmp_path / "gpu_summary.md").read_text()) < gpu_check.SUMMARY_LIMIT


def test_gpu_selection_holds_every_kernel_and_the_real_graph_capture():
    """``pytest -m gpu tests/kernels tests/runtime`` collects rms_norm's and rotary_embedding's gpu
    tests and the graphs' real CUDA-graph capture (tests/runtime/test_graphs.py)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/kernels", "tests/runtime",
                           "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    for name in ("test_rms_norm_gpu.py", "test_rotary_embedding_gpu.py", "test_graphs.py",
                 "test_partial_attention_gpu.py", "test_row_linear_gpu.py"):
        assert name in done.stdout


def test_sanitizer_rows_pass_only_on_a_clean_summary(monkeypatch):
    """bench/sanitize_kernels.py reads the sanitizer's summary: a clean memcheck passes, any error or
    failed call fails, a refused device or a missing summary never passes, and racecheck's hazards are
    left to inspect beside the upstream issue rather than failed."""
    from bench import sanitize_kernels as sz

    assert sz.summary_counts("memcheck", "========= ERROR SUMMARY: 0 errors") == (0, 0)
    assert sz.summary_counts("memcheck", "========= ERROR SUMMARY: 2 errors") == (2, 0)
    racecheck = "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)"
    assert sz.summary_counts("racecheck", racecheck) == (0, 1)
    assert sz.summary_counts("racecheck", "nothing here") is None

    def verdict(tool, output, code=0):
        monkeypatch.setattr(sz, "run_captured", lambda *a, **k: (code, output, 1.0))
        return sz.sanitize(tool, "compute-sanitizer", timeout_s=1)

    clean = "  row_linear torch.float32: ran\n========= ERROR SUMMARY: 0 errors"
    assert verdict("memcheck", clean)["ok"] is True
    assert verdict("memcheck", "========= ERROR SUMMARY: 1 error", 3)["ok"] is False
    hazards = verdict("racecheck", racecheck)
    assert hazards["ok"] is None and sz.RACE_ISSUE in hazards["note"]
    raised = "  rms_norm torch.bfloat16: FAILED ValueError: x\n========= ERROR SUMMARY: 0 errors"
    failed = verdict("memcheck", raised, 1)
    assert failed["ok"] is False and "rms_norm" in failed["note"]
    refused = verdict("memcheck", "========= Error: Device not supported", 1)
    assert refused["ok"] is None and refused["note"].startswith("not run")
    assert verdict("memcheck", "Segmentation fault", 139)["ok"] is False
    timed_out = verdict("memcheck", "  mlp_sparsity torch.float32: ran\n", None)
    assert timed_out["ok"] is False and "1 calls had run" in timed_out["note"]
    monkeypatch.setenv("SEER_SANITIZER_TOOLS", "memcheck,nope")
    with pytest.raises(ValueError, match="nope"):
        sz.tools_wanted()


def test_a_timeout_kills_the_process_group_and_keeps_the_output():
    """run_captured: past its timeout the command and its children are killed, what it printed is kept."""
    from bench.sanitize_kernels import run_captured

    script = ("import subprocess, sys, time; print('before the hang', flush=True); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    start = time.perf_counter()
    code, output, seconds = run_captured([sys.executable, "-c", script], dict(os.environ), 3)
    assert code is None and "before the hang" in output
    assert time.perf_counter() - start < 30  # the grandchild holding the pipe was killed too
