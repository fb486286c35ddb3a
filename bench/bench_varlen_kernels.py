"""Benchmarks of varlen_attention and slice_repack.

CPU (pytest, always): times the torch references (the router's eager fallback) and, side by
side in one run, varlen attention against padded SDPA at the same lengths, printing FLOPs /
bytes and the ideal ratio.

GPU (``run``, driven by ``bash bench/gpu_check.sh --only varlen_kernels``): timings at LLaDA-8B
shapes (32 heads, d 128, batch 64, a ~1000-token cached prefix plus a response of 1..256 tokens
per request): varlen attention against padded SDPA at the same lengths, with the ideal (FLOP)
ratio beside the measured one; slice_repack's bandwidth. bf16 correctness is
``tests/kernels/test_varlen_attention_gpu.py`` and ``test_slice_repack_gpu.py`` (gpu marker).

    .venv/bin/pytest bench/bench_varlen_kernels.py -m bench -s                  # CPU timings
    .venv/bin/pytest bench/bench_varlen_kernels.py -m bench --benchmark-disable  # CI: run once
    .venv/bin/python -m bench.bench_varlen_kernels --dry-run                    # the GPU harness on CPU
"""

from __future__ import annotations

import argparse

import pytest
import torch
import torch.nn.functional as F

from bench.common import (
    Timing,
    bandwidth_note,
    median_of_calls,
    row,
    slice_repack_bytes,
    tflops_note,
    time_parts,
    varlen_attention_flops,
    varlen_ideal_ratio,
)
from seer_kernels.slice_repack import slice_repack, slice_repack_reference
from seer_kernels.slice_repack_control import PATH_NAMES, slice_repack_buffers
from seer_kernels.varlen_attention import varlen_attention, varlen_attention_reference

pytestmark = pytest.mark.bench


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


def _buffers(values: torch.Tensor, *, batch_cap: int, bucket_cap: int):
    """slice_repack buffers for ``values`` [B, N] or [B, N, D]: any group of its rows fits the packed side."""
    batch, seq_len = values.shape[:2]
    return slice_repack_buffers(
        batch_cap=batch_cap,
        bucket_cap=bucket_cap,
        packed_cap=batch * seq_len,
        cu_len=batch + 1,
        dtype=values.dtype,
        device=values.device,
        hidden_dim=values.shape[2] if values.dim() == 3 else None,
    )


# ------------------------------------------------------------------------------ CPU references


def test_varlen_attention_reference_cpu(benchmark):
    lq = _lengths(8, 1, 48, seed=1)
    lk = [n + 32 for n in lq]  # a 32-token cached prefix per sequence
    q, k, v, cq, ck = make_varlen(lq, lk, 4, 2, 64, torch.float32, "cpu")
    out = benchmark(varlen_attention_reference, q, k, v, cq, ck, max(lq), max(lk))
    assert out.shape == q.shape and torch.isfinite(out).all()
    print(
        f"\nvarlen_attention_reference: B=8 H=4 Hk=2 d=64, {varlen_attention_flops(lq, lk, 4, 64) / 1e6:.1f} MFLOP"
    )


def test_varlen_vs_padded_sdpa_cpu():
    """Side by side on CPU: the per-sequence reference against one padded SDPA call, same lengths."""
    lq = _lengths(8, 1, 48, seed=2)
    lk = [n + 32 for n in lq]
    q, k, v, cq, ck = make_varlen(lq, lk, 4, 4, 64, torch.float32, "cpu")
    qp, kp, vp, mask = pad_for_sdpa(q, k, v, lq, lk)
    t_varlen = median_of_calls(lambda: varlen_attention_reference(q, k, v, cq, ck, max(lq), max(lk)), 5)
    t_padded = median_of_calls(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask), 5)
    print(
        f"\nCPU varlen reference {t_varlen * 1e3:.2f} ms, padded SDPA {t_padded * 1e3:.2f} ms, "
        f"measured ratio {t_varlen / t_padded:.2f}, ideal (FLOP) ratio {varlen_ideal_ratio(lq, lk):.2f}"
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
    out = _buffers(values, batch_cap=16, bucket_cap=128)
    control = benchmark(slice_repack_reference, values, keep, **tables, out=out)
    moved = 2 * int(keep.sum()) * values.element_size() * (1 if kind == "ids" else dim)
    print(
        f"\nslice_repack_reference[{kind}]: path {control.path}, T={control.total}, "
        f"{moved / 1e6:.2f} MB moved"
    )
    assert control.error == 0


# ------------------------------------------------------------------------- GPU timing harness


def _llada_lengths(batch: int, seed: int, *, prefix=(900, 1100), response=256) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    lq = torch.randint(1, response + 1, (batch,), generator=g).tolist()
    prefix_len = torch.randint(prefix[0], prefix[1] + 1, (batch,), generator=g).tolist()
    return lq, [p + r for p, r in zip(prefix_len, lq)]


def _time_varlen_attention(t: Timing) -> list[dict]:
    if t.dry_run:
        batch, heads, head_dim, dtype = 3, 2, 16, torch.float32
        lq, lk = _llada_lengths(batch, seed=1, prefix=(8, 12), response=8)
    else:
        batch, heads, head_dim, dtype = 64, 32, 128, torch.bfloat16
        lq, lk = _llada_lengths(batch, seed=1)
    q, k, v, cq, ck = make_varlen(lq, lk, heads, heads, head_dim, dtype, t.device)
    out = torch.empty_like(q)
    qp, kp, vp, mask = pad_for_sdpa(q, k, v, lq, lk)
    t_varlen = t.ms(lambda: varlen_attention(q, k, v, cq, ck, max(lq), max(lk), out=out))
    t_masked = t.ms(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask))
    t_flash = t.ms(lambda: F.scaled_dot_product_attention(qp, kp, vp))  # padded, no mask: lower bound
    ideal = varlen_ideal_ratio(lq, lk)
    flops = varlen_attention_flops(lq, lk, heads, head_dim)
    shape = f"B={batch} H={heads} d={head_dim} prefix~1000 + resp 1..256"
    return [
        row(f"varlen_attention bf16 {shape}", t_varlen, tflops_note(flops, t_varlen)),
        row("padded SDPA + key mask, same lengths", t_masked,
            f"varlen/padded measured {t_varlen / t_masked:.2f}, ideal {ideal:.2f}"),
        row("padded SDPA without mask (flash), same lengths", t_flash,
            f"varlen/padded measured {t_varlen / t_flash:.2f}, ideal {ideal:.2f}"),
    ]  # fmt: skip


def _time_slice_repack(t: Timing) -> list[dict]:
    tables = dict(
        micro_buckets=[8, 16, 32, 64, 128, 256],
        packed_buckets=[1024, 2048, 4096, 8192, 16384],
        batch_buckets=[1, 2, 4, 8, 16, 32, 64],
    )
    batch, seq_len, dim = (64, 256, 4096) if not t.dry_run else (4, 256, 8)
    lq, _ = _llada_lengths(batch, seed=1)
    g = torch.Generator().manual_seed(2)
    dtype = torch.bfloat16 if not t.dry_run else torch.float32
    hidden = torch.randn(batch, seq_len, dim, generator=g).to(dtype).to(t.device)
    keep = torch.tensor(lq, device=t.device)
    buffers = _buffers(hidden, batch_cap=64, bucket_cap=256)
    device_tables = {name: torch.tensor(v, dtype=torch.int32, device=t.device) for name, v in tables.items()}
    ms = t.ms(lambda: slice_repack(hidden, keep, **device_tables, out=buffers))
    control = slice_repack(hidden, keep, **device_tables, out=buffers).read()
    moved = slice_repack_bytes(control.total, control.bucket, dim, hidden.element_size())
    note = f"path {PATH_NAMES[control.path]}, {bandwidth_note(moved, ms)}"
    return [row(f"slice_repack bf16 hidden B={batch} N={seq_len} D={dim}", ms, note)]


def run(quick: bool = False, dry_run: bool = False) -> list[dict]:
    """Timing rows of varlen_attention and slice_repack on CUDA; ``dry_run``: the same on CPU."""
    parts = [_time_varlen_attention, _time_slice_repack]
    return time_parts("bench_varlen_kernels", parts, quick=quick, dry_run=dry_run)


if __name__ == "__main__":
    from bench.gpu_check import main_for_family

    main_for_family("varlen_kernels", argparse.ArgumentParser(description=__doc__))
