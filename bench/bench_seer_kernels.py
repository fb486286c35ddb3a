"""Microbenchmarks of the Seer probe ops: ``mlp_sparsity``, ``swiglu_sparsity``, ``snr_boundary``.

CPU (always): pytest-benchmark times the torch references - the router's eager fallback - at
small but meaningful shapes and prints the ideal bytes moved and the GB/s achieved.
CUDA (skipped without a device): ``triton.testing.do_bench`` (device events, median) times the
Triton kernels and prints the fraction of peak memory bandwidth (``SEER_PEAK_BW`` in B/s,
default an H200's 4.8e12).

    .venv/bin/pytest bench/bench_seer_kernels.py -s                      # timings
    .venv/bin/pytest bench/bench_seer_kernels.py --benchmark-disable -s  # smoke (CI): one call each

CPU timings run on ``SEER_BENCH_THREADS`` torch threads (default 1): on a machine whose cores
are shared, torch's OpenMP pool spin-waits and multi-threaded medians swing by 5-50x.

"Bytes moved" is the ideal traffic (every input read once, every output written once); the
eager reference moves more (it materialises fp32 and boolean temporaries), which is the point
of the fused kernels.
"""

from __future__ import annotations

import importlib
import time

import pytest
import torch

from bench.gpu_seer_kernels import (
    mlp_sparsity_bytes,
    peak_bandwidth,
    planted_profiles,
    snr_boundary_bytes,
    swiglu_sparsity_bytes,
)

pytestmark = [pytest.mark.bench]

# the modules (the package attributes of the same names are the ops)
_mlp = importlib.import_module("seer_kernels.mlp_sparsity")
_snr = importlib.import_module("seer_kernels.snr_boundary")

# CPU shapes: a batch of 4 windows of 128 tokens over a 2048-wide MLP (a small model's size)
R, T, F = 4, 128, 2048
B, N = 64, 256  # Seer's boundary scan: batch 64, window 256


def _median_seconds(benchmark, fn) -> float:
    """pytest-benchmark's median when it ran; with --benchmark-disable, a few perf_counter repeats."""
    if benchmark.stats is not None:
        return benchmark.stats.stats.median
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def _report(benchmark, name: str, nbytes: int, fn) -> None:
    seconds = _median_seconds(benchmark, fn)
    benchmark.extra_info.update({"bytes": nbytes, "GB/s": nbytes / seconds / 1e9})
    rate = nbytes / seconds / 1e9
    print(f"\n{name} ({torch.get_num_threads()} thread(s)): {seconds * 1e3:.3f} ms median, ", end="")
    print(f"{nbytes / 1e6:.2f} MB moved, {rate:.2f} GB/s")


# ------------------------------------------------------------------------------ CPU references


def test_mlp_sparsity_reference_cpu(benchmark, cpu_threads):
    act = torch.randn(R, T, F)
    lengths = torch.full((R,), T - 3)
    fn = lambda: _mlp.mlp_sparsity_reference(act, 0.1, lengths=lengths)  # noqa: E731
    out = benchmark(fn)
    assert out.shape == (R, T) and out.dtype == torch.float32
    assert torch.isnan(out[:, T - 3 :]).all() and not torch.isnan(out[:, : T - 3]).any()
    _report(benchmark, f"mlp_sparsity_reference [{R},{T},{F}] fp32", mlp_sparsity_bytes(R * T, F, 4), fn)


def test_swiglu_sparsity_reference_cpu(benchmark, cpu_threads):
    gate, up = torch.randn(R, T, F), torch.randn(R, T, F)
    out = torch.empty(R, T, F)
    fn = lambda: _mlp.swiglu_sparsity_reference(gate, up, 0.05, out=out)  # noqa: E731
    product, sparsity = benchmark(fn)
    assert product.data_ptr() == out.data_ptr() and sparsity.shape == (R, T)
    assert torch.equal(product, torch.nn.functional.silu(gate) * up)
    _report(
        benchmark, f"swiglu_sparsity_reference [{R},{T},{F}] fp32", swiglu_sparsity_bytes(R * T, F, 4), fn
    )


def test_snr_boundary_reference_cpu(benchmark, cpu_threads):
    s, valid_len = planted_profiles(B, N, device="cpu", dtype=torch.float32)
    fn = lambda: _snr.snr_boundary_reference(s, valid_len)  # noqa: E731
    out = benchmark(fn)
    assert out.dtype == torch.int32 and out.shape == (B,)
    assert ((out >= 0) & (out <= valid_len)).all()
    _report(benchmark, f"snr_boundary_reference [{B},{N}] fp32", snr_boundary_bytes(B, N, 4), fn)


# ---------------------------------------------------------------------------- CUDA (Triton)


def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the Triton kernels are timed on GPU only (CPU runs the reference above)")
    from seer_kernels import interpreting

    if interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set: timings would be of the interpreter, not the kernel")


def _do_bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def _print_bandwidth(name: str, nbytes: int, ms: float) -> float:
    achieved = nbytes / (ms * 1e-3)
    fraction = achieved / peak_bandwidth()
    print(f"\n{name}: {ms:.4f} ms median, {achieved / 1e9:.0f} GB/s = {fraction:.1%} of peak bandwidth")
    return fraction


@pytest.mark.gpu
@pytest.mark.parametrize("F_model", [12288, 18944], ids=["llada", "dream"])
def test_mlp_sparsity_triton_cuda(F_model):
    _cuda_or_skip()
    act = torch.randn(64, 256, F_model, device="cuda", dtype=torch.bfloat16)
    out = _mlp.mlp_sparsity(act, 0.01)
    assert torch.equal(out, _mlp.mlp_sparsity_reference(act, 0.01))
    ms = _do_bench_ms(lambda: _mlp.mlp_sparsity(act, 0.01))
    fraction = _print_bandwidth(
        f"mlp_sparsity [64,256,{F_model}] bf16", mlp_sparsity_bytes(64 * 256, F_model, 2), ms
    )
    assert fraction > 0


@pytest.mark.gpu
@pytest.mark.parametrize("F_model", [12288, 18944], ids=["llada", "dream"])
def test_swiglu_sparsity_triton_cuda(F_model):
    _cuda_or_skip()
    gate = torch.randn(64, 256, F_model, device="cuda", dtype=torch.bfloat16)
    up = torch.randn(64, 256, F_model, device="cuda", dtype=torch.bfloat16)
    product = torch.empty_like(gate)
    fused = _do_bench_ms(lambda: _mlp.swiglu_sparsity(gate, up, 0.01, out=product))
    unfused = _do_bench_ms(lambda: torch.nn.functional.silu(gate) * up)
    fraction = _print_bandwidth(
        f"swiglu_sparsity [64,256,{F_model}] bf16", swiglu_sparsity_bytes(64 * 256, F_model, 2), fused
    )
    print(f"unfused F.silu(g)*u {unfused:.4f} ms; fused/unfused {fused / unfused:.3f} (goal <= 1.10)")
    assert fraction > 0


@pytest.mark.gpu
def test_snr_boundary_triton_cuda():
    _cuda_or_skip()
    s, valid_len = planted_profiles(B, N, device="cuda", dtype=torch.float32)
    out = _snr.snr_boundary(s, valid_len)
    assert torch.equal(out, _snr.snr_boundary_reference(s, valid_len))
    ms = _do_bench_ms(lambda: _snr.snr_boundary(s, valid_len))
    fraction = _print_bandwidth(
        f"snr_boundary [{B},{N}] fp32 (launch-bound)", snr_boundary_bytes(B, N, 4), ms
    )
    assert fraction > 0
