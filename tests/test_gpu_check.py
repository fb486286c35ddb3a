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
    for mode in ("baseline", "dyllm (exact attention)", "seer (oracle L*) + dyllm", "router",
                 "threshold (a block per forward)", "seer (oracle L*) + threshold", "block cache: dual"):
        assert f": {mode}" in out
