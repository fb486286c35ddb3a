"""Microbenchmarks for varlen_attention and slice_repack (pytest-benchmark).

CPU: times the torch references (the router's eager fallback) and, side by side in one run,
varlen attention against padded SDPA at the same lengths, printing FLOPs / bytes and the ideal
ratio. CUDA (and ``TRITON_INTERPRET=0``): also times the Triton kernels with
``triton.testing.do_bench`` against padded SDPA.

    .venv/bin/pytest bench/bench_varlen_kernels.py -m bench -s                      # timings
    .venv/bin/pytest bench/bench_varlen_kernels.py -m bench --benchmark-disable      # CI: run once

Every test stays well under a second on 2 CPU cores.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from seer_kernels import _dispatch
from seer_kernels.slice_repack import slice_repack_reference
from seer_kernels.slice_repack_control import slice_repack_buffers
from seer_kernels.varlen_attention import varlen_attention, varlen_attention_reference

pytestmark = pytest.mark.bench

_CUDA = torch.cuda.is_available() and not _dispatch.interpreting()


def _lengths(batch: int, low: int, high: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (batch,), generator=g).tolist()


def _cu(lengths: list[int], device) -> torch.Tensor:
    return F.pad(torch.tensor(lengths, dtype=torch.int64).cumsum(0), (1, 0)).to(torch.int32).to(device)


def make_varlen(
    lq: list[int], lk: list[int], heads: int, kv_heads: int, head_dim: int, dtype, device, seed=0
):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), heads, head_dim, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(sum(lk), kv_heads, head_dim, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(sum(lk), kv_heads, head_dim, generator=g).to(device=device, dtype=dtype)
    return q, k, v, _cu(lq, device), _cu(lk, device)


def pad_for_sdpa(q, k, v, lq, lk):
    """The same batch bucket-padded: q [B, H, maxLq, d], k/v [B, H, maxLk, d] (GQA expanded), key mask."""
    batch, heads = len(lq), q.shape[1]
    group = heads // k.shape[1]
    mq, mk = max(lq), max(lk)
    qp = q.new_zeros(batch, heads, mq, q.shape[2])
    kp = k.new_zeros(batch, heads, mk, k.shape[2])
    vp = v.new_zeros(batch, heads, mk, v.shape[2])
    mask = torch.zeros(batch, 1, 1, mk, dtype=torch.bool, device=q.device)
    q0 = k0 = 0
    for b, (nq, nk) in enumerate(zip(lq, lk)):
        qp[b, :, :nq] = q[q0 : q0 + nq].transpose(0, 1)
        kp[b, :, :nk] = k[k0 : k0 + nk].transpose(0, 1).repeat_interleave(group, 0)
        vp[b, :, :nk] = v[k0 : k0 + nk].transpose(0, 1).repeat_interleave(group, 0)
        mask[b, ..., :nk] = True
        q0 += nq
        k0 += nk
    return qp, kp, vp, mask


def attention_flops(lq, lk, heads, head_dim) -> int:
    return 4 * sum(a * b for a, b in zip(lq, lk)) * heads * head_dim


def ideal_ratio(lq, lk) -> float:
    """Work of varlen over work of the padded batch: sum(Lq*Lk) / (B * maxLq * maxLk)."""
    return sum(a * b for a, b in zip(lq, lk)) / (len(lq) * max(lq) * max(lk))


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def test_varlen_attention_reference_cpu(benchmark):
    lq = _lengths(8, 1, 48, seed=1)
    lk = [n + 32 for n in lq]  # a 32-token cached prefix per sequence
    q, k, v, cq, ck = make_varlen(lq, lk, 4, 2, 64, torch.float32, "cpu")
    out = benchmark(varlen_attention_reference, q, k, v, cq, ck, max(lq), max(lk))
    assert out.shape == q.shape and torch.isfinite(out).all()
    print(
        f"\nvarlen_attention_reference: B=8 H=4 Hk=2 d=64, {attention_flops(lq, lk, 4, 64) / 1e6:.1f} MFLOP"
    )


def test_varlen_vs_padded_sdpa_cpu():
    """Side by side on CPU: the per-sequence reference against one padded SDPA call, same lengths."""
    lq = _lengths(8, 1, 48, seed=2)
    lk = [n + 32 for n in lq]
    q, k, v, cq, ck = make_varlen(lq, lk, 4, 4, 64, torch.float32, "cpu")
    qp, kp, vp, mask = pad_for_sdpa(q, k, v, lq, lk)
    t_varlen = _median_seconds(lambda: varlen_attention_reference(q, k, v, cq, ck, max(lq), max(lk)), 5)
    t_padded = _median_seconds(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask), 5)
    print(
        f"\nCPU varlen reference {t_varlen * 1e3:.2f} ms, padded SDPA {t_padded * 1e3:.2f} ms, "
        f"measured ratio {t_varlen / t_padded:.2f}, ideal (FLOP) ratio {ideal_ratio(lq, lk):.2f}"
    )
    assert t_varlen > 0 and t_padded > 0


@pytest.mark.parametrize("kind", ["ids", "hidden"])
def test_slice_repack_reference_cpu(benchmark, kind):
    batch, seq_len, dim = 16, 128, 64
    keep = torch.tensor(_lengths(batch, 0, seq_len, seed=3))
    values = torch.randint(0, 50_000, (batch, seq_len)) if kind == "ids" else torch.randn(batch, seq_len, dim)
    tables = dict(
        micro_buckets=[8, 16, 32, 64, 128],
        packed_buckets=[256, 512, 1024, 2048],
        batch_buckets=[1, 2, 4, 8, 16],
    )
    out = slice_repack_buffers(
        batch_cap=16,
        bucket_cap=128,
        packed_cap=batch * seq_len,
        cu_len=batch + 1,
        dtype=values.dtype,
        device="cpu",
        hidden_dim=None if kind == "ids" else dim,
    )
    control = benchmark(slice_repack_reference, values, keep, **tables, out=out)
    moved = 2 * int(keep.sum()) * values.element_size() * (1 if kind == "ids" else dim)
    print(
        f"\nslice_repack_reference[{kind}]: path {control.path}, T={control.total}, "
        f"{moved / 1e6:.2f} MB moved"
    )
    assert control.error == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA and TRITON_INTERPRET=0")
def test_varlen_attention_triton_vs_padded_sdpa_cuda():
    from triton.testing import do_bench

    lq = _lengths(16, 1, 256, seed=4)
    lk = [n + 512 for n in lq]
    q, k, v, cq, ck = make_varlen(lq, lk, 32, 32, 128, torch.bfloat16, "cuda")
    qp, kp, vp, mask = pad_for_sdpa(q, k, v, lq, lk)
    out = torch.empty_like(q)
    t_varlen = do_bench(lambda: varlen_attention(q, k, v, cq, ck, max(lq), max(lk), out=out))
    t_padded = do_bench(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask))
    flops = attention_flops(lq, lk, 32, 128)
    print(
        f"\nCUDA varlen {t_varlen:.3f} ms ({flops / t_varlen / 1e9:.1f} TFLOP/s), "
        f"padded SDPA {t_padded:.3f} ms, "
        f"measured ratio {t_varlen / t_padded:.2f}, ideal {ideal_ratio(lq, lk):.2f}"
    )
    assert torch.isfinite(out).all()
