"""bench/gpu_check.sh's dry run: every GPU harness (kernel timings, the end-to-end rows at full
depth) runs on the CPU at tiny shapes, and the end-to-end check builds its full-size models on the
meta device, so the script a GPU session runs once has been run in CI."""

from __future__ import annotations

import pytest

from bench import gpu_check

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_runs_every_harness(capsys, reference_kernels):
    """The public ops on their references (the Triton kernels through the interpreter would take
    many minutes end to end here; the kernel harnesses call their kernels directly)."""
    status = gpu_check.main(["--dry-run"])
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    for family in gpu_check.FAMILIES:
        assert f"[{family}] done in" in out
    assert "llada full-size model on the meta device: ok=True 8.02B parameters, 32 layers" in out
    assert "dream full-size model on the meta device: ok=True 7.62B parameters, 28 layers" in out
    assert "crashed" not in out
    assert "[sanitizer] every op, float32 and bfloat16, on the references: ok=True" in out
    for tool in ("memcheck", "racecheck"):
        assert f"would run compute-sanitizer --tool {tool} --error-exitcode 3" in out
    for mode in ("baseline", "dyllm (exact attention)", "seer (oracle L*) + dyllm", "router",
                 "threshold (a block per forward)", "seer (oracle L*) + threshold", "block cache: dual"):
        assert f": {mode}" in out


def test_sanitizer_rows_pass_only_on_a_clean_summary():
    """bench/sanitize_kernels.py reads the sanitizer's summary: a clean one passes, any error,
    hazard or failed call fails, and a refused device or a missing summary never passes."""
    from bench import sanitize_kernels as sz

    assert sz.summary_counts("memcheck", "========= ERROR SUMMARY: 0 errors") == (0, 0)
    assert sz.summary_counts("memcheck", "========= ERROR SUMMARY: 2 errors") == (2, 0)
    racecheck = "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)"
    assert sz.summary_counts("racecheck", racecheck) == (0, 1)
    assert sz.summary_counts("racecheck", "nothing here") is None

    class Done:
        def __init__(self, stdout, returncode=0):
            self.stdout, self.stderr, self.returncode = stdout, "", returncode

    def verdict(monkeypatch, tool, stdout, returncode=0):
        monkeypatch.setattr(sz.subprocess, "run", lambda *a, **k: Done(stdout, returncode))
        return sz.sanitize(tool, "compute-sanitizer", timeout_s=1)

    with pytest.MonkeyPatch.context() as mp:
        clean = "  row_linear torch.float32: ran\n========= ERROR SUMMARY: 0 errors"
        assert verdict(mp, "memcheck", clean)["ok"] is True
        assert verdict(mp, "memcheck", "========= ERROR SUMMARY: 1 error", 3)["ok"] is False
        assert verdict(mp, "racecheck", racecheck)["ok"] is False
        raised = "  rms_norm torch.bfloat16: FAILED ValueError: x\n========= ERROR SUMMARY: 0 errors"
        failed = verdict(mp, "memcheck", raised, 1)
        assert failed["ok"] is False and "rms_norm" in failed["note"]
        refused = verdict(mp, "memcheck", "========= Error: Device not supported", 1)
        assert refused["ok"] is None and refused["note"].startswith("not run")
        assert verdict(mp, "memcheck", "Segmentation fault", 139)["ok"] is False
