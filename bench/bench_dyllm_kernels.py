"""Microbenchmarks of the DyLLM ops: cosine_saliency, gather_rows/scatter_rows, partial_attention.

CPU (always): pytest-benchmark times the torch references - the router's eager fallback - at
mid-size shapes. For partial attention it also times the dense case (every query row salient,
the same code) side by side, interleaved, and prints the measured ratio next to the ideal FLOP
ratio: ``QK^T`` is needed for every (query, key) pair whatever the salient fraction (the softmax
normaliser covers every key), only the ``P @ V`` half shrinks with ``|A| / N``, so the ideal
ratio tends to 0.5, not 0, as the salient fraction goes to 0. The key correction (``k_old``) is
timed against the plain update the same way.
CUDA (skipped without a device): ``triton.testing.do_bench`` (device events, median) times the
Triton kernels the same way.

    .venv/bin/pytest bench/bench_dyllm_kernels.py -s                      # timings
    .venv/bin/pytest bench/bench_dyllm_kernels.py --benchmark-disable -s  # smoke (CI): one call each

CPU timings run on ``SEER_BENCH_THREADS`` torch threads (default 1): on a machine whose cores
are shared, torch's OpenMP pool spin-waits and multi-threaded medians swing widely.
"""

from __future__ import annotations

import importlib
import time

import pytest
import torch

from bench.gpu_dyllm_kernels import dyllm_attention_inputs, peak_bandwidth, saliency_pair, with_k_old

pytestmark = [pytest.mark.bench]

# the modules (the package attributes of the same names are the ops)
_cs = importlib.import_module("seer_kernels.cosine_saliency")
_rg = importlib.import_module("seer_kernels.row_gather_scatter")
_pa = importlib.import_module("seer_kernels.partial_attention")

# CPU shapes: 8 sequences of 256 tokens of a 1024-wide model; attention: 2 sequences, prompt
# 192 + response 64, 8 heads of 64
N, D = 2048, 1024
B, PROMPT, RESPONSE, H, HK, HEAD_DIM = 2, 192, 64, 8, 8, 64


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


def _interleaved_medians(fns: list, repeats: int) -> list[float]:
    """Median seconds of each function, timed in alternation so machine noise hits all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [sorted(t)[len(t) // 2] for t in times]


# ------------------------------------------------------------------------------ CPU references


def test_cosine_saliency_reference_cpu(benchmark, cpu_threads):
    ctx, cache = saliency_pair(N, D, 0.2)
    fn = lambda: _cs.cosine_saliency_reference(ctx, cache, 0.99)  # noqa: E731
    index, count, sim = benchmark(fn)
    assert 0.1 * N < int(count) < 0.3 * N and sim.shape == (N,)
    assert bool((index[1 : int(count)] > index[: int(count) - 1]).all())
    seconds = _median_seconds(benchmark, fn)
    nbytes = 2 * N * D * 4 + N * 4 * 2
    print(
        f"\ncosine_saliency_reference [{N},{D}] fp32 ({cpu_threads} thread(s)): {seconds * 1e3:.3f} ms, "
        f"{nbytes / seconds / 1e9:.2f} GB/s, {int(count)} salient"
    )


def test_gather_rows_reference_cpu(benchmark, cpu_threads):
    ctx, cache = saliency_pair(N, 64, 0.2)
    index, count, _ = _cs.cosine_saliency_reference(ctx, cache, 0.99)
    src = torch.randn(N, D)
    out = torch.empty(N, D)
    fn = lambda: _rg.gather_rows_reference(src, index, count, out=out)  # noqa: E731
    benchmark(fn)
    n = int(count)
    assert torch.equal(out[:n], src[index[:n].long()]) and not out[n:].any()
    seconds = _median_seconds(benchmark, fn)
    print(
        f"\ngather_rows_reference {n}/{N} rows x {D} fp32: {seconds * 1e3:.3f} ms "
        f"(ideal {2 * n * D * 4 / 1e6:.1f} MB live + {(N - n) * D * 4 / 1e6:.1f} MB zero tail)"
    )


def test_scatter_rows_reference_cpu(benchmark, cpu_threads):
    ctx, cache = saliency_pair(N, 64, 0.2)
    index, count, _ = _cs.cosine_saliency_reference(ctx, cache, 0.99)
    src = torch.randn(N, D)
    dst = torch.zeros(N, D)
    fn = lambda: _rg.scatter_rows_reference(dst, index, count, src)  # noqa: E731
    benchmark(fn)
    n = int(count)
    assert torch.equal(dst[index[:n].long()], src[:n])
    seconds = _median_seconds(benchmark, fn)
    print(f"\nscatter_rows_reference {n}/{N} rows x {D} fp32: {seconds * 1e3:.3f} ms")


@pytest.mark.parametrize("response_only", [True, False], ids=["response_only", "full"])
@pytest.mark.parametrize("frac", [0.05, 0.2])
def test_partial_attention_reference_cpu(benchmark, cpu_threads, frac, response_only):
    args, dense_flops, ideal_flops = dyllm_attention_inputs(
        B, PROMPT, RESPONSE, H, HK, HEAD_DIM, frac, response_only=response_only, seed=1
    )
    dense_args, _, _ = dyllm_attention_inputs(
        B, PROMPT, RESPONSE, H, HK, HEAD_DIM, 1.0, response_only=response_only, seed=1
    )
    partial = lambda: _pa.partial_attention_reference(**args)  # noqa: E731
    dense = lambda: _pa.partial_attention_reference(**dense_args)  # noqa: E731
    out = benchmark(partial)
    assert out.shape == args["q"].shape and not out.isnan().any()
    repeats = 3 if benchmark.stats is None else 7
    t_partial, t_dense = _interleaved_medians([partial, dense], repeats)
    ideal = ideal_flops / dense_flops
    label = "response-only" if response_only else "full"
    print(
        f"\npartial_attention_reference {frac:.0%} salient, {label} step, B={B} prompt={PROMPT} "
        f"response={RESPONSE} H={H} d={HEAD_DIM} fp32 ({cpu_threads} thread(s)): "
        f"{t_partial * 1e3:.3f} ms vs dense {t_dense * 1e3:.3f} ms; "
        f"measured ratio {t_partial / t_dense:.3f}, ideal FLOP ratio {ideal:.3f}"
    )
    benchmark.extra_info.update({"ideal_ratio": ideal, "measured_ratio": t_partial / t_dense})
    assert 0.5 <= ideal < 1.0


def test_partial_attention_reference_key_correction_cpu(benchmark, cpu_threads):
    args, _, _ = dyllm_attention_inputs(B, PROMPT, RESPONSE, H, HK, HEAD_DIM, 0.2, response_only=True, seed=1)
    corrected_args = with_k_old(args, seed=1)
    plain = lambda: _pa.partial_attention_reference(**args)  # noqa: E731
    corrected = lambda: _pa.partial_attention_reference(**corrected_args)  # noqa: E731
    out = benchmark(corrected)
    assert out.shape == args["q"].shape and not out.isnan().any()
    t_corrected, t_plain = _interleaved_medians([corrected, plain], 3 if benchmark.stats is None else 7)
    print(
        f"\npartial_attention_reference 20% salient + k_old, response-only step ({cpu_threads} thread(s)): "
        f"{t_corrected * 1e3:.3f} ms vs plain update {t_plain * 1e3:.3f} ms ({t_corrected / t_plain:.2f}x)"
    )


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


@pytest.mark.gpu
def test_cosine_saliency_triton_cuda():
    _cuda_or_skip()
    rows = 16 * 1256
    ctx, cache = saliency_pair(rows, 4096, 0.2, device="cuda", dtype=torch.bfloat16)
    index, count, _ = _cs.cosine_saliency(ctx, cache, 0.99)
    r_index, r_count, _ = _cs.cosine_saliency_reference(ctx, cache, 0.99)
    assert abs(int(count) - int(r_count)) <= 2  # only rows within rounding of tau may flip
    ms = _do_bench_ms(lambda: _cs.cosine_saliency(ctx, cache, 0.99))
    nbytes = 2 * rows * 4096 * 2
    print(
        f"\ncosine_saliency [{rows},4096] bf16: {ms:.4f} ms, {nbytes / ms / 1e9:.0f} GB/s "
        f"= {nbytes / (ms * 1e-3) / peak_bandwidth():.1%} of peak"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("frac", [0.05, 0.2, 1.0])
def test_partial_attention_triton_cuda(frac):
    _cuda_or_skip()
    shape = dict(batch=16, prompt=1000, response=256, H=32, Hk=32, d=128)
    args, dense_flops, ideal_flops = dyllm_attention_inputs(
        *shape.values(), frac, response_only=True, device="cuda", dtype=torch.bfloat16, seed=2
    )
    dense_args, _, _ = dyllm_attention_inputs(
        *shape.values(), 1.0, response_only=True, device="cuda", dtype=torch.bfloat16, seed=2
    )
    out = torch.empty_like(args["q"])
    t_partial = _do_bench_ms(lambda: _pa.partial_attention(**args, out=out))
    t_dense = _do_bench_ms(lambda: _pa.partial_attention(**dense_args, out=out))
    corrected_args = with_k_old(args, seed=2)
    t_corrected = _do_bench_ms(lambda: _pa.partial_attention(**corrected_args, out=out))
    print(
        f"\npartial_attention {frac:.0%} salient LLaDA-8B response-only bf16: {t_partial:.4f} ms vs "
        f"dense {t_dense:.4f} ms; measured {t_partial / t_dense:.3f}, ideal {ideal_flops / dense_flops:.3f}; "
        f"with k_old {t_corrected:.4f} ms"
    )
    assert t_partial > 0 and t_corrected > 0
