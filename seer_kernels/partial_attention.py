"""DyLLM partial attention: exact rows for salient queries, a sparse ``P[:, A] @ dV`` update for the rest.

In a DyLLM sparse step only the salient rows ``A`` got new K/V at this layer, and ``V``
changed there by ``dV = V_new[A] - V_old[A]``. For a query row ``i`` that is not salient,
``C_i ~= C_cache_i + sum_{j in A} P_ij dV_j`` with ``P_i = softmax(q_i K^T * scale)`` taken
over **all** keys of the row's sequence: the normaliser needs every key (an online max/sum
pass over ``QK^T``), but the ``P @ V`` product touches only the ``|A|`` salient columns.
Salient query rows get exact attention ``softmax(q K^T * scale) V``.

Kernels:

1. ``_order_queries_kernel`` (one program per sequence) writes a permutation of each
   sequence's query rows with the salient rows first, so that query blocks are (all but one
   per sequence) purely salient or purely non-salient.
2. ``_partial_attention_kernel`` (one program per query block, sequence and head): the
   online-softmax pass over all keys of the sequence, accumulating ``P @ V`` only when the
   block holds a salient row; then, when the block holds a non-salient row, a pass over the
   salient keys of the sequence (found by binary search in the ascending index) that
   recomputes their scores and accumulates ``P[:, A] @ dV``. So ``QK^T`` costs
   ``O(Tq * Tk * d)`` as in dense attention, but ``P @ V`` costs ``O(|A_q| * Tk * d + Tq *
   |A_k| * d)`` up to the block granularity.

Key correction (optional ``k_old``): the update above is exact only when ``V`` alone changed,
but the salient keys ``K[A]`` changed too. Given the old keys, a non-salient row rebuilds its
cache ``C_cache = P_old V_old`` into the part on the unchanged keys and the part on ``A``
(whose old scores it recomputes from ``k_old``), swaps the salient part for the new one and
renormalises the row. That is exact when ``q_i`` and the non-salient keys are unchanged since
``ctx_cache`` was computed, and it reduces to the update above when ``k_old == k``. When the
salient keys held more than :data:`KEY_CORRECTION_MAX_OLD_MASS` of the row's old attention
mass, recovering the unchanged part subtracts nearly equal numbers (ill-conditioned), so the
row falls back to the plain update. It costs one more ``q k_old^T`` and ``P @ V_old`` over the
salient keys, in the same pass.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _dispatch

_CONFIGS = _dispatch.single_config_when_interpreting(
    [
        # first entry: the one the interpreter uses (smallest legal tl.dot tiles)
        triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_S": 16}, num_warps=4, num_stages=1),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_S": 32}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_S": 64}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_S": 32}, num_warps=8, num_stages=2),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_S": 64}, num_warps=8, num_stages=2),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_S": 64}, num_warps=4, num_stages=2),
    ]
)

_LOG2E = 1.4426950408889634

# Key correction: a non-salient row falls back to the plain ``P[:, A] @ dV`` update when the
# salient keys held more than this share of its old attention mass.
KEY_CORRECTION_MAX_OLD_MASS = 0.5
# Old scores are clamped at the row's max new score + this many base-2 units (``e_old <= 2**15``
# keeps ``e_new - e_old`` finite in fp16 for the dot), and a row with a clamped score falls back:
# its old mass is then over 0.5 anyway unless its sequence has more than 2**15 unchanged keys.
# (torch code: natural-log units, ``KEY_CORRECTION_MAX_GAP_LOG2 * math.log(2)``, read at call time)
KEY_CORRECTION_MAX_GAP_LOG2 = 15.0


@triton.jit
def _order_queries_kernel(mask_ptr, cu_q_ptr, order_ptr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    qs = tl.load(cu_q_ptr + b).to(tl.int64)
    qe = tl.load(cu_q_ptr + b + 1).to(tl.int64)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    n_sal = tl.zeros((), dtype=tl.int64)
    n_non = tl.zeros((), dtype=tl.int64)
    for start in range(qs, qe, BLOCK):
        rows = start + offs
        live = rows < qe
        sal = tl.load(mask_ptr + rows, mask=live, other=0) != 0
        fs = (live & sal).to(tl.int64)
        fn = (live & (~sal)).to(tl.int64)
        # salient rows fill the sequence's slots from the front, the others from the back
        tl.store(order_ptr + qs + n_sal + tl.cumsum(fs, axis=0) - 1, rows.to(tl.int32), mask=fs != 0)
        tl.store(order_ptr + qe - n_non - tl.cumsum(fn, axis=0), rows.to(tl.int32), mask=fn != 0)
        n_sal += tl.sum(fs, axis=0)
        n_non += tl.sum(fn, axis=0)


@triton.jit
def _softmax_pass(
    q,
    k_ptr,
    v_ptr,
    ks,
    ke,
    kv_head,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    qk_scale,
    HEAD_DIM,
    WITH_PV: tl.constexpr,
    DOT_PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Online max/sum over keys [ks, ke) (base-2 units); with WITH_PV also the unnormalised P @ V."""
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    dmask = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for start in range(ks, ke, BLOCK_N):
        cols = start + offs_n
        cmask = cols < ke
        kt = tl.load(
            k_ptr + cols[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None] * stride_kd,
            mask=dmask[:, None] & cmask[None, :],
            other=0.0,
        )
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale
        s = tl.where(cmask[None, :], s, float("-inf"))
        # every block of the loop holds at least one real key, so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if WITH_PV:
            v = tl.load(
                v_ptr + cols[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :] * stride_vd,
                mask=cmask[:, None] & dmask[None, :],
                other=0.0,
            )
            if UPCAST:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _lower_bound(index_ptr, n, key):
    """First position in the ascending index[0:n) whose value is >= key (n when none)."""
    lo = tl.zeros((), dtype=tl.int64)
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(index_ptr + mid).to(tl.int64) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


# shared memory of one thread block on Hopper (H100 / H200: 227 KiB of an SM's 228)
_SHARED_MEMORY_PER_BLOCK = 232_448


def _fits_shared_memory(configs, named_args, **kwargs):
    """An autotune prune keeping the configs whose pipelined key and value tiles (``num_stages``
    deep, ``BLOCK_N`` keys and ``BLOCK_S`` salient columns of ``BLOCK_D``) fit a Hopper block's
    shared memory in the call's dtype: ``python -m bench.compile_kernels`` found a float32 config
    over it (and float32's large tiles spilling hundreds of KB). Keeps the first config when none fits."""
    elem = named_args["q_ptr"].element_size()
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    kept = [c for c in configs if c.num_stages * 2 * elem * block_d * (c.kwargs["BLOCK_N"] + c.kwargs["BLOCK_S"])
            <= _SHARED_MEMORY_PER_BLOCK]
    return kept or configs[:1]


@triton.autotune(configs=_CONFIGS, key=["BLOCK_D", "DOT_PREC", "CORRECT_KEYS"], restore_value=["out_ptr"],
                 prune_configs_by={"early_config_prune": _fits_shared_memory})
@triton.jit(do_not_specialize=["kcount_val", "salient_k_capacity"])
def _partial_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cache_ptr,
    dv_ptr,
    kold_ptr,
    out_ptr,
    cu_q_ptr,
    cu_k_ptr,
    order_ptr,
    qmask_ptr,
    kidx_ptr,
    kcount_ptr,
    kcount_val,
    salient_k_capacity,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_ct,
    stride_ch,
    stride_cd,
    stride_dvt,
    stride_dvh,
    stride_dvd,
    stride_kot,
    stride_koh,
    stride_kod,
    stride_ot,
    stride_oh,
    stride_od,
    qk_scale,
    HEAD_DIM,
    GROUP: tl.constexpr,
    HAS_KCOUNT_PTR: tl.constexpr,
    CORRECT_KEYS: tl.constexpr,
    MAX_OLD_MASS: tl.constexpr,
    OLD_GAP_MAX: tl.constexpr,
    DOT_PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    pid_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2).to(tl.int64)
    qs = tl.load(cu_q_ptr + seq).to(tl.int64)
    qe = tl.load(cu_q_ptr + seq + 1).to(tl.int64)
    if pid_m * BLOCK_M < qe - qs:
        ks = tl.load(cu_k_ptr + seq).to(tl.int64)
        ke = tl.load(cu_k_ptr + seq + 1).to(tl.int64)
        kv_head = head // GROUP

        slots = qs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        rvalid = slots < qe
        rows = tl.load(order_ptr + slots, mask=rvalid, other=0).to(tl.int64)
        sal = (tl.load(qmask_ptr + rows, mask=rvalid, other=0) != 0) & rvalid
        non = (~sal) & rvalid
        n_sal = tl.sum(sal.to(tl.int32), axis=0)
        n_non = tl.sum(non.to(tl.int32), axis=0)

        offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
        dmask = offs_d < HEAD_DIM
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd,
            mask=rvalid[:, None] & dmask[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        if n_sal > 0:
            m_i, l_i, acc = _softmax_pass(
                q,
                k_ptr,
                v_ptr,
                ks,
                ke,
                kv_head,
                stride_kt,
                stride_kh,
                stride_kd,
                stride_vt,
                stride_vh,
                stride_vd,
                qk_scale,
                HEAD_DIM,
                True,
                DOT_PREC,
                UPCAST,
                BLOCK_M,
                BLOCK_N,
                BLOCK_D,
            )
        else:
            m_i, l_i, acc = _softmax_pass(
                q,
                k_ptr,
                v_ptr,
                ks,
                ke,
                kv_head,
                stride_kt,
                stride_kh,
                stride_kd,
                stride_vt,
                stride_vh,
                stride_vd,
                qk_scale,
                HEAD_DIM,
                False,
                DOT_PREC,
                UPCAST,
                BLOCK_M,
                BLOCK_N,
                BLOCK_D,
            )
        # a sequence without keys has l = 0: exact rows become 0, approximate rows keep the cache
        inv_l = tl.where(l_i > 0.0, 1.0 / tl.where(l_i > 0.0, l_i, 1.0), 0.0)
        result = acc * inv_l[:, None]

        if n_non > 0:
            if HAS_KCOUNT_PTR:
                n_k = tl.load(kcount_ptr).to(tl.int64)
            else:
                n_k = kcount_val.to(tl.int64)
            n_k = tl.minimum(tl.maximum(n_k, 0), salient_k_capacity)
            lo = _lower_bound(kidx_ptr, n_k, ks)
            hi = _lower_bound(kidx_ptr, n_k, ke)
            offs_s = tl.arange(0, BLOCK_S).to(tl.int64)
            upd = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
            if CORRECT_KEYS:
                # e_new @ V - e_old @ V_old = e_new @ dV + (e_new - e_old) @ V_old: the correction
                # is `upd` plus dp @ V_old with dp = e_new - e_old taken elementwise in fp32 before
                # the dot. dp is small when the keys moved little and its cast to the input dtype
                # keeps its relative precision; two separate products e_new @ V and e_old @ V_old
                # would each carry a rounding error of the size of e (P cast to bf16/fp16), left
                # whole in their nearly cancelling difference. And dp == 0 exactly when k_old == k,
                # which gives the plain update bit for bit.
                dpv = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
                sum_new = tl.zeros((BLOCK_M,), dtype=tl.float32)
                sum_old = tl.zeros((BLOCK_M,), dtype=tl.float32)
                gap_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
            for p0 in range(lo, hi, BLOCK_S):
                pos = p0 + offs_s
                pmask = pos < hi
                kid = tl.load(kidx_ptr + pos, mask=pmask, other=0).to(tl.int64)
                kt = tl.load(
                    k_ptr + kid[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None] * stride_kd,
                    mask=dmask[:, None] & pmask[None, :],
                    other=0.0,
                )
                if UPCAST:
                    kt = kt.to(tl.float32)
                s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale
                p = tl.where(pmask[None, :], tl.math.exp2(s - m_i[:, None]), 0.0)
                dv = tl.load(
                    dv_ptr + pos[:, None] * stride_dvt + kv_head * stride_dvh + offs_d[None, :] * stride_dvd,
                    mask=pmask[:, None] & dmask[None, :],
                    other=0.0,
                )
                if UPCAST:
                    dv = dv.to(tl.float32)
                upd += tl.dot(p.to(dv.dtype), dv, input_precision=DOT_PREC)
                if CORRECT_KEYS:
                    kot = tl.load(
                        kold_ptr + pos[None, :] * stride_kot + kv_head * stride_koh + offs_d[:, None] * stride_kod,
                        mask=dmask[:, None] & pmask[None, :],
                        other=0.0,
                    )
                    if UPCAST:
                        kot = kot.to(tl.float32)
                    gap = tl.dot(q, kot, input_precision=DOT_PREC) * qk_scale - m_i[:, None]
                    gap = tl.where(pmask[None, :], gap, float("-inf"))
                    gap_max = tl.maximum(gap_max, tl.max(gap, axis=1))
                    # clamped: no overflow (a row with a clamped score falls back below)
                    p_old = tl.math.exp2(tl.minimum(gap, OLD_GAP_MAX))
                    vn = tl.load(
                        v_ptr + kid[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :] * stride_vd,
                        mask=pmask[:, None] & dmask[None, :],
                        other=0.0,
                    )
                    v_old = (vn.to(tl.float32) - dv.to(tl.float32)).to(dv.dtype)
                    dp = p - p_old
                    sum_new += tl.sum(p, axis=1)
                    sum_old += tl.sum(p_old, axis=1)
                    dpv += tl.dot(dp.to(dv.dtype), v_old, input_precision=DOT_PREC)
            cache = tl.load(
                cache_ptr + rows[:, None] * stride_ct + head * stride_ch + offs_d[None, :] * stride_cd,
                mask=non[:, None] & dmask[None, :],
                other=0.0,
            ).to(tl.float32)
            paper = cache + upd * inv_l[:, None]
            if CORRECT_KEYS:
                # (l_old * cache + e_new @ V - e_old @ V_old) / l with l_old = l - sum_new + sum_old
                corrected = paper + (dpv - (sum_new - sum_old)[:, None] * cache) * inv_l[:, None]
                l_old = l_i - sum_new + sum_old
                # old mass on A = sum_old / l_old <= MAX_OLD_MASS; l_old <= 0 (no keys, rounding) falls back
                use = (l_old > 0.0) & (sum_old <= MAX_OLD_MASS * l_old) & (gap_max <= OLD_GAP_MAX)
                result = tl.where(sal[:, None], result, tl.where(use[:, None], corrected, paper))
            else:
                result = tl.where(sal[:, None], result, paper)

        tl.store(
            out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od,
            result.to(out_ptr.dtype.element_ty),
            mask=rvalid[:, None] & dmask[None, :],
        )


def _partial_attention_triton(
    q,
    k,
    v,
    ctx_cache,
    delta_v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    q_mask,
    k_index,
    k_count,
    scale,
    out,
    k_old=None,
) -> None:
    Tq, H, d = q.shape
    Hk = k.shape[1]
    B = cu_seqlens_q.shape[0] - 1
    if B == 0 or max_seqlen_q == 0 or Tq == 0:
        return
    order = torch.empty(Tq, dtype=torch.int32, device=q.device)
    mask_u8 = q_mask.view(torch.uint8)
    _order_queries_kernel[(B,)](mask_u8, cu_seqlens_q, order, BLOCK=16 if _dispatch.interpreting() else 1024)
    has_ptr = isinstance(k_count, torch.Tensor)
    # the interpreter computes bf16 dots wrongly (silently): there, run them in fp32
    upcast = _dispatch.interpreting() and q.dtype == torch.bfloat16
    grid = lambda meta: (triton.cdiv(max_seqlen_q, meta["BLOCK_M"]), B, H)
    _partial_attention_kernel[grid](
        q,
        k,
        v,
        ctx_cache,
        delta_v,
        delta_v if k_old is None else k_old,  # dummy pointer without the key correction
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        order,
        mask_u8,
        k_index,
        k_count if has_ptr else k_index,  # dummy pointer when the count is a Python int
        0 if has_ptr else int(k_count),
        k_index.shape[0],
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *ctx_cache.stride(),
        *delta_v.stride(),
        *((0, 0, 0) if k_old is None else k_old.stride()),
        *out.stride(),
        scale * _LOG2E,
        d,
        GROUP=H // Hk,
        HAS_KCOUNT_PTR=has_ptr,
        CORRECT_KEYS=k_old is not None,
        MAX_OLD_MASS=KEY_CORRECTION_MAX_OLD_MASS,
        OLD_GAP_MAX=KEY_CORRECTION_MAX_GAP_LOG2,
        # fp32 dots must not silently drop to tf32 on tensor cores
        DOT_PREC="ieee" if q.dtype == torch.float32 or upcast else "tf32",
        UPCAST=upcast,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
    )


def partial_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx_cache: torch.Tensor,
    delta_v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    salient_q_mask: torch.Tensor,
    salient_k_index: torch.Tensor,
    salient_k_count: int | torch.Tensor,
    *,
    softmax_scale: float | None = None,
    k_old: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference of :func:`partial_attention`: every sequence at once, padded.

    Sequence ``b``'s queries and keys are laid out ``[B, H, max_seqlen_q, d]`` and
    ``[B, H, max_seqlen_k, d]`` (padding keys masked out of the softmax). One fused attention
    pass (:func:`_attention_and_lse`; on the CPU torch's flash kernel, which never materialises
    the scores) gives the exact rows and every row's log-sum-exp ``lse``; a non-salient row then
    takes ``P[:, A] = exp(q k_A^T * scale - lse)`` at its sequence's salient keys only, gathered
    into ``[B, max |A_b|]`` slots (empty slots hold 0): the ``P @ V`` work the algorithm saves.
    Computes in fp32 (fp64 when the inputs are fp64, which tests use as the exact answer) and
    returns ``q``'s dtype. Reads the count and each sequence's number of salient keys on the host
    (a sync on CUDA). With ``k_old``, the key correction uses the kernel's clamp and fallback
    rule on the old scores, shifted by each row's max new score (the scores are materialised
    for that max: the correction is opt-in); the new and old salient scores come from matmuls
    of the same shape, so ``k_old == k`` gives the plain update bit for bit.
    Raises ``ValueError`` when a sequence is longer than its ``max_seqlen``.
    """
    Tq, H, d = q.shape
    Hk = k.shape[1]
    group = H // Hk
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    if out is None:
        out = torch.zeros_like(q)
    batch = cu_seqlens_q.shape[0] - 1
    if batch <= 0 or Tq == 0:
        return out
    dev = q.device
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    len_q, len_k = cu_q.diff(), cu_k.diff()
    longest_q, longest_k = int(len_q.max()), int(len_k.max())
    if longest_q > max_seqlen_q or longest_k > max_seqlen_k:
        raise ValueError(
            f"a sequence is longer ({longest_q} queries, {longest_k} keys) than max_seqlen_q = {max_seqlen_q} "
            f"/ max_seqlen_k = {max_seqlen_k}"
        )
    mq, mk = max_seqlen_q, (max_seqlen_k if k.shape[0] else 0)
    # padded maps: slot i of sequence b is packed row cu[b] + i (row 0, masked, past its length)
    q_valid = torch.arange(mq, device=dev)[None] < len_q[:, None]  # [B, mq]
    k_valid = torch.arange(mk, device=dev)[None] < len_k[:, None]  # [B, mk]
    q_rows = torch.where(q_valid, cu_q[:-1, None] + torch.arange(mq, device=dev)[None], 0)
    k_rows = torch.where(k_valid, cu_k[:-1, None] + torch.arange(mk, device=dev)[None], 0)

    def heads(t: torch.Tensor) -> torch.Tensor:  # [B, L, Hk, d] -> [B, H, L, d] in cdt
        t = t.to(cdt).transpose(1, 2)
        return t.repeat_interleave(group, dim=1) if group > 1 else t

    qp = q[q_rows].to(cdt).transpose(1, 2)  # [B, H, mq, d]
    kp, vp = heads(k[k_rows]), heads(v[k_rows])  # [B, H, mk, d]
    no_keys = (len_k == 0)[:, None, None, None]
    exact, lse = _attention_and_lse(qp, kp, vp, k_valid, no_keys, scale)
    sal = salient_q_mask[q_rows] & q_valid
    if bool((sal | ~q_valid).all()):  # every row exact: no update to compute
        result = exact
    else:
        cache = ctx_cache[q_rows].to(cdt).transpose(1, 2)
        approx = _non_salient_rows(
            qp, kp, k_valid, lse, cache, k, v, delta_v, k_old, cu_k, salient_k_index, salient_k_count,
            scale=scale, heads=heads, no_keys=no_keys,
        )  # fmt: skip
        result = torch.where(sal[:, None, :, None], exact, approx) if bool(sal.any()) else approx
    out[q_rows[q_valid]] = result.transpose(1, 2)[q_valid].to(out.dtype)
    return out


def _attention_and_lse(
    qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, k_valid: torch.Tensor, no_keys: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention ``[B, H, mq, d]`` of the padded layout and each row's log-sum-exp of its
    scaled scores ``[B, H, mq, 1]`` over its sequence's keys (``k_valid`` ``[B, mk]``). A sequence
    without keys gets 0 for both (its exact rows are 0; its rows take no salient column). On the
    CPU torch's flash kernel computes both in one pass (the scores never materialised); elsewhere
    the scores are (the reference's only use on a GPU is a test or the router's eager fallback)."""
    batch, n_heads, mq, d = qp.shape
    mk = kp.shape[2]
    if mk == 0:
        return qp.new_zeros(qp.shape), qp.new_zeros(batch, n_heads, mq, 1)
    padded = not bool(k_valid.all())
    if qp.device.type == "cpu":
        bias = None
        if padded:  # an additive mask of the inputs' dtype (the kernel refuses a bool one)
            bias = qp.new_zeros(batch, 1, 1, mk).masked_fill_(~k_valid[:, None, None, :], float("-inf"))
        exact, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qp, kp, vp, 0.0, False, attn_mask=bias, scale=scale)
        lse = lse.unsqueeze(-1)
    else:
        scores = (qp @ kp.transpose(-1, -2)) * scale
        if padded:
            scores = scores.masked_fill(~k_valid[:, None, None, :], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        exact = torch.softmax(scores, dim=-1) @ vp
    if bool(no_keys.any()):  # the softmax over no key is NaN
        exact = exact.masked_fill(no_keys, 0.0)
        lse = lse.masked_fill(no_keys, 0.0)
    return exact, lse


def _non_salient_rows(
    qp, kp, k_valid, lse, cache, k, v, delta_v, k_old, cu_k, salient_k_index, salient_k_count, *, scale, heads,
    no_keys,
) -> torch.Tensor:
    """The reference's rows outside the salient set, ``[B, H, mq, d]``: the cache plus ``P`` at each
    sequence's salient columns times ``dV`` (gathered into ``[B, max |A_b|]`` slots, 0 in empty
    ones; ``P = exp(s - lse)``, ``lse`` ``[B, H, mq, 1]`` each row's log-sum-exp), key-corrected
    with ``k_old``. ``heads`` lays ``[B, L, Hk, d]`` out as ``[B, H, L, d]``; ``kp`` / ``k_valid``
    (the padded keys and their mask) are read only for the key correction's row max."""
    batch, n_heads, mq, _ = qp.shape
    dev, cdt = qp.device, qp.dtype
    cap = salient_k_index.shape[0]
    n = int(salient_k_count.reshape(()).item()) if isinstance(salient_k_count, torch.Tensor) else int(salient_k_count)
    kidx = salient_k_index[: min(max(n, 0), cap)].to(torch.int64)
    req = torch.searchsorted(cu_k[1:], kidx, right=True)  # ascending key rows -> their sequence
    live = torch.nonzero(req < batch).flatten()  # salient keys past the last sequence touch no row
    kidx, req = kidx[live], req[live]
    counts = torch.bincount(req, minlength=batch)
    slot = torch.arange(live.numel(), device=dev) - (counts.cumsum(0) - counts)[req]
    max_a = int(counts.max()) if live.numel() else 0
    if not max_a:  # no salient key in any sequence: every row keeps its cache
        return cache
    a_mask = torch.zeros(batch, max_a, dtype=torch.bool, device=dev)
    a_mask[req, slot] = True
    empty_slots = ~a_mask[:, None, None, :]

    def per_sequence(rows: torch.Tensor) -> torch.Tensor:  # [|A|, Hk, d] -> [B, H, max_a, d]
        slots = rows.new_zeros((batch, max_a, *rows.shape[1:]), dtype=cdt)
        slots[req, slot] = rows.to(cdt)
        return heads(slots)

    # the P @ V work the algorithm saves: only A's columns of P
    dv_a = per_sequence(delta_v[live])
    s_new_a = (qp @ per_sequence(k[kidx]).transpose(-1, -2)) * scale  # [B, H, mq, max_a]
    p_a = torch.exp(s_new_a - lse).masked_fill(empty_slots, 0.0)
    approx = cache + p_a @ dv_a
    if k_old is None:
        return approx
    scores = (qp @ kp.transpose(-1, -2)) * scale
    m = scores.masked_fill(~k_valid[:, None, None, :], float("-inf")).amax(dim=-1, keepdim=True)
    m = m.masked_fill(no_keys, 0.0)  # -inf without keys (and no salient key)
    inv_l = torch.exp(m - lse)  # one over the row's sum of exp(s - m)
    # new and old salient scores from matmuls of the same shape (equal keys give equal bits)
    p_new_a = (torch.exp(s_new_a - m) * inv_l).masked_fill(empty_slots, 0.0)
    gap = ((qp @ per_sequence(k_old[live]).transpose(-1, -2)) * scale - m).masked_fill(empty_slots, float("-inf"))
    return _key_corrected_update(approx, cache, p_new_a, gap, inv_l, per_sequence(v[kidx]) - dv_a)


def _key_corrected_update(
    paper: torch.Tensor,
    cache: torch.Tensor,
    p_new_a: torch.Tensor,
    gap: torch.Tensor,
    inv_l: torch.Tensor,
    v_old_a: torch.Tensor,
) -> torch.Tensor:
    """The key correction of non-salient rows in torch (the reference's).

    Any leading dims ``[...]`` (sequences and heads), ``n`` rows, ``a`` salient keys:
    paper ``[..., n, d]`` the plain update ``cache + P[:, A] @ dV``; cache ``[..., n, d]``;
    p_new_a ``[..., n, a]`` the new softmax at the salient columns (0 at padding slots); gap
    ``[..., n, a]`` each old score minus the row's max new score (-inf at padding slots); inv_l
    ``[..., n, 1]`` one over the row's ``sum exp(s - max)`` over all new keys; v_old_a
    ``[..., a, d]`` the salient keys' old values. Returns ``paper + (P_new - P_old)[:, A] @ V_old
    - (sum P_new[:, A] - sum P_old[:, A]) * cache`` (the formula of :func:`partial_attention`
    divided by ``l``), or ``paper`` where the kernel falls back: ``l_old <= 0``, old mass on
    ``A`` over :data:`KEY_CORRECTION_MAX_OLD_MASS`, or a clamped old score. With ``a = 0`` it
    returns ``paper``.
    """
    max_exponent = KEY_CORRECTION_MAX_GAP_LOG2 * math.log(2)  # the kernel's clamp, in natural units
    p_old_a = torch.exp(gap.clamp(max=max_exponent)) * inv_l
    sum_new = p_new_a.sum(dim=-1, keepdim=True)
    sum_old = p_old_a.sum(dim=-1, keepdim=True)
    corrected = paper + (p_new_a - p_old_a) @ v_old_a - (sum_new - sum_old) * cache
    l_ratio = 1.0 - sum_new + sum_old  # l_old / l
    use = (l_ratio > 0) & (sum_old <= KEY_CORRECTION_MAX_OLD_MASS * l_ratio)
    if gap.shape[-1]:
        use &= gap.amax(dim=-1, keepdim=True) <= max_exponent
    return torch.where(use, corrected, paper)


_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _partial_attention_impl(
    q, k, v, ctx_cache, delta_v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, salient_q_mask,
    salient_k_index, salient_k_count, salient_k_count_int, softmax_scale, k_old, out,
) -> None:  # fmt: skip
    count = salient_k_count if salient_k_count is not None else salient_k_count_int
    if not _dispatch.use_triton(q):
        partial_attention_reference(
            q, k, v, ctx_cache, delta_v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, salient_q_mask,
            salient_k_index, count, softmax_scale=softmax_scale, k_old=k_old, out=out,
        )  # fmt: skip
        return
    _partial_attention_triton(
        q, k, v, ctx_cache, delta_v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, salient_q_mask, salient_k_index,
        count, softmax_scale, out, k_old,
    )  # fmt: skip


# the registered op (seer_kernels._dispatch): validated arguments, the output allocated by the caller
# (it may be ctx_cache itself: each element is read before it is written)
_partial_attention_op = _dispatch.define_op(
    "partial_attention(Tensor q, Tensor k, Tensor v, Tensor ctx_cache, Tensor delta_v, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, Tensor salient_q_mask, Tensor salient_k_index, "
    "Tensor? salient_k_count, int salient_k_count_int, float softmax_scale, Tensor? k_old, Tensor(a!) out) -> ()",
    _partial_attention_impl,
    lambda *args: None,
)


def _check_cu(name: str, cu: object, total: int, max_len: int, batch: int | None) -> torch.Tensor:
    _dispatch.check_tensor(name, cu, dtypes=(torch.int32,), dim=1)
    if cu.shape[0] < 1 or (batch is not None and cu.shape[0] != batch + 1):
        want = "at least one entry" if batch is None else f"{batch + 1} entries"
        raise ValueError(f"{name} must have {want} (B + 1), got shape {tuple(cu.shape)}")
    if not cu.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if _dispatch.host_path(cu) and cu.numel():  # free on CPU; on CUDA it would need a host sync
        lens = cu[1:] - cu[:-1]
        if int(cu[0]) < 0 or int(cu[-1]) > total or (lens.numel() and int(lens.min()) < 0):
            raise ValueError(f"{name} must be non-decreasing within [0, {total}], got {cu.tolist()}")
        if lens.numel() and int(lens.max()) > max_len:
            raise ValueError(
                f"a sequence in {name} is longer ({int(lens.max())}) than its max_seqlen ({max_len})"
            )
    return cu


def _check_arguments(q, k, v, ctx_cache, delta_v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     salient_q_mask, salient_k_index, salient_k_count, softmax_scale, k_old, out) -> None:
    """:func:`partial_attention`'s argument checks, each error naming its argument; index values
    are read on the host path only (``_dispatch.host_path``)."""
    _dispatch.check_tensor("q", q, dtypes=_DTYPES, dim=3)
    _dispatch.check_tensor("k", k, dtypes=(q.dtype,), dim=3)
    _dispatch.check_tensor("v", v, dtypes=(q.dtype,), dim=3)
    _dispatch.check_tensor("ctx_cache", ctx_cache, dtypes=(q.dtype,), dim=3)
    _dispatch.check_tensor("delta_v", delta_v, dtypes=(q.dtype,), dim=3)
    Tq, H, d = q.shape
    Tk, Hk, dk = k.shape
    if dk != d:
        raise ValueError(f"k must have head dim {d} like q, got shape {tuple(k.shape)}")
    if Hk == 0 or H % Hk != 0:
        raise ValueError(f"q heads ({H}) must be a multiple of k heads ({Hk})")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if tuple(ctx_cache.shape) != tuple(q.shape):
        raise ValueError(f"ctx_cache must have the shape of q {tuple(q.shape)}, got {tuple(ctx_cache.shape)}")
    _dispatch.check_tensor("salient_k_index", salient_k_index, dtypes=(torch.int32,), dim=1)
    if not salient_k_index.is_contiguous():
        raise ValueError("salient_k_index must be contiguous")
    cap = salient_k_index.shape[0]
    if tuple(delta_v.shape) != (cap, Hk, d):
        raise ValueError(
            f"delta_v must have shape {(cap, Hk, d)} (salient_k_index capacity), got {tuple(delta_v.shape)}"
        )
    for name, val in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"{name} must be an int, got {type(val).__name__}")
        if val < 0:
            raise ValueError(f"{name} must be >= 0, got {val}")
    _check_cu("cu_seqlens_q", cu_seqlens_q, Tq, max_seqlen_q, None)
    _check_cu("cu_seqlens_k", cu_seqlens_k, Tk, max_seqlen_k, cu_seqlens_q.shape[0] - 1)
    _dispatch.check_tensor("salient_q_mask", salient_q_mask, dtypes=(torch.bool,), dim=1)
    if salient_q_mask.shape[0] != Tq or not salient_q_mask.is_contiguous():
        raise ValueError(
            f"salient_q_mask must be a contiguous bool [{Tq}], got shape {tuple(salient_q_mask.shape)}"
        )
    _dispatch.check_count("salient_k_count", salient_k_count, cap, "salient_k_index's capacity", dtypes=(torch.int32,))
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if k_old is not None:
        _dispatch.check_tensor("k_old", k_old, dtypes=(q.dtype,), dim=3)
        if tuple(k_old.shape) != (cap, Hk, d):
            raise ValueError(f"k_old must have shape {(cap, Hk, d)} like delta_v, got {tuple(k_old.shape)}")
    if out is not None:
        _dispatch.check_tensor("out", out, dtypes=(q.dtype,), dim=3)
        if tuple(out.shape) != tuple(q.shape):
            raise ValueError(f"out must have the shape of q {tuple(q.shape)}, got {tuple(out.shape)}")
    _dispatch.check_same_device(
        q=q,
        k=k,
        v=v,
        ctx_cache=ctx_cache,
        delta_v=delta_v,
        k_old=k_old,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        salient_q_mask=salient_q_mask,
        salient_k_index=salient_k_index,
        salient_k_count=salient_k_count if isinstance(salient_k_count, torch.Tensor) else None,
        out=out,
    )
    if _dispatch.host_path(salient_k_index):  # free on CPU; on CUDA it would need a host sync
        n = salient_k_count if isinstance(salient_k_count, int) else int(salient_k_count.reshape(()))
        live = salient_k_index[: min(max(n, 0), cap)]
        if live.numel() and (
            int(live.min()) < 0 or int(live.max()) >= Tk or bool((live[1:] <= live[:-1]).any())
        ):
            raise ValueError(
                f"salient_k_index[:count] must be strictly ascending key rows in [0, {Tk}), "
                f"got {live.tolist()}"
            )


def partial_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx_cache: torch.Tensor,
    delta_v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    salient_q_mask: torch.Tensor,
    salient_k_index: torch.Tensor,
    salient_k_count: int | torch.Tensor,
    *,
    softmax_scale: float | None = None,
    k_old: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """DyLLM attention context for a packed varlen batch (bidirectional, GQA, prefix keys).

    Args:
        q: ``[Tq, H, d]`` fp16/bf16/fp32 queries (post-RoPE), sequences back to back.
        k, v: ``[Tk, Hk, d]``, ``H % Hk == 0``; query head ``h`` reads kv head
            ``h // (H // Hk)``. ``v`` already holds the new values at the salient key rows.
            A sequence's keys may outnumber its queries (a cached prompt prefix).
        ctx_cache: ``[Tq, H, d]`` the previous step's context of these query rows.
        delta_v: ``[cap, Hk, d]``, row ``p`` is ``V_new - V_old`` at key row
            ``salient_k_index[p]``.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]`` exclusive prefix sums (flash-attention
            convention).
        max_seqlen_q, max_seqlen_k: ints, at least every sequence's query / key length (rows
            past ``max_seqlen_q`` would not be computed; checked on the host path, not on CUDA).
        salient_q_mask: bool ``[Tq]``; True rows get exact attention.
        salient_k_index: int32 ``[cap]``: slots ``[0, count)`` hold the packed key rows whose
            K/V were recomputed this layer, **strictly ascending** (the kernel binary-searches
            each sequence's range; checked on the host path only, ``_dispatch.host_path``). Slots
            past the count are never read.
            Salient keys outside a query's own sequence do not affect it.
        salient_k_count: int32 ``[1]`` device tensor (or a Python int) with the live slots;
            device values outside ``[0, cap]`` act as the nearest end.
        softmax_scale: default ``1 / sqrt(d)``.
        k_old: optional ``[cap, Hk, d]`` of ``q``'s dtype, row ``p`` the key at key row
            ``salient_k_index[p]`` before this step's update (``k`` holds the new key there, the
            old value is ``v - delta_v``); turns on the key correction of the non-salient rows
            (see Returns). Slots past the count are never read.
        out: optional ``[Tq, H, d]`` buffer of ``q``'s dtype. It may be ``ctx_cache`` itself:
            each element is read before it is written by the same program.
        check: validate the arguments (default). False skips every check, for a caller that
            builds them itself and calls in a hot loop (DyLLM's sparse layers): wrong arguments
            are then undefined behaviour.

    Returns:
        ``ctx`` ``[Tq, H, d]``: salient rows ``softmax(q K_seq^T * scale) V_seq``; other rows
        ``ctx_cache + sum_{j in A, j in seq} P_ij * delta_v_j`` with ``P`` the exact softmax over
        all keys of the sequence. The identity is exact when only ``V`` changed since
        ``ctx_cache`` was computed.

        With ``k_old``, a non-salient row ``i`` instead gets, with ``e_j = exp(s_ij - m)`` for
        the new scores (any shift ``m``), ``l = sum_j e_j`` over all keys of the sequence, and
        for ``j in A`` ``e_old_j = exp(q_i . k_old_j * scale - m)``, ``V_old_j = v_j - delta_v_j``,
        ``l_old = l - sum_A e_j + sum_A e_old_j``::

            (l_old * ctx_cache_i + sum_A e_j v_j - sum_A e_old_j V_old_j) / l

        i.e. the cache ``P_old V_old`` split into its unchanged-key part and its part on ``A``,
        that part swapped for the new one, and the row renormalised: exact when ``q_i`` and the
        non-salient keys are unchanged since ``ctx_cache`` was computed, and the plain update
        above when ``k_old == k``. A row whose old mass on ``A`` (``sum_A e_old / l_old``)
        exceeds :data:`KEY_CORRECTION_MAX_OLD_MASS` keeps the plain update (recovering the
        unchanged part would subtract nearly equal numbers), as does a row whose old score
        exceeds its max new score by more than ``15 ln 2`` (clamped against overflow; its old
        mass is over the limit anyway unless the sequence has more than ``2**15`` keys).
        Salient rows are unaffected.

        Edges: a sequence with no keys gives 0 for salient rows and ``ctx_cache`` for the
        others; no salient rows and no salient keys returns ``ctx_cache`` (also with
        ``k_old``); query rows outside every sequence (``>= cu_seqlens_q[-1]``) are left as
        they are in ``out`` (zero when ``out`` is None).

    Numerics: scores, softmax statistics and accumulators in fp32; the ``P @ V``, ``P @ dV``
    and (with ``k_old``) ``(e - e_old) @ V_old`` dots take both operands in the input dtype
    (flash-attention's habit), ``V_old = v - delta_v`` rounded to it too; fp32 inputs use
    IEEE fp32 dots (never tf32). Under the Triton interpreter bf16 dots run in fp32 (its bf16
    arithmetic is wrong). Graph-capturable on CUDA (no host sync); the first CUDA call per
    head dim and dtype autotunes the tile sizes, so warm up before a capture.
    """
    if check:
        _check_arguments(q, k, v, ctx_cache, delta_v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         salient_q_mask, salient_k_index, salient_k_count, softmax_scale, k_old, out)
    d = q.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    if out is None:
        out = torch.zeros_like(q)
    count_tensor, count_int = _dispatch.split_count(salient_k_count)
    _partial_attention_op(
        q, k, v, ctx_cache, delta_v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, salient_q_mask,
        salient_k_index, count_tensor, count_int, scale, k_old, out,
    )  # fmt: skip
    return out
