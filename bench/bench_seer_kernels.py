"""Benchmarks of the Seer probe ops: ``mlp_sparsity``, ``swiglu_sparsity``, ``snr_boundary``.

CPU (pytest, always): pytest-benchmark times the torch references - the router's eager
fallback - at small but meaningful shapes and prints the ideal bytes moved and the GB/s achieved.

GPU (``run``, driven by ``bash bench/gpu_check.sh --only seer_kernels``): device-event timings
(``triton.testing.do_bench``, median) at LLaDA-8B shapes (batch 64, window 256, MLP 12288) and
Dream-7B (MLP 18944): fraction of peak memory bandwidth (``SEER_PEAK_BW`` in B/s, default an
H200's 4.8e12), fused SwiGLU+sparsity against the unfused torch ``F.silu(g) * u`` alone (goal:
ratio <= 1.10), and sparsity + boundary time as a fraction of one LLaDA-8B layer step at the
same batch (goal: under 0.5%). bf16 correctness is ``tests/kernels/test_*_gpu.py`` (gpu marker).

    .venv/bin/pytest bench/bench_seer_kernels.py -s                      # CPU timings
    .venv/bin/pytest bench/bench_seer_kernels.py --benchmark-disable -s  # smoke (CI): one call each
    .venv/bin/python -m bench.bench_seer_kernels --dry-run               # the GPU harness on CPU

CPU timings run on ``SEER_BENCH_THREADS`` torch threads (default 1): on a machine whose cores
are shared, torch's OpenMP pool spin-waits and multi-threaded medians swing by 5-50x.

"Bytes moved" is the ideal traffic (every input read once, every output written once); the
eager reference moves more (it materialises fp32 and boolean temporaries), which is the point
of the fused kernels.
"""

from __future__ import annotations

import argparse
import importlib

import pytest
import torch

from bench.common import (
    Timing,
    bandwidth_note,
    benchmark_median,
    mlp_sparsity_bytes,
    row,
    snr_boundary_bytes,
    swiglu_sparsity_bytes,
    time_parts,
)

pytestmark = [pytest.mark.bench]

# the modules (the package attributes of the same names are the ops)
_mlp = importlib.import_module("seer_kernels.mlp_sparsity")
_snr = importlib.import_module("seer_kernels.snr_boundary")

# CPU shapes: a batch of 4 windows of 128 tokens over a 2048-wide MLP (a small model's size)
R, T, F = 4, 128, 2048
B, N = 64, 256  # Seer's boundary scan: batch 64, window 256


def planted_profiles(B: int, N: int, *, device, dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparsity rows with a jump to a noisy plateau at random places, some NaN, random lengths."""
    g = torch.Generator().manual_seed(seed)
    s = 0.3 + 0.02 * torch.rand(B, N, generator=g)
    where = torch.randint(1, max(N, 2), (B,), generator=g)
    for b in range(B):
        if b % 5:
            s[b, where[b] :] += 0.1 + 0.03 * torch.rand(N - int(where[b]), generator=g)
    hits = torch.randint(0, N, (B,), generator=g)
    for b in range(0, B, 7):
        s[b, hits[b]] = float("nan")
    valid_len = torch.randint(0, N + 1, (B,), generator=g)
    valid_len[: B // 2] = N
    return s.to(device=device, dtype=dtype), valid_len.to(device)


def _report(benchmark, name: str, nbytes: int, fn) -> None:
    seconds = benchmark_median(benchmark, fn)
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


# ------------------------------------------------------------------------- GPU timing harness


def _llada_layer_step(t: Timing, batch: int, window: int) -> float:
    """ms of one LLaDA-8B layer in bf16 (random weights): QKV/O projections, SDPA, SwiGLU MLP.

    Norms and rotary embeddings are left out (elementwise, a few % of the layer), so the
    fractions reported against this time are slight overestimates.
    """
    d_model, heads, d_ff = (4096, 32, 12288) if not t.dry_run else (64, 4, 192)
    head_dim = d_model // heads
    dev, dt = t.device, torch.bfloat16 if not t.dry_run else torch.float32
    g = torch.Generator(device=dev).manual_seed(2)

    def w(i, o):
        return (torch.randn(i, o, device=dev, generator=g) * i**-0.5).to(dt)

    wq, wk, wv, wo = (w(d_model, d_model) for _ in range(4))
    wg, wu, wd = w(d_model, d_ff), w(d_model, d_ff), w(d_ff, d_model)
    x = torch.randn(batch, window, d_model, device=dev, generator=g).to(dt)

    def layer():
        q = (x @ wq).view(batch, window, heads, head_dim).transpose(1, 2)
        k = (x @ wk).view(batch, window, heads, head_dim).transpose(1, 2)
        v = (x @ wv).view(batch, window, heads, head_dim).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # bidirectional
        h = x + a.transpose(1, 2).reshape(batch, window, d_model) @ wo
        return h + (torch.nn.functional.silu(h @ wg) * (h @ wu)) @ wd

    with torch.no_grad():
        return t.ms(layer)


def _timings(t: Timing) -> list[dict]:
    rows = []
    batch, window = (64, 256) if not t.dry_run else (2, 16)
    tokens = batch * window
    dt = torch.bfloat16 if not t.dry_run else torch.float32
    g = torch.Generator(device=t.device).manual_seed(3)
    models = [("LLaDA-8B", 12288)] if t.quick else [("LLaDA-8B", 12288), ("Dream-7B", 18944)]
    if t.dry_run:
        models = [("LLaDA-8B", 96)]
    times = {}
    for model, F_model in models:
        gate = torch.randn(batch, window, F_model, device=t.device, generator=g).to(dt)
        up = torch.randn(batch, window, F_model, device=t.device, generator=g).to(dt)
        product = torch.empty_like(gate)
        shape = f"[{batch},{window},{F_model}] {str(dt).replace('torch.', '')}"

        elem = gate.element_size()
        ms = t.ms(lambda gate=gate: _mlp.mlp_sparsity(gate, 0.01))
        note = bandwidth_note(mlp_sparsity_bytes(tokens, F_model, elem), ms)
        rows.append(row(f"mlp_sparsity {model} {shape}", ms, note))
        fused = t.ms(lambda gate=gate, up=up, product=product: _mlp.swiglu_sparsity(gate, up, 0.01, out=product))
        unfused = t.ms(lambda gate=gate, up=up: torch.nn.functional.silu(gate) * up)
        ratio = fused / unfused
        note = (
            f"unfused {unfused:.4f} ms; ratio {ratio:.3f} (goal <= 1.10: {'met' if ratio <= 1.10 else 'MISSED'}; "
            f"ideal 0.6 = 3 vs 5 passes over [T, F]); "
            f"fused {bandwidth_note(swiglu_sparsity_bytes(tokens, F_model, elem), fused)}"
        )
        rows.append(row(f"swiglu_sparsity fused vs F.silu(g)*u {model} {shape}", fused, note))
        times[model] = (ms, fused, unfused)
        del gate, up, product

    snr_ms = {}
    for N_scan in (256, 2048) if not t.dry_run else (16,):
        s, valid_len = planted_profiles(batch, N_scan, device=t.device, dtype=torch.float32, seed=N_scan)
        eager = t.ms(lambda s=s, valid_len=valid_len: _snr.snr_boundary(s, valid_len))
        graphed = t.graph_ms(lambda s=s, valid_len=valid_len: _snr.snr_boundary(s, valid_len))
        # a few microseconds of work: in eager mode the launch overhead dominates; the engine
        # replays it from a CUDA graph, so the graph time is the one that counts
        snr_ms[N_scan] = graphed if graphed is not None else eager
        how = "CUDA-graph replay" if graphed is not None else "eager (no graph: capture failed or dry run)"
        note = f"{how}; eager {eager:.4f} ms; reads <= {snr_boundary_bytes(batch, N_scan, 4) / 1e3:.0f} kB"
        rows.append(row(f"snr_boundary [{batch},{N_scan}] fp32", snr_ms[N_scan], note))

    layer = _llada_layer_step(t, batch, window)
    rows.append(
        row(
            f"LLaDA-8B layer step [{batch},{window}] bf16",
            layer,
            "QKV/O proj + SDPA + SwiGLU MLP (no norms/RoPE), random weights",
        )
    )
    sparsity_ms, fused, unfused = times["LLaDA-8B"]
    first_scan = snr_ms[min(snr_ms)]
    standalone = sparsity_ms + first_scan
    fused_extra = max(fused - unfused, 0.0) + first_scan
    note = (
        f"standalone mlp_sparsity+snr_boundary {standalone / layer:.2%} of a layer; "
        f"fused (extra over F.silu(g)*u) + snr_boundary {fused_extra / layer:.2%} (goal < 0.5%: "
        f"{'met' if fused_extra / layer < 0.005 else 'MISSED'})"
    )
    rows.append(row("sparsity+boundary / LLaDA-8B layer step", standalone, note))
    return rows


def run(quick: bool = False, dry_run: bool = False) -> list[dict]:
    """Timing rows of the Seer probe ops on CUDA (see the module docstring); ``dry_run``: on CPU."""
    return time_parts("bench_seer_kernels", [_timings], quick=quick, dry_run=dry_run)


if __name__ == "__main__":
    from bench.gpu_check import main_for_family

    main_for_family("seer_kernels", argparse.ArgumentParser(description=__doc__))
