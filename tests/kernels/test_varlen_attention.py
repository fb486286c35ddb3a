"""varlen_attention: the Triton kernel (in the interpreter) against torch SDPA per sequence.

Accuracy follows flash-attention's rule: the kernel's error against an fp64 reference is at
most twice the error of torch's own SDPA in the same dtype, plus a floor (tests/tolerances.py).
"""

from __future__ import annotations

import pytest
import torch

from seer_kernels import kernel_backend
from seer_kernels.varlen_attention import (
    _varlen_attention_triton,
    varlen_attention,
    varlen_attention_reference,
)
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.interpreter, pytest.mark.varlen_attention]

# (query lengths, key lengths): block edges of the interpreter's 16-wide tiles, empties, prefixes
CASES = {
    "self_mixed": ([0, 1, 2, 17, 33], [0, 1, 2, 17, 33]),
    "prefix": ([1, 17, 2, 33], [20, 40, 2, 35]),  # cached prefix: keys longer than queries
    "zero_keys_and_short_keys": ([5, 17, 3], [0, 2, 16]),  # causal: most queries see nothing
}
HEADS = {"self_mixed": (4, 1), "prefix": (4, 2), "zero_keys_and_short_keys": (2, 2)}


def _cu(lengths: list[int]) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32)


def _make(lq, lk, heads, kv_heads, head_dim, dtype, *, spare_rows=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq) + spare_rows, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(sum(lk), kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(sum(lk), kv_heads, head_dim, generator=g).to(dtype)
    return q, k, v, _cu(lq), _cu(lk)


def _naive(q, k, v, lq, lk, *, causal, scale=None):
    """A second, loop-by-loop fp64 implementation of the convention (independent of SDPA)."""
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    q0 = k0 = 0
    for nq, nk in zip(lq, lk):
        for h in range(heads):
            qs = q[q0 : q0 + nq, h].double()
            ks = k[k0 : k0 + nk, h // group].double()
            vs = v[k0 : k0 + nk, h // group].double()
            for i in range(nq):
                visible = [j for j in range(nk) if not causal or j <= i + nk - nq]
                if not visible:
                    continue
                s = (ks[visible] @ qs[i]) * scale
                p = torch.softmax(s, dim=0)
                out[q0 + i, h] = p @ vs[visible]
        q0 += nq
        k0 += nk
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("head_dim", [16, 59, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_torch_within_twice_its_error(case, causal, head_dim, dtype):
    lq, lk = CASES[case]
    heads, kv_heads = HEADS[case]
    q, k, v, cq, ck = _make(lq, lk, heads, kv_heads, head_dim, dtype)
    got = varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=causal)
    assert got.dtype == dtype and got.shape == q.shape
    exact = varlen_attention_reference(
        q.double(), k.double(), v.double(), cq, ck, max(lq), max(lk), causal=causal
    )
    torch_same_dtype = varlen_attention_reference(
        q, k, v, cq, ck, max(lq), max(lk), causal=causal, compute_dtype=dtype
    )
    assert torch.isfinite(got).all()
    assert_within_baseline_error(got, torch_same_dtype, exact, msg=f"{case} causal={causal} d={head_dim}")


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_bf16_in_the_interpreter_runs_its_dots_in_fp32(causal):
    """bf16 math is silently wrong in the interpreter; the launcher makes the kernel upcast there."""
    lq, lk = [3, 17, 0], [20, 17, 4]
    q, k, v, cq, ck = _make(lq, lk, 4, 2, 59, torch.bfloat16)
    got = varlen_attention(q, k, v, cq, ck, 17, 20, causal=causal)
    exact = varlen_attention_reference(q.double(), k.double(), v.double(), cq, ck, 17, 20, causal=causal)
    torch_bf16 = varlen_attention_reference(
        q, k, v, cq, ck, 17, 20, causal=causal, compute_dtype=torch.bfloat16
    )
    assert_within_baseline_error(got, torch_bf16, exact)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_reference_matches_naive_loops(causal):
    """The SDPA-based reference itself against a loop-by-loop reading of the convention."""
    lq, lk = [0, 3, 5, 2], [4, 3, 2, 0]
    q, k, v, cq, ck = _make(lq, lk, 4, 2, 8, torch.float64)
    ref = varlen_attention_reference(q, k, v, cq, ck, 5, 4, causal=causal)
    torch.testing.assert_close(ref, _naive(q, k, v, lq, lk, causal=causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("blocks", [(16, 32), (32, 16)], ids=["m16n32", "m32n16"])
def test_other_tile_shapes(blocks, causal):
    """Unequal BLOCK_M / BLOCK_N move the split between the mask-free and the masked key loop."""
    lq, lk = [33, 17, 40], [70, 17, 33]
    q, k, v, cq, ck = _make(lq, lk, 2, 1, 32, torch.float32)
    got = _varlen_attention_triton(
        q,
        k,
        v,
        cq,
        ck,
        40,
        70,
        softmax_scale=32**-0.5,
        causal=causal,
        out=None,
        block_m=blocks[0],
        block_n=blocks[1],
    )
    exact = _naive(q, k, v, lq, lk, causal=causal)
    torch_fp32 = varlen_attention_reference(q, k, v, cq, ck, 40, 70, causal=causal)
    assert_within_baseline_error(got, torch_fp32, exact)


@pytest.mark.parametrize("head_dim", [1, 8])
def test_head_dims_below_one_dot_tile(head_dim):
    lq, lk = [3, 17], [9, 17]
    q, k, v, cq, ck = _make(lq, lk, 2, 1, head_dim, torch.float32)
    got = varlen_attention(q, k, v, cq, ck, 17, 17, causal=True)
    exact = _naive(q, k, v, lq, lk, causal=True)
    torch_fp32 = varlen_attention_reference(q, k, v, cq, ck, 17, 17, causal=True)
    assert_within_baseline_error(got, torch_fp32, exact)


def test_out_given_and_padding_rows():
    lq, lk = [3, 17], [5, 20]
    q, k, v, cq, ck = _make(lq, lk, 2, 2, 16, torch.float32, spare_rows=4)
    out = torch.full_like(q, 7.0)
    got = varlen_attention(q, k, v, cq, ck, 17, 20, out=out)
    assert got is out
    assert torch.equal(out[20:], torch.full_like(out[20:], 7.0)), (
        "rows beyond cu_seqlens_q[-1] must be untouched"
    )
    fresh = varlen_attention(q, k, v, cq, ck, 17, 20)
    assert torch.equal(fresh[:20], out[:20])
    assert torch.equal(fresh[20:], torch.zeros_like(fresh[20:])), (
        "a fresh output reads 0 beyond cu_seqlens_q[-1]"
    )
    with kernel_backend("reference"):
        ref_out = torch.full_like(q, 7.0)
        varlen_attention(q, k, v, cq, ck, 17, 20, out=ref_out)
    assert torch.equal(ref_out[20:], out[20:])


def test_zero_keys_give_zeros_and_causal_rows_without_keys_give_zeros():
    lq, lk = [4, 6], [0, 2]
    q, k, v, cq, ck = _make(lq, lk, 2, 1, 16, torch.float32)
    got = varlen_attention(q, k, v, cq, ck, 6, 2, causal=True)
    assert torch.equal(got[:4], torch.zeros_like(got[:4]))
    # sequence 1: query i sees keys j <= i + 2 - 6, so queries 0..3 see nothing, 4 and 5 see some
    assert torch.equal(got[4:8], torch.zeros_like(got[4:8]))
    assert got[8:].abs().sum() > 0


def test_overestimated_max_seqlen_is_bitwise_identical():
    lq, lk = [2, 17, 9], [30, 17, 9]
    q, k, v, cq, ck = _make(lq, lk, 2, 2, 16, torch.float16)
    exact_grid = varlen_attention(q, k, v, cq, ck, 17, 30)
    big_grid = varlen_attention(q, k, v, cq, ck, 64, 512)
    assert torch.equal(exact_grid, big_grid)


def test_bitwise_repeat():
    lq, lk = [33, 1, 17], [40, 1, 17]
    q, k, v, cq, ck = _make(lq, lk, 4, 2, 59, torch.float16)
    first = varlen_attention(q, k, v, cq, ck, 33, 40, causal=True)
    for _ in range(2):
        assert torch.equal(varlen_attention(q, k, v, cq, ck, 33, 40, causal=True), first)


def test_softmax_scale_is_applied():
    lq, lk = [5, 17], [9, 17]
    q, k, v, cq, ck = _make(lq, lk, 2, 1, 16, torch.float32)
    got = varlen_attention(q, k, v, cq, ck, 17, 17, softmax_scale=0.9)
    exact = _naive(q, k, v, lq, lk, causal=False, scale=0.9)
    torch_fp32 = varlen_attention_reference(q, k, v, cq, ck, 17, 17, softmax_scale=0.9)
    assert_within_baseline_error(got, torch_fp32, exact)
    default = varlen_attention(q, k, v, cq, ck, 17, 17)
    assert (default - got).abs().max() > 1e-3


def test_strided_heads_view():
    """q as a view of a fused [T, 3, H, d] projection (non-contiguous token and head strides)."""
    lq = [5, 17]
    qkv = torch.randn(22, 3, 2, 24)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    cu = _cu(lq)
    got = varlen_attention(q, k, v, cu, cu, 17, 17)
    exact = _naive(q, k, v, lq, lq, causal=False)
    torch_fp32 = varlen_attention_reference(q, k, v, cu, cu, 17, 17)
    assert_within_baseline_error(got, torch_fp32, exact)


def test_empty_batch_and_empty_tokens():
    q = torch.randn(3, 2, 16)
    k = torch.randn(0, 2, 16)
    cu0 = torch.zeros(1, dtype=torch.int32)
    got = varlen_attention(q, k, k, cu0, cu0, 0, 0)
    assert torch.equal(got, torch.zeros_like(q))
    empty = torch.zeros(0, 2, 16)
    cu = torch.zeros(3, dtype=torch.int32)
    assert varlen_attention(empty, empty, empty, cu, cu, 0, 0).shape == (0, 2, 16)


def test_reference_backend_dispatch_agrees():
    lq, lk = [3, 17], [10, 17]
    q, k, v, cq, ck = _make(lq, lk, 4, 1, 59, torch.float32)
    with kernel_backend("reference"):
        ref = varlen_attention(q, k, v, cq, ck, 17, 17, causal=True)
    got = varlen_attention(q, k, v, cq, ck, 17, 17, causal=True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def _args(**overrides):
    q, k, v, cq, ck = _make([3, 4], [3, 4], 4, 2, 16, torch.float32)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=4, max_seqlen_k=4)
    args.update(overrides)
    return args


def _call(**overrides):
    a = _args(**overrides)
    kw = {key: a.pop(key) for key in ("softmax_scale", "causal", "out") if key in a}
    return varlen_attention(
        a["q"],
        a["k"],
        a["v"],
        a["cu_seqlens_q"],
        a["cu_seqlens_k"],
        a["max_seqlen_q"],
        a["max_seqlen_k"],
        **kw,
    )


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"q": torch.randn(7, 4, 16, dtype=torch.float64)}, TypeError, "q must have dtype"),
        ({"k": torch.randn(7, 2, 16, dtype=torch.float16)}, TypeError, "k and v must have q's dtype"),
        ({"q": torch.randn(7, 64)}, ValueError, "q must be 3-D"),
        ({"q": torch.randn(7, 3, 16)}, ValueError, "multiple of k's"),
        (
            {"q": torch.randn(7, 4, 300), "k": torch.randn(7, 2, 300), "v": torch.randn(7, 2, 300)},
            ValueError,
            "head dim must be in",
        ),
        ({"v": torch.randn(7, 2, 8)}, ValueError, "same shape"),
        ({"q": torch.randn(7, 4, 32)[:, :, ::2]}, ValueError, "q must have a contiguous last dim"),
        ({"cu_seqlens_q": torch.tensor([0, 3, 7])}, TypeError, "cu_seqlens_q must have dtype"),
        ({"cu_seqlens_k": torch.tensor([0, 7], dtype=torch.int32)}, ValueError, "same number of sequences"),
        ({"cu_seqlens_q": torch.tensor([1, 3, 7], dtype=torch.int32)}, ValueError, "must start at 0"),
        ({"cu_seqlens_q": torch.tensor([0, 5, 3], dtype=torch.int32)}, ValueError, "non-decreasing"),
        (
            {"cu_seqlens_k": torch.tensor([0, 3, 9], dtype=torch.int32), "max_seqlen_k": 6},
            ValueError,
            "exceeds the 7 packed rows",
        ),
        ({"max_seqlen_q": 3}, ValueError, "max_seqlen_q = 3 is below"),
        ({"max_seqlen_q": 4.0}, TypeError, "max_seqlen_q must be a host int"),
        ({"max_seqlen_k": -1}, ValueError, "max_seqlen_k must be >= 0"),
        ({"softmax_scale": "x"}, TypeError, "softmax_scale"),
        ({"causal": 1}, TypeError, "causal must be a bool"),
        ({"out": torch.empty(7, 4, 8)}, ValueError, "out must have q's shape"),
        ({"out": torch.empty(7, 4, 16, dtype=torch.float16)}, TypeError, "out must have dtype"),
    ],
)
def test_errors_name_the_argument(overrides, error, match):
    with pytest.raises(error, match=match):
        _call(**overrides)
