"""seer_kernels.partial_attention: Triton (interpreter) against fp64 truth, the DyLLM identity, edges."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import pytest
import torch

from seer_kernels import kernel_backend
from seer_kernels.partial_attention import (
    _CONFIGS,
    KEY_CORRECTION_MAX_GAP_LOG2,
    KEY_CORRECTION_MAX_OLD_MASS,
    partial_attention,
    partial_attention_reference,
)
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.interpreter, pytest.mark.partial_attention]

BM = _CONFIGS[0].kwargs["BLOCK_M"]
BN = _CONFIGS[0].kwargs["BLOCK_N"]
BS = _CONFIGS[0].kwargs["BLOCK_S"]


@dataclass
class Case:
    lq: list[int]
    lk: list[int]
    H: int
    Hk: int
    d: int
    q_frac: float = 0.3
    k_frac: float = 0.3

    @property
    def id(self):
        return f"q{'-'.join(map(str, self.lq))}_k{'-'.join(map(str, self.lk))}_H{self.H}x{self.Hk}_d{self.d}"


CASES = [
    Case([1], [1], 1, 1, 16),
    Case([3], [1], 2, 1, 16, q_frac=0.5, k_frac=1.0),
    Case([BM], [BN], 2, 2, 64),
    Case([BM + 1, BM - 1], [BN + 1, 2 * BN], 4, 2, 59),  # GQA, non-power-of-two head dim, block edges
    Case([5, 2 * BM + 3, 1], [9, 3 * BN + 2, 17], 6, 2, 16, q_frac=0.2, k_frac=0.4),  # group of 3
    Case(
        [7, 20], [7 + 30, 20 + 25], 2, 1, 64, q_frac=0.1, k_frac=0.6
    ),  # prompt prefix: keys outnumber queries
    Case([4, 0, 6], [10, 5, 0], 2, 2, 16, q_frac=0.5, k_frac=0.5),  # zero queries; zero keys
]


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


def _inputs(case: Case, dtype, seed=0, *, q_mask=None, k_rows=None):
    """Random packed inputs; ``q_mask``/``k_rows`` override the random salient sets."""
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = _cu(case.lq), _cu(case.lk)
    Tq, Tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(Tq, case.H, case.d, generator=g).to(dtype)
    k = torch.randn(Tk, case.Hk, case.d, generator=g).to(dtype)
    v = torch.randn(Tk, case.Hk, case.d, generator=g).to(dtype)
    cache = torch.randn(Tq, case.H, case.d, generator=g).to(dtype)
    if q_mask is None:
        q_mask = torch.rand(Tq, generator=g) < case.q_frac
    if k_rows is None:
        k_rows = torch.nonzero(torch.rand(Tk, generator=g) < case.k_frac).flatten()
    cap = max(Tk, 1)
    index = torch.full((cap,), -1, dtype=torch.int32)
    index[: len(k_rows)] = k_rows.to(torch.int32)
    delta_v = torch.randn(cap, case.Hk, case.d, generator=g).to(dtype)
    delta_v[len(k_rows) :] = float("nan")  # slots past the count must never be read
    count = torch.tensor([len(k_rows)], dtype=torch.int32)
    return dict(
        q=q,
        k=k,
        v=v,
        ctx_cache=cache,
        delta_v=delta_v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(case.lq),
        max_seqlen_k=max(case.lk),
        salient_q_mask=q_mask,
        salient_k_index=index,
        salient_k_count=count,
    )


def _as(args, dtype):
    return {
        k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in args.items()
    }


def _lowp_torch(args):
    """The same math as the reference, but in the inputs' own dtype throughout (no upcast):
    the 'torch in the same dtype' baseline of the 2x-error rule."""
    q, k, v, cache, dv = args["q"], args["k"], args["v"], args["ctx_cache"], args["delta_v"]
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[2])
    out = torch.zeros_like(q)
    cq, ck = args["cu_seqlens_q"].tolist(), args["cu_seqlens_k"].tolist()
    n = int(args["salient_k_count"])
    kidx = args["salient_k_index"][:n].long()
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if qe == qs:
            continue
        qb = q[qs:qe].transpose(0, 1)
        kb = k[ks:ke].repeat_interleave(group, 1).transpose(0, 1)
        vb = v[ks:ke].repeat_interleave(group, 1).transpose(0, 1)
        p = torch.softmax((qb @ kb.transpose(1, 2)) * scale, dim=-1)
        pos = torch.nonzero((kidx >= ks) & (kidx < ke)).flatten()
        dvb = dv[pos].repeat_interleave(group, 1).transpose(0, 1)
        approx = cache[qs:qe].transpose(0, 1) + p[:, :, kidx[pos] - ks] @ dvb
        if args.get("k_old") is not None and len(pos):
            approx = _lowp_key_correction(approx, qb, kb, vb, args["k_old"][pos], dvb, kidx[pos] - ks, cache[qs:qe])
        sal = args["salient_q_mask"][qs:qe].view(1, -1, 1)
        out[qs:qe] = torch.where(sal, p @ vb, approx).transpose(0, 1)
    return out


def _lowp_key_correction(approx, qb, kb, vb, k_old, dvb, cols, cache):
    """The reference's key correction, its dot in the inputs' dtype. Scores and sums in fp32 (as
    ``torch.softmax`` does inside): in fp16 they would flip rows near the old-mass limit, and a
    flipped row's error (the whole correction) says nothing about the dtype's rounding."""
    group = qb.shape[0] // k_old.shape[1]
    scale = 1.0 / math.sqrt(qb.shape[2])
    clamp = KEY_CORRECTION_MAX_GAP_LOG2 * math.log(2)
    s = (qb.float() @ kb.float().transpose(1, 2)) * scale
    m = s.amax(-1, keepdim=True)
    l = torch.exp(s - m).sum(-1, keepdim=True)
    e_new = torch.exp(s[:, :, cols] - m)
    gap = (qb.float() @ k_old.float().repeat_interleave(group, 1).permute(1, 2, 0)) * scale - m
    e_old = torch.exp(gap.clamp(max=clamp))
    sum_new, sum_old = e_new.sum(-1, keepdim=True), e_old.sum(-1, keepdim=True)
    dpv = (e_new - e_old).to(qb.dtype) @ (vb[:, cols] - dvb)
    corrected = approx + ((dpv.float() - (sum_new - sum_old) * cache.transpose(0, 1).float()) / l).to(qb.dtype)
    l_old = l - sum_new + sum_old
    use = (l_old > 0) & (sum_old <= KEY_CORRECTION_MAX_OLD_MASS * l_old) & (gap.amax(-1, keepdim=True) <= clamp)
    return torch.where(use, corrected, approx)


def _dense64(q, k, v, cu_q, cu_k):
    """Plain bidirectional varlen attention in fp64 (zeros for a sequence without keys)."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if qe == qs or ke == ks:
            continue
        qb = q[qs:qe].double().transpose(0, 1)
        kb = k[ks:ke].double().repeat_interleave(group, 1).transpose(0, 1)
        vb = v[ks:ke].double().repeat_interleave(group, 1).transpose(0, 1)
        p = torch.softmax(qb @ kb.transpose(1, 2) / math.sqrt(q.shape[2]), dim=-1)
        out[qs:qe] = (p @ vb).transpose(0, 1)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_fp64_within_twice_torch_error(case, dtype):
    args = _inputs(case, dtype, seed=len(case.id))
    out = partial_attention(**args)
    exact = partial_attention_reference(**_as(args, torch.float64))
    assert out.shape == args["q"].shape and out.dtype == dtype
    assert_within_baseline_error(out, _lowp_torch(args), exact, msg=case.id)
    # and the reference itself (the CPU fallback) agrees with the kernel
    ref = partial_attention_reference(**args)
    assert_within_baseline_error(ref, _lowp_torch(args), exact, msg=f"reference {case.id}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", [CASES[3], CASES[4], CASES[5]], ids=lambda c: c.id)
def test_identity_exact_when_only_v_changed(case, dtype):
    """ctx_cache = attention with V_old; V changes only at the salient keys; K unchanged.
    Then every row (approximate or exact) equals attention with V_new."""
    args = _inputs(case, dtype, seed=3)
    v_old = args["v"]
    n = int(args["salient_k_count"])
    rows = args["salient_k_index"][:n].long()
    v_new = v_old.clone()
    v_new[rows] = (v_old[rows].double() + torch.randn(n, case.Hk, case.d, dtype=torch.float64)).to(dtype)
    exact_old = _dense64(args["q"], args["k"], v_old, args["cu_seqlens_q"], args["cu_seqlens_k"])
    args["ctx_cache"] = exact_old.to(dtype)
    args["v"] = v_new
    args["delta_v"][:n] = (v_new[rows].double() - v_old[rows].double()).to(dtype)
    exact_new = _dense64(args["q"], args["k"], v_new, args["cu_seqlens_q"], args["cu_seqlens_k"])
    out = partial_attention(**args)
    # baseline: torch computing the new attention densely in the same dtype
    all_sal = dict(args, salient_q_mask=torch.ones_like(args["salient_q_mask"]))
    assert_within_baseline_error(out, _lowp_torch(all_sal), exact_new, msg="identity")
    # the approximate rows really did change (the test would catch an update that does nothing)
    non = ~args["salient_q_mask"]
    has_keys = torch.repeat_interleave(torch.tensor([lk > 0 for lk in case.lk]), torch.tensor(case.lq))
    moved = (exact_new - exact_old)[non & has_keys].abs().max()
    assert moved > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_all_rows_salient_is_plain_attention_and_ignores_cache(dtype):
    case = CASES[4]
    args = _inputs(case, dtype, seed=5)
    args["salient_q_mask"] = torch.ones_like(args["salient_q_mask"])
    args["ctx_cache"] = torch.full_like(args["ctx_cache"], float("nan"))
    out = partial_attention(**args)
    exact = _dense64(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"])
    assert not out.isnan().any()
    assert_within_baseline_error(out, _lowp_torch(args), exact, msg="all salient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("count", [0, "elsewhere"])
def test_no_salient_rows_returns_cache_exactly(dtype, count):
    case = Case([BM + 2, 5], [BN + 3, 40], 4, 2, 16)
    args = _inputs(
        case,
        dtype,
        seed=6,
        q_mask=torch.zeros(BM + 7, dtype=torch.bool),
        k_rows=torch.empty(0, dtype=torch.int64) if count == 0 else torch.tensor([BN + 3 + 4, BN + 3 + 39]),
    )
    out = partial_attention(**args)
    seq0 = slice(0, BM + 2)
    # sequence 0 has no salient key (count 0, or salient keys only in sequence 1): exactly the cache
    assert torch.equal(out[seq0], args["ctx_cache"][seq0])
    if count == 0:
        assert torch.equal(out, args["ctx_cache"])
    else:  # sequence 1's rows did move, by the salient keys of their own sequence only
        assert not torch.equal(out[BM + 2 :], args["ctx_cache"][BM + 2 :])
        exact = partial_attention_reference(**_as(args, torch.float64))
        assert_within_baseline_error(out, _lowp_torch(args), exact)


def test_salient_keys_of_other_sequences_are_ignored():
    case = Case([6, 6], [10, 10], 2, 1, 16)
    base = _inputs(case, torch.float32, seed=7, k_rows=torch.tensor([2, 5]))
    more = dict(
        base,
        salient_k_index=torch.tensor([2, 5, 11, 17] + [-1] * 16, dtype=torch.int32),
        salient_k_count=torch.tensor([4], dtype=torch.int32),
        delta_v=base["delta_v"].clone(),
    )
    more["delta_v"][:2] = base["delta_v"][:2]
    more["delta_v"][2:4] = torch.randn(2, 1, 16) * 100
    a = partial_attention(**base)
    b = partial_attention(**more)
    # sequence 0's rows see only keys 2 and 5 in both calls; sequence 1's rows change
    assert torch.equal(a[:6], b[:6])
    non1 = ~base["salient_q_mask"][6:]
    assert non1.any() and (a[6:][non1] - b[6:][non1]).abs().max() > 1e-3


def test_zero_key_sequence():
    case = Case([4, 3], [0, 5], 2, 2, 16)
    q_mask = torch.tensor([True, False, True, False, True, False, False])
    args = _inputs(case, torch.float32, seed=8, q_mask=q_mask, k_rows=torch.tensor([1, 4]))
    out = partial_attention(**args)
    ref = partial_attention_reference(**args)
    assert torch.equal(out[[0, 2]], torch.zeros(2, 2, 16))  # exact rows over no keys: 0
    assert torch.equal(out[[1, 3]], args["ctx_cache"][[1, 3]])  # approximate rows: the cache
    assert torch.equal(ref[:4], out[:4])
    assert not out.isnan().any()


def test_out_may_alias_ctx_cache_and_padding_rows_are_kept():
    case = CASES[3]
    args = _inputs(case, torch.float32, seed=9)
    expected = partial_attention(**args)
    # packed rows followed by padding rows that belong to no sequence
    pad = 5
    Tq = args["q"].shape[0]
    padded = dict(args)
    padded["q"] = torch.cat([args["q"], torch.randn(pad, case.H, case.d)])
    padded["ctx_cache"] = torch.cat([args["ctx_cache"], torch.full((pad, case.H, case.d), 7.0)])
    padded["salient_q_mask"] = torch.cat([args["salient_q_mask"], torch.ones(pad, dtype=torch.bool)])
    fresh = partial_attention(**padded)
    assert torch.equal(fresh[:Tq], expected) and not fresh[Tq:].any()
    cache = padded["ctx_cache"]
    res = partial_attention(**padded, out=cache)
    assert res.data_ptr() == cache.data_ptr()
    assert torch.equal(cache[:Tq], expected)
    assert torch.equal(cache[Tq:], torch.full((pad, case.H, case.d), 7.0))


def test_strided_inputs_and_int_count():
    """q/k/v as views into a fused QKV projection; the count as a Python int."""
    case = CASES[3]
    args = _inputs(case, torch.float32, seed=10)
    Tq = args["q"].shape[0]
    fused = torch.randn(Tq, 3, case.H, case.d)
    fused[:, 0] = args["q"]
    args_view = dict(args, q=fused[:, 0], salient_k_count=int(args["salient_k_count"]))
    kv = torch.randn(args["k"].shape[0], 2, case.Hk, case.d)
    kv[:, 0], kv[:, 1] = args["k"], args["v"]
    args_view.update(k=kv[:, 0], v=kv[:, 1])
    assert not args_view["q"].is_contiguous()
    torch.testing.assert_close(partial_attention(**args_view), partial_attention(**args), rtol=0, atol=0)


def test_softmax_scale():
    case = CASES[2]
    args = _inputs(case, torch.float32, seed=11)
    out = partial_attention(**args, softmax_scale=0.05)
    exact = partial_attention_reference(**_as(args, torch.float64), softmax_scale=0.05)
    default = partial_attention_reference(**_as(args, torch.float64))
    assert (exact - default).abs().max() > 1e-2
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=1e-5)


def test_bitwise_repeatable():
    args = _inputs(CASES[4], torch.float16, seed=12)
    first = partial_attention(**args)
    for _ in range(2):
        assert torch.equal(partial_attention(**args).view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("k_old", [False, True])
def test_unchecked_call_gives_the_checked_result(k_old):
    """``check=False`` (DyLLM's sparse layers, which build the arguments) skips the checks only."""
    args = _inputs(CASES[4], torch.float32, seed=21)
    if k_old:
        args = _with_k_old(args, seed=21)
    assert torch.equal(partial_attention(**args, check=False), partial_attention(**args))


def test_reference_backend_is_the_reference():
    args = _inputs(CASES[3], torch.float32, seed=13)
    with kernel_backend("reference"):
        ref = partial_attention(**args)
    assert torch.equal(ref, partial_attention_reference(**args))


def _bad(**over):
    args = _inputs(Case([3, 2], [4, 6], 4, 2, 16), torch.float32, seed=1, k_rows=torch.tensor([1, 5]))
    args.update(over)
    return lambda: partial_attention(**args)


@pytest.mark.parametrize(
    "over, exc, name",
    [
        (dict(q=torch.randn(5, 4, 16, dtype=torch.float64)), TypeError, "q"),
        (dict(q=torch.randn(5, 64)), ValueError, "q"),
        (dict(k=torch.randn(10, 2, 16, dtype=torch.float16)), TypeError, "k"),
        (dict(k=torch.randn(10, 2, 8)), ValueError, "k"),
        (dict(k=torch.randn(10, 3, 16), v=torch.randn(10, 3, 16)), ValueError, "heads"),
        (dict(v=torch.randn(9, 2, 16)), ValueError, "v"),
        (dict(ctx_cache=torch.randn(5, 4, 15)), ValueError, "ctx_cache"),
        (dict(delta_v=torch.randn(9, 2, 16)), ValueError, "delta_v"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 5])), TypeError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 6], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
        (dict(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
        (dict(max_seqlen_q=2), ValueError, "max_seqlen"),
        (dict(max_seqlen_k=5), ValueError, "max_seqlen"),
        (dict(max_seqlen_q=3.0), TypeError, "max_seqlen_q"),
        (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
        (dict(salient_q_mask=torch.zeros(5, dtype=torch.int32)), TypeError, "salient_q_mask"),
        (dict(salient_q_mask=torch.zeros(4, dtype=torch.bool)), ValueError, "salient_q_mask"),
        (dict(salient_k_index=torch.zeros(10, dtype=torch.int64)), TypeError, "salient_k_index"),
        (
            dict(salient_k_index=torch.tensor([5, 1] + [-1] * 8, dtype=torch.int32)),
            ValueError,
            "salient_k_index",
        ),
        (
            dict(salient_k_index=torch.tensor([1, 1] + [-1] * 8, dtype=torch.int32)),
            ValueError,
            "salient_k_index",
        ),
        (
            dict(salient_k_index=torch.tensor([1, 10] + [-1] * 8, dtype=torch.int32)),
            ValueError,
            "salient_k_index",
        ),
        (dict(salient_k_count=torch.tensor([2], dtype=torch.int64)), ValueError, "salient_k_count"),
        (dict(salient_k_count=11), ValueError, "salient_k_count"),
        (dict(salient_k_count=2.0), TypeError, "salient_k_count"),
        (dict(softmax_scale="0.1"), TypeError, "softmax_scale"),
        (dict(softmax_scale=float("inf")), ValueError, "softmax_scale"),
        (dict(out=torch.empty(5, 4, 16, dtype=torch.float16)), TypeError, "out"),
        (dict(out=torch.empty(6, 4, 16)), ValueError, "out"),
        (dict(k_old=torch.randn(10, 2, 16, dtype=torch.float16)), TypeError, "k_old"),
        (dict(k_old=torch.randn(9, 2, 16)), ValueError, "k_old"),
        (dict(k_old=torch.randn(10, 4, 16)), ValueError, "k_old"),
        (dict(k_old=torch.randn(10, 32)), ValueError, "k_old"),
        (dict(k_old=[[0.0]]), TypeError, "k_old"),
        (dict(k_old=torch.empty(10, 2, 16, device="meta")), ValueError, "k_old"),
    ],
)
def test_bad_inputs_name_the_argument(over, exc, name):
    with pytest.raises(exc, match=name):
        _bad(**over)()


def test_bf16_runs_in_fp32_under_the_interpreter():
    """bf16 tl.dot is silently wrong in the interpreter; the launcher upcasts there instead."""
    case = CASES[3]
    args = _inputs(case, torch.bfloat16, seed=14)
    out = partial_attention(**args)
    exact = partial_attention_reference(**_as(args, torch.float64))
    assert out.dtype == torch.bfloat16
    assert_within_baseline_error(out, _lowp_torch(args), exact, msg="bf16")


# ---------------------------------------------------------------------- key correction (k_old)


def _with_k_old(args, seed, noise=1.0):
    """``args`` plus ``k_old``: the salient keys moved by ``noise`` x N(0, 1); slots past the count NaN."""
    g = torch.Generator().manual_seed(seed)
    n = int(args["salient_k_count"])
    rows = args["salient_k_index"][:n].long()
    k_old = torch.full_like(args["delta_v"], float("nan"))
    k_old[:n] = (args["k"][rows].double() + noise * torch.randn(k_old[:n].shape, generator=g, dtype=torch.float64)).to(
        k_old.dtype
    )
    return dict(args, k_old=k_old)


def _old_state64(args):
    """fp64 keys, values, and each (query row, head)'s attention mass on its sequence's salient
    keys, all before this step: K and V with the salient rows put back to k_old and v - delta_v."""
    n = int(args["salient_k_count"])
    rows = args["salient_k_index"][:n].long()
    k_old, v_old = args["k"].double().clone(), args["v"].double().clone()
    k_old[rows] = args["k_old"][:n].double()
    v_old[rows] -= args["delta_v"][:n].double()
    q, cq, ck = args["q"].double(), args["cu_seqlens_q"].tolist(), args["cu_seqlens_k"].tolist()
    group = q.shape[1] // k_old.shape[1]
    mass = torch.zeros(q.shape[:2], dtype=torch.float64)
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if qe == qs or ke == ks:
            continue
        kb = k_old[ks:ke].repeat_interleave(group, 1).transpose(0, 1)
        p = torch.softmax(q[qs:qe].transpose(0, 1) @ kb.transpose(1, 2) / math.sqrt(q.shape[2]), dim=-1)
        cols = rows[(rows >= ks) & (rows < ke)] - ks
        mass[qs:qe] = p[:, :, cols].sum(-1).transpose(0, 1)
    return k_old, v_old, mass


# CASES[5] with fewer salient keys: at 60% every row's old mass on them is over the limit
PREFIX_FEW_SALIENT = Case([7, 20], [37, 45], 2, 1, 64, q_frac=0.1, k_frac=0.35)


@pytest.mark.parametrize("case", [CASES[3], CASES[4], PREFIX_FEW_SALIENT, CASES[6]], ids=lambda c: c.id)
def test_key_correction_is_exact_when_old_mass_is_small(case):
    """ctx_cache = exact attention before the step (old K and V at the salient keys). Then the
    reference (fp64) gives exact new attention on every non-salient row whose old mass on the
    salient keys is <= the limit, and the plain update on the others; salient rows are exact."""
    args = _with_k_old(_inputs(case, torch.float64, seed=20), seed=21)
    k_old, v_old, mass = _old_state64(args)
    cu = (args["cu_seqlens_q"], args["cu_seqlens_k"])
    args["ctx_cache"] = _dense64(args["q"], k_old, v_old, *cu)
    exact_new = _dense64(args["q"], args["k"], args["v"], *cu)
    out = partial_attention_reference(**args)
    plain = partial_attention_reference(**dict(args, k_old=None))
    non = (~args["salient_q_mask"])[:, None].expand_as(mass)
    small = non & (mass <= KEY_CORRECTION_MAX_OLD_MASS - 1e-9)
    large = non & (mass > KEY_CORRECTION_MAX_OLD_MASS + 1e-9)
    assert small.any() and large.any() and int((small | large).sum()) == int(non.sum())
    torch.testing.assert_close(out[small], exact_new[small], rtol=0, atol=1e-10)
    assert torch.equal(out[large], plain[large])
    assert torch.equal(out[~non], plain[~non])
    torch.testing.assert_close(out[~non], exact_new[~non], rtol=0, atol=1e-10)
    # the correction mattered: the plain update is visibly off on the small-mass rows
    assert (plain[small] - exact_new[small]).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", [CASES[4], CASES[5]], ids=lambda c: c.id)
def test_k_old_equal_to_k_is_the_plain_update_bitwise(case, dtype):
    args = _inputs(case, dtype, seed=22)
    n = int(args["salient_k_count"])
    k_old = torch.full_like(args["delta_v"], float("nan"))
    k_old[:n] = args["k"][args["salient_k_index"][:n].long()]
    assert torch.equal(partial_attention(**args, k_old=k_old), partial_attention(**args))
    assert torch.equal(partial_attention_reference(**args, k_old=k_old), partial_attention_reference(**args))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_key_correction_matches_fp64_within_twice_torch_error(case, dtype):
    args = _with_k_old(_inputs(case, dtype, seed=len(case.id) + 30), seed=31)
    out = partial_attention(**args)
    exact = partial_attention_reference(**_as(args, torch.float64))
    assert out.dtype == dtype and not out.isnan().any()
    assert_within_baseline_error(out, _lowp_torch(args), exact, msg=case.id)
    ref = partial_attention_reference(**args)
    assert_within_baseline_error(ref, _lowp_torch(args), exact, msg=f"reference {case.id}")
    plain = partial_attention_reference(**_as(dict(args, k_old=None), torch.float64))
    if max(case.lq) > 1 and case.k_frac < 1:  # the correction changed some rows (not all keys salient)
        assert (exact - plain).abs().max() > 1e-2
    sal = args["salient_q_mask"]
    assert torch.equal(out[sal], partial_attention(**dict(args, k_old=None))[sal])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("variant", ["no_salient_rows", "all_rows_salient", "int_count", "no_salient_keys"])
def test_key_correction_edges(variant, dtype):
    case = CASES[4]
    Tq = sum(case.lq)
    q_mask = {"no_salient_rows": torch.zeros(Tq, dtype=torch.bool), "all_rows_salient": torch.ones(Tq, dtype=bool)}
    k_rows = torch.empty(0, dtype=torch.int64) if variant == "no_salient_keys" else None
    args = _with_k_old(_inputs(case, dtype, seed=40, q_mask=q_mask.get(variant), k_rows=k_rows), seed=41)
    out = partial_attention(**args)
    plain = partial_attention(**dict(args, k_old=None))
    if variant == "all_rows_salient":  # k_old does not touch exact rows
        assert torch.equal(out, plain)
    elif variant == "no_salient_keys":  # nothing changed: the cache, exactly
        non = ~args["salient_q_mask"]
        assert non.any() and torch.equal(out[non], args["ctx_cache"][non])
        assert torch.equal(out, plain)
    elif variant == "int_count":
        assert torch.equal(partial_attention(**dict(args, salient_k_count=int(args["salient_k_count"]))), out)
    else:
        exact = partial_attention_reference(**_as(args, torch.float64))
        assert_within_baseline_error(out, _lowp_torch(args), exact, msg=variant)


def test_key_correction_zero_key_sequence():
    case = Case([4, 3], [0, 5], 2, 2, 16)
    q_mask = torch.tensor([True, False, True, False, True, False, False])
    args = _with_k_old(_inputs(case, torch.float32, seed=42, q_mask=q_mask, k_rows=torch.tensor([1, 4])), seed=43)
    out = partial_attention(**args)
    assert torch.equal(out[[0, 2]], torch.zeros(2, 2, 16))
    assert torch.equal(out[[1, 3]], args["ctx_cache"][[1, 3]])
    assert torch.equal(partial_attention_reference(**args)[:4], out[:4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_key_correction_huge_old_score_falls_back_without_overflow(dtype):
    """One old key scores ~1e4 above the new ones for about half the (row, head) pairs: those
    fall back to the plain update (no inf or nan anywhere), the others see e_old = 0 for it."""
    case = CASES[3]
    args = _with_k_old(_inputs(case, dtype, seed=44), seed=45)
    n = int(args["salient_k_count"])
    slot = n // 2
    sign = torch.where(torch.randn(case.Hk, case.d) > 0, 1.0, -1.0)
    args["k_old"][slot] = (1e4 * sign).to(dtype)
    out = partial_attention(**args)
    ref = partial_attention_reference(**args)
    plain = partial_attention(**dict(args, k_old=None))
    assert out.isfinite().all() and ref.isfinite().all()
    # (row, head) pairs of the slot's sequence whose score against the huge key is positive
    key = int(args["salient_k_index"][slot])
    cu_k, cu_q = args["cu_seqlens_k"].tolist(), args["cu_seqlens_q"].tolist()
    b = max(i for i in range(len(cu_k) - 1) if cu_k[i] <= key)
    rows = torch.arange(cu_q[b], cu_q[b + 1])
    rows = rows[~args["salient_q_mask"][rows]]
    group = case.H // case.Hk
    score = (args["q"][rows].double() * args["k_old"][slot].double().repeat_interleave(group, 0)).sum(-1)
    up = score > 0
    assert up.any() and (~up).any()
    assert torch.equal(out[rows][up], plain[rows][up])
    exact = partial_attention_reference(**_as(args, torch.float64))
    assert_within_baseline_error(out, _lowp_torch(args), exact, msg="huge old score")


def test_key_correction_clamped_old_score_falls_back(monkeypatch):
    """With the clamp lowered to 0.5 base-2 units, every (row, head) with an old score more than
    0.5 ln 2 above its max new score falls back to the plain update; the rest are unchanged."""
    partial_attn = importlib.import_module("seer_kernels.partial_attention")  # the module, not the op

    args = _with_k_old(_inputs(CASES[4], torch.float32, seed=46), seed=47)
    before, ref_before = partial_attention(**args), partial_attention_reference(**args)
    no_k_old = dict(args, k_old=None)
    plain, ref_plain = partial_attention(**no_k_old), partial_attention_reference(**no_k_old)
    monkeypatch.setattr(partial_attn, "KEY_CORRECTION_MAX_GAP_LOG2", 0.5)
    out = partial_attention(**args)
    ref = partial_attention_reference(**args)
    # each (row, head)'s largest old salient score minus its largest new score, in fp64
    q, k, k_old = args["q"].double(), args["k"].double(), args["k_old"].double()
    n = int(args["salient_k_count"])
    kidx = args["salient_k_index"][:n].long()
    group = CASES[4].H // CASES[4].Hk
    gap = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    cq, ck = args["cu_seqlens_q"].tolist(), args["cu_seqlens_k"].tolist()
    for b in range(len(cq) - 1):
        pos = torch.nonzero((kidx >= ck[b]) & (kidx < ck[b + 1])).flatten()
        qb = q[cq[b] : cq[b + 1]].transpose(0, 1)
        s_new = qb @ k[ck[b] : ck[b + 1]].repeat_interleave(group, 1).permute(1, 2, 0)
        s_old = qb @ k_old[pos].repeat_interleave(group, 1).permute(1, 2, 0)
        if len(pos):
            gap[cq[b] : cq[b + 1]] = ((s_old.amax(-1) - s_new.amax(-1)) / math.sqrt(q.shape[2])).transpose(0, 1)
    non = (~args["salient_q_mask"])[:, None].expand_as(gap)
    thr = 0.5 * math.log(2)
    hit, clear = non & (gap > thr + 1e-4), non & (gap < thr - 1e-4)
    assert hit.any() and clear.any() and int((hit | clear).sum()) == int(non.sum())
    assert torch.equal(out[hit], plain[hit]) and torch.equal(ref[hit], ref_plain[hit])
    assert torch.equal(out[clear], before[clear]) and torch.equal(ref[clear], ref_before[clear])
    assert not torch.equal(out[hit], before[hit])  # some of them did use the correction before


def test_key_correction_bf16_under_the_interpreter():
    args = _with_k_old(_inputs(CASES[3], torch.bfloat16, seed=48), seed=49)
    out = partial_attention(**args)
    exact = partial_attention_reference(**_as(args, torch.float64))
    assert out.dtype == torch.bfloat16
    assert_within_baseline_error(out, _lowp_torch(args), exact, msg="bf16 k_old")
