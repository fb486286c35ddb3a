"""Benchmarks of the DyLLM ops: cosine_saliency, gather_rows/scatter_rows, partial_attention, row_linear,
rms_norm and rotary_embedding.

CPU (pytest, always): pytest-benchmark times the torch references - the router's eager
fallback - at mid-size shapes. For partial attention it also times the dense case (every query
row salient, the same code) side by side, interleaved, and prints the measured ratio next to the
ideal FLOP ratio: ``QK^T`` is needed for every (query, key) pair whatever the salient fraction
(the softmax normaliser covers every key), only the ``P @ V`` half shrinks with ``|A| / N``, so
the ideal ratio tends to 0.5, not 0, as the salient fraction goes to 0. The batched reference
computes ``P @ V`` for every row of a forward as soon as one row is exact, so on the CPU the
partial case costs at least the dense one. The key correction (``k_old``) is timed against the
plain update the same way, and ``row_linear`` on 20% of a buffer's rows against ``F.linear`` on
all of them (ideal ratio: the live fraction).

GPU (``run``, driven by ``bash bench/gpu_check.sh --only dyllm_kernels``): device-event timings
(``triton.testing.do_bench``, median) at LLaDA-8B shapes (32 heads, head dim 128, batch 16,
prompt 1000 + response 256): partial attention at 5%, 20% and 100% salient rows (random and
clustered) for a response-only step (queries = response, keys = prompt + response) and a full
step, against dense attention (the same kernel with every row salient, ``varlen_attention`` and
torch SDPA), with the ideal FLOP ratio next to the measured one, and the 20% random case again
with the key correction; saliency and gather/scatter/exchange as a fraction of peak memory bandwidth
(``SEER_PEAK_BW`` in B/s, default an H200's 4.8e12); ``row_linear`` at LLaDA-8B's K/V, FFN up
and FFN down widths on 5%, 20% and 100% of the response rows (a device count), against
``F.linear`` on every row, the ideal FLOP ratio (count / capacity) beside the measured one, and
``row_linear_pair`` (K and V, gate and up in one launch) against two ``row_linear`` calls;
``exchange_rows`` with ``delta=True`` beside the plain exchange;
``rms_norm`` and ``rotary_embedding`` on the full step's rows and on a 20% row set, against the
models' torch code (six and seven ops), as a fraction of peak memory bandwidth.
bf16 correctness and the CUDA-graph capture of the whole sequence are ``tests/kernels/test_*_gpu.py`` (gpu marker).

    .venv/bin/pytest bench/bench_dyllm_kernels.py -s                      # CPU timings
    .venv/bin/pytest bench/bench_dyllm_kernels.py --benchmark-disable -s  # smoke (CI): one call each
    .venv/bin/python -m bench.bench_dyllm_kernels --dry-run               # the GPU harness on CPU

CPU timings run on ``SEER_BENCH_THREADS`` torch threads (default 1): on a machine whose cores
are shared, torch's OpenMP pool spin-waits and multi-threaded medians swing widely.
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
    cosine_saliency_bytes,
    gather_rows_bytes,
    interleaved_medians,
    partial_attention_flops,
    row,
    row_linear_flops,
    scatter_rows_bytes,
    tflops_note,
    time_parts,
)
from model_adapters.common import rope_cos_sin

pytestmark = [pytest.mark.bench]

# the modules (the package attributes of the same names are the ops)
_cs = importlib.import_module("seer_kernels.cosine_saliency")
_rg = importlib.import_module("seer_kernels.row_gather_scatter")
_pa = importlib.import_module("seer_kernels.partial_attention")
_va = importlib.import_module("seer_kernels.varlen_attention")
_rl = importlib.import_module("seer_kernels.row_linear")
_rn = importlib.import_module("seer_kernels.rms_norm")
_re = importlib.import_module("seer_kernels.rotary_embedding")

# CPU shapes: 8 sequences of 256 tokens of a 1024-wide model; attention: 2 sequences, prompt
# 192 + response 64, 8 heads of 64
N, D = 2048, 1024
B, PROMPT, RESPONSE, H, HK, HEAD_DIM = 2, 192, 64, 8, 8, 64

# GPU shapes: LLaDA-8B attention and the DyLLM evaluation setting (batch 16, 256 new tokens)
LLADA = dict(H=32, Hk=32, d=128)
BATCH, GPU_PROMPT, GPU_RESPONSE, D_MODEL = 16, 1000, 256, 4096


def dyllm_attention_inputs(
    batch: int,
    prompt: int,
    response: int,
    H: int,
    Hk: int,
    d: int,
    frac: float,
    *,
    response_only: bool,
    pattern: str = "random",
    device="cpu",
    dtype=torch.float32,
    seed: int = 0,
) -> tuple[dict, int, int]:
    """Packed inputs of :func:`partial_attention` for one DyLLM sparse step.

    Keys are prompt + response for every sequence; queries are the response alone
    (``response_only``) or prompt + response. ``frac`` of the query rows are salient, chosen
    uniformly (``pattern="random"``) or as one contiguous run at the start of the response
    (``"clustered"``, as in semi-autoregressive block decoding); the same token positions are
    the salient keys (their K/V were recomputed). Returns ``(kwargs, dense_flops,
    ideal_partial_flops)``.
    """
    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)  # big tensors are drawn on the device

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(shape, generator=gd, device=device)).to(dtype)

    lk = prompt + response
    lq = response if response_only else lk
    Tq, Tk = batch * lq, batch * lk
    q, k, v = randn(Tq, H, d), randn(Tk, Hk, d), randn(Tk, Hk, d)
    cache = randn(Tq, H, d)
    n_sal = round(frac * lq)
    q_mask = torch.zeros(Tq, dtype=torch.bool)
    key_rows = []
    for b in range(batch):
        if pattern == "random":
            local = torch.randperm(lq, generator=g)[:n_sal].sort().values
        elif pattern == "clustered":
            start = (lq - response) if n_sal <= response else 0
            local = torch.arange(start, start + n_sal)
        else:
            raise ValueError(f"pattern must be 'random' or 'clustered', got {pattern!r}")
        q_mask[b * lq + local] = True
        key_local = local + (prompt if response_only else 0)  # same token, key coordinates
        key_rows.append(b * lk + key_local)
    key_rows = torch.cat(key_rows).to(torch.int32)
    index = torch.full((Tk,), -1, dtype=torch.int32)
    index[: key_rows.numel()] = key_rows
    kwargs = dict(
        q=q,
        k=k,
        v=v,
        ctx_cache=cache,
        delta_v=randn(Tk, Hk, d, scale=0.1),
        cu_seqlens_q=torch.arange(0, Tq + 1, lq, dtype=torch.int32, device=device),
        cu_seqlens_k=torch.arange(0, Tk + 1, lk, dtype=torch.int32, device=device),
        max_seqlen_q=lq,
        max_seqlen_k=lk,
        salient_q_mask=q_mask.to(device),
        salient_k_index=index.to(device),
        salient_k_count=torch.tensor([key_rows.numel()], dtype=torch.int32, device=device),
    )
    dense, partial = partial_attention_flops(lq, lk, n_sal, n_sal, H, d)
    return kwargs, batch * dense, batch * partial


def with_k_old(args: dict, noise: float = 0.5, seed: int = 0) -> dict:
    """``args`` plus ``k_old`` for the key correction: the live salient keys moved by ``noise``
    x N(0, 1) (zeros past the count; never read)."""
    k, index = args["k"], args["salient_k_index"]
    n = int(args["salient_k_count"])
    g = torch.Generator(device=k.device).manual_seed(seed)
    k_old = torch.zeros((index.numel(), *k.shape[1:]), dtype=k.dtype, device=k.device)
    moved = k[index[:n].long()].float() + noise * torch.randn((n, *k.shape[1:]), generator=g, device=k.device)
    k_old[:n] = moved.to(k.dtype)
    return dict(args, k_old=k_old)


def saliency_pair(N: int, D: int, frac: float, *, device="cpu", dtype=torch.float32, seed: int = 0):
    """ctx and ctx_cache where about ``frac`` of the rows changed a lot and the rest barely."""
    g = torch.Generator(device=device).manual_seed(seed)
    ctx = torch.randn(N, D, generator=g, device=device)
    noise = torch.randn(N, D, generator=g, device=device)
    changed = torch.rand(N, generator=g, device=device) < frac
    amp = torch.where(changed, 1.0, 0.01).view(N, 1)
    return ctx.to(dtype), (ctx + amp * noise).to(dtype)


# ------------------------------------------------------------------------------ CPU references


def test_cosine_saliency_reference_cpu(benchmark, cpu_threads):
    ctx, cache = saliency_pair(N, D, 0.2)
    fn = lambda: _cs.cosine_saliency_reference(ctx, cache, 0.99)  # noqa: E731
    index, count, sim = benchmark(fn)
    assert 0.1 * N < int(count) < 0.3 * N and sim.shape == (N,)
    assert bool((index[1 : int(count)] > index[: int(count) - 1]).all())
    seconds = benchmark_median(benchmark, fn)
    nbytes = cosine_saliency_bytes(N, D, 4)
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
    seconds = benchmark_median(benchmark, fn)
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
    seconds = benchmark_median(benchmark, fn)
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
    t_partial, t_dense = interleaved_medians([partial, dense], repeats)
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
    t_corrected, t_plain = interleaved_medians([corrected, plain], 3 if benchmark.stats is None else 7)
    print(
        f"\npartial_attention_reference 20% salient + k_old, response-only step ({cpu_threads} thread(s)): "
        f"{t_corrected * 1e3:.3f} ms vs plain update {t_plain * 1e3:.3f} ms ({t_corrected / t_plain:.2f}x)"
    )


def test_row_linear_reference_cpu(benchmark, cpu_threads):
    capacity, width, live = 2048, 512, 410  # 20% of the rows live
    x, weight, bias = torch.randn(capacity, width), torch.randn(width, width), torch.randn(width)
    count = torch.tensor([live], dtype=torch.int32)
    sparse = lambda: _rl.row_linear_reference(x, weight, bias, count)  # noqa: E731
    dense = lambda: torch.nn.functional.linear(x, weight, bias)  # noqa: E731
    out = benchmark(sparse)
    assert torch.equal(out[:live], dense()[:live]) and not out[live:].any()
    t_sparse, t_dense = interleaved_medians([sparse, dense], 3 if benchmark.stats is None else 7)
    print(
        f"\nrow_linear_reference {live}/{capacity} rows [{width}] -> [{width}] fp32 ({cpu_threads} thread(s)): "
        f"{t_sparse * 1e3:.3f} ms vs F.linear on every row {t_dense * 1e3:.3f} ms; "
        f"measured ratio {t_sparse / t_dense:.3f}, ideal FLOP ratio {live / capacity:.3f}"
    )
    benchmark.extra_info.update({"ideal_ratio": live / capacity, "measured_ratio": t_sparse / t_dense})


# ------------------------------------------------------------------------- GPU timing harness


def _shapes(t: Timing) -> tuple[int, int, int, int, dict, torch.dtype]:
    """(batch, prompt, response, d_model, attention heads, dtype): LLaDA-8B, or tiny when dry."""
    if t.dry_run:
        return 2, 24, 8, 64, dict(H=2, Hk=2, d=16), torch.float32
    return BATCH, GPU_PROMPT, GPU_RESPONSE, D_MODEL, LLADA, torch.bfloat16


def _sdpa_dense(args: dict):
    """Torch SDPA on the same problem (uniform lengths: padded batch without padding)."""
    lq, lk = args["max_seqlen_q"], args["max_seqlen_k"]
    batch = args["cu_seqlens_q"].numel() - 1
    heads, kv_heads = args["q"].shape[1], args["k"].shape[1]
    q = args["q"].view(batch, lq, heads, -1).transpose(1, 2)
    k = args["k"].view(batch, lk, kv_heads, -1).transpose(1, 2)
    v = args["v"].view(batch, lk, kv_heads, -1).transpose(1, 2)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=heads != kv_heads)


def _time_partial_attention(t: Timing) -> list[dict]:
    batch, prompt, response, _, shape, dtype = _shapes(t)
    rows = []
    steps = [True] if t.quick else [True, False]
    fracs = [(0.05, "random"), (0.05, "clustered"), (0.2, "random"), (0.2, "clustered"), (1.0, "random")]
    varlen_keys = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
    for response_only in steps:
        label = "response-only" if response_only else "full"
        base_args, dense_flops, _ = dyllm_attention_inputs(
            batch, prompt, response, shape["H"], shape["Hk"], shape["d"], 1.0,
            response_only=response_only, device=t.device, dtype=dtype,
        )  # fmt: skip
        out = torch.empty_like(base_args["q"])
        dense_ms = {
            "sdpa": t.ms(_sdpa_dense(base_args)),
            "varlen_attention": t.ms(lambda a=base_args: _va.varlen_attention(*(a[k] for k in varlen_keys))),
            "partial@100%": t.ms(lambda a=base_args, o=out: _pa.partial_attention(**a, out=o)),
        }
        for name, ms in dense_ms.items():
            rows.append(row(f"dense attention {name} LLaDA-8B {label} bf16", ms, tflops_note(dense_flops, ms)))
        for frac, pattern in fracs:
            args, dense, ideal = dyllm_attention_inputs(
                batch, prompt, response, shape["H"], shape["Hk"], shape["d"], frac,
                response_only=response_only, pattern=pattern, device=t.device, dtype=dtype, seed=7,
            )  # fmt: skip
            out = torch.empty_like(args["q"])
            ms = t.ms(lambda a=args, o=out: _pa.partial_attention(**a, out=o))
            note = (
                f"ideal FLOP ratio {ideal / dense:.3f}; measured vs own 100% {ms / dense_ms['partial@100%']:.3f}, "
                f"vs varlen_attention {ms / dense_ms['varlen_attention']:.3f}, vs sdpa {ms / dense_ms['sdpa']:.3f}"
            )
            rows.append(row(f"partial_attention {frac:.0%} {pattern} LLaDA-8B {label} bf16", ms, note))
            if (frac, pattern) == (0.2, "random"):
                args = with_k_old(args, seed=7)
                ms_kc = t.ms(lambda a=args, o=out: _pa.partial_attention(**a, out=o))
                rows.append(
                    row(
                        f"partial_attention {frac:.0%} {pattern} + k_old LLaDA-8B {label} bf16",
                        ms_kc,
                        f"{ms_kc / ms:.3f} x without the key correction",
                    )
                )
            del args, out
    return rows


def _time_saliency_and_rows(t: Timing) -> list[dict]:
    batch, prompt, response, d_model, _, dtype = _shapes(t)
    rows = []
    for label, n_rows in (("response-only", batch * response), ("full", batch * (prompt + response))):
        ctx, cache = saliency_pair(n_rows, d_model, 0.2, device=t.device, dtype=dtype, seed=11)
        idx = torch.empty(n_rows, dtype=torch.int32, device=t.device)
        cnt = torch.empty(1, dtype=torch.int32, device=t.device)
        sim = torch.empty(n_rows, dtype=torch.float32, device=t.device)

        def fn(ctx=ctx, cache=cache, idx=idx, cnt=cnt, sim=sim):
            return _cs.cosine_saliency(ctx, cache, 0.99, out_index=idx, out_count=cnt, out_similarity=sim)

        eager = t.ms(fn)
        graphed = t.graph_ms(fn)
        ms = graphed if graphed is not None else eager
        note = (
            f"{'graph' if graphed is not None else 'eager'}; eager {eager:.4f} ms; "
            f"{bandwidth_note(cosine_saliency_bytes(n_rows, d_model, ctx.element_size()), ms)}"
        )
        rows.append(row(f"cosine_saliency [{n_rows},{d_model}] bf16 ({label})", ms, note))
        n_live = int(cnt)
        src = torch.randn(n_rows, d_model, device=t.device).to(dtype)
        buf = torch.empty_like(src)
        elem = src.element_size()
        for zero_tail in (True, False):
            ms = t.ms(
                lambda zt=zero_tail, src=src, idx=idx, cnt=cnt, buf=buf: _rg.gather_rows(
                    src, idx, cnt, out=buf, zero_tail=zt
                )
            )
            note = bandwidth_note(gather_rows_bytes(n_live, n_rows, d_model, elem, zero_tail=zero_tail), ms)
            rows.append(row(f"gather_rows {n_live}/{n_rows} rows x {d_model} bf16 zero_tail={zero_tail}", ms, note))
        dst = torch.empty_like(src)
        ms = t.ms(lambda dst=dst, idx=idx, cnt=cnt, buf=buf: _rg.scatter_rows(dst, idx, cnt, buf))
        note = bandwidth_note(scatter_rows_bytes(n_live, n_rows, d_model, elem), ms)
        rows.append(row(f"scatter_rows {n_live}/{n_rows} rows x {d_model} bf16", ms, note))
        ms = t.ms(lambda dst=dst, idx=idx, cnt=cnt, buf=buf: _rg.exchange_rows(dst, idx, cnt, buf))
        # read the old and the new rows, write both (the tail of the returned rows is zeroed)
        note = bandwidth_note(gather_rows_bytes(n_live, n_rows, d_model, elem, zero_tail=True)
                              + scatter_rows_bytes(n_live, n_rows, d_model, elem), ms)
        rows.append(row(f"exchange_rows {n_live}/{n_rows} rows x {d_model} bf16", ms, note))
        ms = t.ms(lambda dst=dst, idx=idx, cnt=cnt, buf=buf: _rg.exchange_rows(dst, idx, cnt, buf, delta=True))
        rows.append(row(f"exchange_rows {n_live}/{n_rows} rows x {d_model} bf16 delta=True", ms, note))
        del ctx, cache, src, buf, dst
    return rows


def _time_row_linear(t: Timing) -> list[dict]:
    batch, _, response, d_model, _, dtype = _shapes(t)
    capacity = batch * response  # the response rows of a response-only step
    ffn = 12288 if not t.dry_run else 96  # LLaDA-8B's MLP width
    widths = [("K/V projection", d_model, d_model), ("FFN up", d_model, ffn), ("FFN down", ffn, d_model)]
    if t.quick:
        widths = widths[1:2]
    fracs = (0.2, 1.0) if t.quick else (0.05, 0.2, 1.0)
    rows = []
    for name, K, N in widths:
        g = torch.Generator(device=t.device).manual_seed(K + N)
        x = torch.randn(capacity, K, generator=g, device=t.device).to(dtype)
        weight = (torch.randn(N, K, generator=g, device=t.device) / K**0.5).to(dtype)
        dense_ms = t.ms(lambda x=x, w=weight: torch.nn.functional.linear(x, w))
        note = tflops_note(row_linear_flops(capacity, K, N), dense_ms)
        rows.append(row(f"F.linear {capacity} rows {name} [{K}->{N}] bf16", dense_ms, note))
        for frac in fracs:
            live = max(1, round(frac * capacity))
            count = torch.tensor([live], dtype=torch.int32, device=t.device)
            ms = t.ms(lambda x=x, w=weight, c=count: _rl.row_linear(x, w, None, c))
            note = (
                f"ideal FLOP ratio {live / capacity:.3f}, measured vs F.linear {ms / dense_ms:.3f}; "
                f"{tflops_note(row_linear_flops(live, K, N), ms)} on the live rows"
            )
            rows.append(row(f"row_linear {live}/{capacity} rows {name} [{K}->{N}] bf16", ms, note))
        if name != "FFN down":  # K and V, gate and up: two projections of the same rows, one launch
            live = max(1, round(0.2 * capacity))
            count = torch.tensor([live], dtype=torch.int32, device=t.device)
            weight_b = weight.flip(0)
            two_ms = t.ms(lambda x=x, w=weight, wb=weight_b, c=count: (_rl.row_linear(x, w, None, c),
                                                                       _rl.row_linear(x, wb, None, c)))
            ms = t.ms(lambda x=x, w=weight, wb=weight_b, c=count: _rl.row_linear_pair(x, w, None, wb, None, c))
            note = (f"vs two row_linear calls {ms / two_ms:.3f} (ideal <= 1: one launch instead of two, "
                    "the same bytes: each weight's programs read x); "
                    f"{tflops_note(2 * row_linear_flops(live, K, N), ms)} on the live rows")
            rows.append(row(f"row_linear_pair {live}/{capacity} rows {name} x2 [{K}->{N}] bf16", ms, note))
        del x, weight
    return rows


def _time_norm_and_rope(t: Timing) -> list[dict]:
    """The sparse layer's fused norm and RoPE against the models' torch code, on every row of a full
    step and on a 20% row set (bytes: read and write the live rows, the weight or angle rows)."""
    batch, prompt, response, d_model, shape, dtype = _shapes(t)
    n_rows = batch * (prompt + response)
    heads, head_dim = shape["H"], shape["d"]
    g = torch.Generator(device=t.device).manual_seed(5)
    x = torch.randn(n_rows, d_model, generator=g, device=t.device).to(dtype)
    weight = torch.ones(d_model, device=t.device, dtype=dtype)
    q = torch.randn(n_rows, heads, head_dim, generator=g, device=t.device).to(dtype)
    positions = torch.randint(0, 4096, (n_rows,), generator=g, device=t.device)
    cos, sin = rope_cos_sin(positions, head_dim, 500000.0)  # the models' own angle tables
    elem = x.element_size()
    rows = []
    torch_ms = t.ms(lambda: _rn.rms_norm_reference(x, weight, 1e-5))
    rows.append(row(f"torch RMSNorm [{n_rows},{d_model}] bf16 (the model's)", torch_ms,
                    bandwidth_note(2 * n_rows * d_model * elem, torch_ms)))
    ms = t.ms(lambda: _rn.rms_norm(x, weight, 1e-5))
    rows.append(row(f"rms_norm [{n_rows},{d_model}] bf16", ms,
                    f"{bandwidth_note(2 * n_rows * d_model * elem, ms)}; x{torch_ms / ms:.2f} vs torch"))
    live = max(1, n_rows // 5)
    index = torch.randperm(n_rows, generator=g, device=t.device)[:live].to(torch.int32)
    index = torch.cat([index, torch.full((n_rows - live,), -1, dtype=torch.int32, device=t.device)])
    count = torch.tensor([live], dtype=torch.int32, device=t.device)
    ms = t.ms(lambda: _rn.rms_norm(x, weight, 1e-5, index=index, count=count))
    rows.append(row(f"rms_norm {live}/{n_rows} rows x {d_model} bf16", ms,
                    f"{bandwidth_note(2 * live * d_model * elem + (n_rows - live) * d_model * elem, ms)}"))
    half = (cos[:, None, :], sin[:, None, :])
    torch_ms = t.ms(lambda: _re.apply_rotary(q, *half, full_precision=True))
    nbytes = 2 * q.numel() * elem + 2 * cos.numel() * 4
    rows.append(row(f"torch RoPE [{n_rows},{heads},{head_dim}] bf16 fp32 rotation (the model's)", torch_ms,
                    bandwidth_note(nbytes, torch_ms)))
    ms = t.ms(lambda: _re.rotary_embedding(q, cos, sin, full_precision=True))
    rows.append(row(f"rotary_embedding [{n_rows},{heads},{head_dim}] bf16 fp32 rotation", ms,
                    f"{bandwidth_note(nbytes, ms)}; x{torch_ms / ms:.2f} vs torch"))
    ms = t.ms(lambda: _re.rotary_embedding(q, cos, sin, full_precision=True, index=index, count=count))
    nbytes = 2 * live * heads * head_dim * elem + (n_rows - live) * heads * head_dim * elem + 2 * live * head_dim * 4
    rows.append(row(f"rotary_embedding {live}/{n_rows} rows (index) bf16", ms, bandwidth_note(nbytes, ms)))
    return rows


def run(quick: bool = False, dry_run: bool = False) -> list[dict]:
    """Timing rows of the DyLLM ops on CUDA (see the module docstring); ``dry_run``: on CPU."""
    parts = [_time_saliency_and_rows, _time_partial_attention, _time_row_linear, _time_norm_and_rope]
    return time_parts("bench_dyllm_kernels", parts, quick=quick, dry_run=dry_run)


if __name__ == "__main__":
    from bench.gpu_check import main_for_family

    main_for_family("dyllm_kernels", argparse.ArgumentParser(description=__doc__))
