"""GPU check for varlen_attention and slice_repack (driven by ``bench/gpu_check.py``).

``run(quick)`` returns one dict per row (``check``, ``ok``, ``ms``, ``note``):

* bf16 correctness of ``varlen_attention`` against the fp64 reference, flash-attention's rule:
  kernel error <= 2 x (torch SDPA's own bf16 error) + floor, over adversarial shapes
  (empty, length 1, block edges, odd head dims, GQA, a cached prefix, causal both ways);
* ``slice_repack`` Triton against the reference, bit for bit, on every path, ids and bf16
  hidden states;
* timings at LLaDA-8B shapes (32 heads, d 128, batch 64, a ~1000-token cached prefix plus a
  response of 1..256 tokens per request): varlen attention against padded SDPA at the same
  lengths, with the ideal (FLOP) ratio beside the measured one; slice_repack's bandwidth.

Importable on a CPU-only machine; nothing touches the device until ``run`` is called.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.bench_varlen_kernels import attention_flops, ideal_ratio, make_varlen, pad_for_sdpa
from tests.tolerances import BASELINE_FLOOR

_H200_PEAK_GBPS = 4800.0


def _varlen_correctness(quick: bool) -> list[dict]:
    from seer_kernels.varlen_attention import varlen_attention, varlen_attention_reference

    cases = [
        # (name, lq, lk, H, Hk, d)
        ("edges", [0, 1, 2, 17, 33, 63, 64, 65, 127, 128, 129], None, 8, 8, 128),
        ("prefix_gqa", [1, 16, 100, 256, 3], [1000, 1016, 987, 1256, 0], 32, 8, 128),
        ("odd_head_dim", [5, 77, 130], [5, 200, 131], 4, 2, 80),
        ("head_dim_59", [17, 33], [40, 33], 4, 1, 59),
        ("head_dim_256", [64, 9, 200], [64, 300, 150], 4, 4, 256),
    ]
    if quick:
        cases = cases[:2]
    rows = []
    for name, lq, lk, heads, kv_heads, head_dim in cases:
        lk = lq if lk is None else lk
        q, k, v, cq, ck = make_varlen(lq, lk, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
        for causal in (False, True):
            got = varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=causal)
            exact = varlen_attention_reference(
                q.double(), k.double(), v.double(), cq, ck, 0, 0, causal=causal
            )
            torch_bf16 = varlen_attention_reference(
                q, k, v, cq, ck, 0, 0, causal=causal, compute_dtype=torch.bfloat16
            )
            err = (got.double() - exact).abs().max().item()
            base = (torch_bf16.double() - exact).abs().max().item()
            ok = bool(torch.isfinite(got).all()) and err <= 2 * base + BASELINE_FLOOR[torch.bfloat16]
            rows.append(
                {
                    "check": f"varlen_attention bf16 {name} causal={causal}",
                    "ok": ok,
                    "ms": None,
                    "note": f"err {err:.2e} vs torch bf16 {base:.2e}",
                }
            )
    return rows


def _slice_repack_correctness(quick: bool) -> list[dict]:
    from seer_kernels import kernel_backend
    from seer_kernels.slice_repack import slice_repack
    from seer_kernels.slice_repack_control import PATH_NAMES, slice_repack_buffers

    batch, seq_len, dim = 64, 256, 4096 if not quick else 512
    tables = dict(
        micro_buckets=[8, 16, 32, 64, 128, 256],
        packed_buckets=[1024, 2048, 4096, 8192, 16384],
        batch_buckets=[1, 2, 4, 8, 16, 32, 64],
    )
    g = torch.Generator().manual_seed(0)
    scenarios = {  # name -> (keep_len, extra keyword arguments)
        "static": (torch.randint(120, 129, (batch,), generator=g), {}),
        "varlen": (torch.randint(1, 257, (batch,), generator=g), {}),
        "eager": (torch.randint(1, 5, (batch,), generator=g), {"eager_max_bucket": 8}),
        "empty": (torch.zeros(batch, dtype=torch.int64), {}),
    }
    rows = []
    for kind in ("ids", "bf16"):
        values = (
            torch.randint(0, 126_000, (batch, seq_len), generator=g)
            if kind == "ids"
            else torch.randn(batch, seq_len, dim, generator=g).to(torch.bfloat16)
        ).cuda()
        for name, (keep, extra) in scenarios.items():
            keep = keep.cuda()
            outs = []
            for backend in ("triton", "reference"):
                out = slice_repack_buffers(
                    batch_cap=64,
                    bucket_cap=256,
                    packed_cap=batch * seq_len,
                    cu_len=batch + 1,
                    dtype=values.dtype,
                    device="cuda",
                    hidden_dim=None if kind == "ids" else dim,
                )
                for t in (out.padded_values, out.packed_values):
                    t.view(torch.int16 if t.element_size() == 2 else torch.int64).fill_(0x55)
                for t in (
                    out.padded_positions,
                    out.padded_src_index,
                    out.packed_positions,
                    out.packed_seq_index,
                    out.packed_src_index,
                    out.cu_seqlens,
                ):
                    t.fill_(-3)
                out.padded_mask.fill_(True)
                host = torch.zeros(6, dtype=torch.int32, pin_memory=True)
                with kernel_backend(backend):
                    outs.append(
                        slice_repack(values, keep, **tables, out=out, control_host=host, pad_value=0, **extra)
                    )
            got, ref = outs
            same = all(
                torch.equal(getattr(got, f).view(torch.uint8), getattr(ref, f).view(torch.uint8))
                for f in (
                    "control",
                    "padded_values",
                    "padded_positions",
                    "padded_mask",
                    "padded_src_index",
                    "packed_values",
                    "packed_positions",
                    "packed_seq_index",
                    "packed_src_index",
                    "cu_seqlens",
                )
            )
            control = got.read()
            rows.append(
                {
                    "check": f"slice_repack {kind} {name}",
                    "ok": same and control.error == 0,
                    "ms": None,
                    "note": f"path {PATH_NAMES[control.path]} bucket {control.bucket} T {control.total}",
                }
            )
    return rows


def _llada_lengths(batch: int, seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    response = torch.randint(1, 257, (batch,), generator=g).tolist()
    prefix = torch.randint(900, 1101, (batch,), generator=g).tolist()
    return response, [p + r for p, r in zip(prefix, response)]


def _timings(quick: bool) -> list[dict]:
    from triton.testing import do_bench

    from seer_kernels.slice_repack import slice_repack
    from seer_kernels.slice_repack_control import slice_repack_buffers
    from seer_kernels.varlen_attention import varlen_attention

    rep = 20 if quick else 100
    rows = []
    batch, heads, head_dim = 64, 32, 128
    lq, lk = _llada_lengths(batch, seed=1)
    q, k, v, cq, ck = make_varlen(lq, lk, heads, heads, head_dim, torch.bfloat16, "cuda")
    out = torch.empty_like(q)
    qp, kp, vp, mask = pad_for_sdpa(q, k, v, lq, lk)
    t_varlen = do_bench(lambda: varlen_attention(q, k, v, cq, ck, max(lq), max(lk), out=out), rep=rep)
    t_masked = do_bench(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask), rep=rep)
    t_flash = do_bench(
        lambda: F.scaled_dot_product_attention(qp, kp, vp), rep=rep
    )  # padded, no mask: lower bound
    ideal = ideal_ratio(lq, lk)
    flops = attention_flops(lq, lk, heads, head_dim)
    shape = f"B={batch} H={heads} d={head_dim} prefix~1000 + resp 1..256"
    rows.append(
        {
            "check": f"varlen_attention bf16 {shape}",
            "ok": None,
            "ms": t_varlen,
            "note": f"{flops / t_varlen / 1e9:.0f} TFLOP/s",
        }
    )
    rows.append(
        {
            "check": "padded SDPA + key mask, same lengths",
            "ok": None,
            "ms": t_masked,
            "note": f"varlen/padded measured {t_varlen / t_masked:.2f}, ideal {ideal:.2f}",
        }
    )
    rows.append(
        {
            "check": "padded SDPA without mask (flash), same lengths",
            "ok": None,
            "ms": t_flash,
            "note": f"varlen/padded measured {t_varlen / t_flash:.2f}, ideal {ideal:.2f}",
        }
    )

    tables = dict(
        micro_buckets=[8, 16, 32, 64, 128, 256],
        packed_buckets=[1024, 2048, 4096, 8192, 16384],
        batch_buckets=[1, 2, 4, 8, 16, 32, 64],
    )
    dim = 4096
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(batch, 256, dim, generator=g).to(torch.bfloat16).cuda()
    keep = torch.tensor(lq, device="cuda")
    buffers = slice_repack_buffers(
        batch_cap=64,
        bucket_cap=256,
        packed_cap=batch * 256,
        cu_len=batch + 1,
        dtype=hidden.dtype,
        device="cuda",
        hidden_dim=dim,
    )
    device_tables = {name: torch.tensor(t, dtype=torch.int32, device="cuda") for name, t in tables.items()}
    t_repack = do_bench(lambda: slice_repack(hidden, keep, **device_tables, out=buffers), rep=rep)
    control = slice_repack(hidden, keep, **device_tables, out=buffers).read()
    moved = (control.total + control.bucket) * dim * hidden.element_size()  # read T rows, write P slots
    rows.append(
        {
            "check": f"slice_repack bf16 hidden B={batch} N=256 D={dim}",
            "ok": None,
            "ms": t_repack,
            "note": f"path {control.path}, {moved / t_repack / 1e6:.0f} GB/s "
            f"({moved / t_repack / 1e6 / _H200_PEAK_GBPS:.0%} of an H200's peak)",
        }
    )
    return rows


def run(quick: bool) -> list[dict]:
    rows = _varlen_correctness(quick)
    rows += _slice_repack_correctness(quick)
    rows += _timings(quick)
    return rows
