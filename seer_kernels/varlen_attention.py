"""Varlen (packed) attention forward in flash-attention 2's convention.

After Seer's step-0 cut every request keeps a different number of response positions, and a
batch is packed back to back: ``q`` is ``[total_q, H, d]`` and sequence ``b`` owns rows
``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``. Keys and values are packed the same way with their own
``cu_seqlens_k``; a key sequence may be longer than its query sequence (a cached prefix).

Kernel: one program per (block of ``BLOCK_M`` queries, sequence, query head), flash-style online
softmax in fp32 with ``tl.dot`` for ``QK^T`` and ``PV``. The key loop runs in two phases: key
blocks that need no mask at all (inside the sequence and, when causal, below the diagonal for
every query of the block) and then the masked tail, so the common case pays for no ``where``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _dispatch

_LOG2E = math.log2(math.e)
_MAX_HEAD_DIM = 256
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _attn_key_blocks(
    acc,
    l_i,
    m_i,
    q,
    k_head,
    v_head,
    stride_kt,
    stride_vt,
    offs_m,
    offs_d,
    lo,
    hi,
    len_k,
    diag,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Fold key blocks ``[lo, hi)`` into the running (acc, row sum, row max); MASKED adds the masks."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            kv_mask = (cols < len_k)[:, None] & d_ok[None, :]
        else:
            kv_mask = (cols >= 0)[:, None] & d_ok[None, :]
        rows64 = cols.to(tl.int64)
        k = tl.load(k_head + rows64[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        if MASKED:
            visible = cols[None, :] < len_k
            if CAUSAL:
                # bottom-right alignment: query i sees key j iff j <= i + len_k - len_q
                visible = visible & (cols[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # a row that has seen no visible key yet keeps max -inf; shift by 0 so exp2 never sees -inf - -inf
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(qk - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + rows64[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _varlen_attention_fwd_kernel(
    Q,
    K,
    V,
    O,
    cu_seqlens_q,
    cu_seqlens_k,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    qk_scale,
    KV_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)

    q_start = tl.load(cu_seqlens_q + seq)
    len_q = tl.load(cu_seqlens_q + seq + 1) - q_start
    m_start = pid_m * BLOCK_M
    if m_start >= len_q:
        # max_seqlen_q is an upper bound: spare programs have nothing to do
        return
    k_start = tl.load(cu_seqlens_k + seq)
    len_k = tl.load(cu_seqlens_k + seq + 1) - k_start
    diag = len_k - len_q

    kv_head = head // KV_GROUP
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < len_q
    d_ok = offs_d < HEAD_DIM

    q_rows = q_start.to(tl.int64) + offs_m.to(tl.int64)
    q_ptrs = Q + q_rows[:, None] * stride_qt + head.to(tl.int64) * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    k_head = K + k_start.to(tl.int64) * stride_kt + kv_head.to(tl.int64) * stride_kh
    v_head = V + k_start.to(tl.int64) * stride_vt + kv_head.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # phase 1: whole key blocks every query of this block sees without any mask
    n_full = (len_k // BLOCK_N) * BLOCK_N
    hi = len_k
    if CAUSAL:
        # the first query of the block sees keys j <= m_start + diag
        first_visible_end = tl.maximum(m_start + diag + 1, 0)
        n_full = tl.minimum(n_full, (first_visible_end // BLOCK_N) * BLOCK_N)
        # the last query of the block sees keys j < m_start + BLOCK_M + diag
        hi = tl.minimum(len_k, m_start + BLOCK_M + diag)
    acc, l_i, m_i = _attn_key_blocks(
        acc,
        l_i,
        m_i,
        q,
        k_head,
        v_head,
        stride_kt,
        stride_vt,
        offs_m,
        offs_d,
        0,
        n_full,
        len_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        False,
        CAUSAL,
        INPUT_PRECISION,
        DOT_FP32,
    )
    # phase 2: the ragged tail and, when causal, the blocks that straddle the diagonal
    acc, l_i, m_i = _attn_key_blocks(
        acc,
        l_i,
        m_i,
        q,
        k_head,
        v_head,
        stride_kt,
        stride_vt,
        offs_m,
        offs_d,
        n_full,
        hi,
        len_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        True,
        CAUSAL,
        INPUT_PRECISION,
        DOT_FP32,
    )

    # rows with no visible key (no keys at all, or causal with len_q > len_k) output zeros
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = O + q_rows[:, None] * stride_ot + head.to(tl.int64) * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _block_config(block_d: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages), fixed per (head block, dtype).

    A fixed table rather than ``triton.autotune``: autotuning benchmarks on first use, which
    cannot happen inside a CUDA-graph capture and makes the first call of every new key slow.
    """
    if _dispatch.interpreting():
        return 16, 16, 4, 1
    if dtype == torch.float32:  # ieee fp32 dots run on FMA units: keep the tiles small
        if block_d <= 64:
            return 64, 32, 4, 2
        if block_d <= 128:
            return 32, 32, 4, 2
        return 16, 32, 4, 1
    if block_d <= 64:
        return 128, 64, 4, 3
    if block_d <= 128:
        return 128, 64, 8, 2
    return 64, 32, 8, 2


def _varlen_attention_triton(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    softmax_scale,
    causal,
    out,
    block_m: int | None = None,
    block_n: int | None = None,
):
    """Launch the kernel (inputs already validated). ``block_m``/``block_n`` override the table (tests)."""
    total_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    if out is None:
        # rows beyond cu_seqlens_q[-1] are never written: a fresh output reads 0 there
        out = torch.zeros_like(q)
    if batch == 0 or max_seqlen_q == 0 or total_q == 0:
        return out
    block_d = max(16, triton.next_power_of_2(head_dim))
    cfg_m, cfg_n, num_warps, num_stages = _block_config(block_d, q.dtype)
    block_m = block_m or cfg_m
    block_n = block_n or cfg_n
    grid = (triton.cdiv(max_seqlen_q, block_m), batch, num_heads)
    # bf16 arithmetic is silently wrong in the interpreter: there the dots run on fp32 copies
    dot_fp32 = _dispatch.interpreting() and q.dtype == torch.bfloat16
    _varlen_attention_fwd_kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        softmax_scale * _LOG2E,
        KV_GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        CAUSAL=bool(causal),
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 or dot_fp32 else "tf32",
        DOT_FP32=dot_fp32,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    out: torch.Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Torch reference: ``scaled_dot_product_attention`` per sequence, GQA by ``repeat_interleave``.

    Same contract as :func:`varlen_attention`. Computes in ``compute_dtype`` (default fp32, or
    fp64 when ``q`` is fp64) and casts to ``q``'s dtype (``out``'s when given). Tests pass
    ``compute_dtype=q.dtype`` to get torch's own error in a low precision. Reads ``cu_seqlens`` on
    the host (a sync on CUDA): this is the spec and the CPU fallback, not a fast path.
    ``max_seqlen_*`` are not needed here and are ignored.
    """
    if compute_dtype is None:
        compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k.shape[1]
    scale = head_dim**-0.5 if softmax_scale is None else float(softmax_scale)
    result = torch.zeros_like(q) if out is None else out
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        len_q, len_k = q1 - q0, k1 - k0
        if len_q == 0:
            continue
        if len_k == 0:
            result[q0:q1] = 0
            continue
        qs = q[q0:q1].to(compute_dtype).transpose(0, 1)  # [H, Lq, d]
        ks = k[k0:k1].to(compute_dtype).transpose(0, 1).repeat_interleave(group, dim=0)
        vs = v[k0:k1].to(compute_dtype).transpose(0, 1).repeat_interleave(group, dim=0)
        mask = None
        if causal:
            i = torch.arange(len_q, device=q.device)[:, None]
            j = torch.arange(len_k, device=q.device)[None, :]
            mask = j <= i + (len_k - len_q)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
        if mask is not None:
            # flash-attention's convention: a query that sees no key outputs zeros
            o = torch.where(
                mask.any(dim=-1)[None, :, None], o, torch.zeros((), dtype=o.dtype, device=o.device)
            )
        result[q0:q1] = o.transpose(0, 1).to(result.dtype)
    return result


def _varlen_attention_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, out):
    if _dispatch.use_triton(q):
        _varlen_attention_triton(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=scale, causal=causal, out=out
        )
    else:
        varlen_attention_reference(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=scale, causal=causal, out=out
        )


# the registered op (seer_kernels._dispatch): validated arguments, the output allocated by the caller
_varlen_attention_op = _dispatch.define_op(
    "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, bool causal, Tensor(a!) out) -> ()",
    _varlen_attention_impl,
    lambda *args: None,
)


def _check_cu_seqlens_on_host(
    name: str, cu: torch.Tensor, total: int, max_seqlen: int, max_name: str
) -> None:
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    lengths = [b - a for a, b in zip(values[:-1], values[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError(f"{name} must be non-decreasing (an exclusive prefix sum of lengths), got {values}")
    if values[-1] > total:
        raise ValueError(f"{name}[-1] = {values[-1]} exceeds the {total} packed rows")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(
            f"{max_name} = {max_seqlen} is below the longest sequence ({max(lengths)}); "
            "it must be an upper bound"
        )


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over packed variable-length sequences (flash-attention 2 varlen convention).

    Args:
        q: ``[total_q, H, d]``, fp16/bf16/fp32 (fp32/fp16 under the Triton interpreter: bf16 is
            silently wrong there). Sequences packed back to back along dim 0. Last dim contiguous.
        k, v: ``[total_k, Hk, d]``, same dtype and device as ``q``. ``H % Hk == 0``: query head
            ``h`` reads KV head ``h // (H // Hk)`` (GQA / MQA).
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]`` on ``q``'s device, exclusive prefix sums of
            the per-sequence lengths (``cu[0] = 0``). Sequence ``b``'s queries attend to all keys
            ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` (which may be longer: a cached prefix).
        max_seqlen_q, max_seqlen_k: host ints, upper bounds of the lengths; they size the launch
            grid (``cdiv(max_seqlen_q, BLOCK_M) x B x H``), so overestimating is safe (spare
            programs exit at once) and underestimating leaves queries uncomputed.
            ``max_seqlen_k`` is accepted for the convention and not needed by the kernel.
        softmax_scale: default ``d ** -0.5``.
        causal: ``False`` (default) is bidirectional attention within each sequence. ``True``
            aligns the mask bottom-right like flash-attention: query ``i`` sees keys
            ``j <= i + len_k - len_q``; a query that sees no key outputs zeros.
        out: optional preallocated ``[total_q, H, d]`` output, dtype of ``q``, last dim contiguous.

    Returns:
        ``[total_q, H, d]`` in ``q``'s dtype (``out`` itself when given), accumulated in fp32.

    Edge cases: ``d`` any value in 1..256 (non powers of two are masked); ``B = 0`` is a no-op; a
    sequence with zero queries writes nothing; a sequence with zero keys yields zeros. Rows of
    ``q`` beyond ``cu_seqlens_q[-1]`` (padding of a fixed-capacity buffer) are never written: a
    freshly allocated output holds zeros there, a given ``out`` keeps what it held.

    ``cu_seqlens`` and the ``max_seqlen`` bounds are checked on the host path (CPU tensors in eager
    mode, ``_dispatch.host_path``); on CUDA they are not checked (that would need a host sync), as
    in flash-attention.
    Forward only; no autograd.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _dispatch.check_tensor(name, t, dtypes=_DTYPES, dim=3)
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim, got strides {tuple(t.stride())}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k and v must have q's dtype {q.dtype}, got k {k.dtype}, v {v.dtype}")
    total_q, num_heads, head_dim = q.shape
    if not 1 <= head_dim <= _MAX_HEAD_DIM:
        raise ValueError(f"q's head dim must be in 1..{_MAX_HEAD_DIM}, got {head_dim}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[2] != head_dim:
        raise ValueError(f"k's head dim {k.shape[2]} differs from q's {head_dim}")
    num_kv_heads = k.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"q's head count ({num_heads}) must be a multiple of k's ({num_kv_heads})")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _dispatch.check_tensor(name, cu, dtypes=(torch.int32,), dim=1)
        if cu.numel() < 1:
            raise ValueError(f"{name} must hold B + 1 >= 1 offsets, got an empty tensor")
        if not cu.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q ({cu_seqlens_q.numel()}) and cu_seqlens_k ({cu_seqlens_k.numel()}) "
            "must describe the same number of sequences"
        )
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"{name} must be a host int (an upper bound of the lengths), got {type(value).__name__}"
            )
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if out is not None:
        _dispatch.check_tensor("out", out, dtypes=(q.dtype,), dim=3)
        if tuple(out.shape) != tuple(q.shape):
            raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
        if out.shape[-1] > 1 and out.stride(-1) != 1:
            raise ValueError(f"out must have a contiguous last dim, got strides {tuple(out.stride())}")
    _dispatch.check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, out=out)
    if _dispatch.host_path(cu_seqlens_q):
        _check_cu_seqlens_on_host("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q, "max_seqlen_q")
        _check_cu_seqlens_on_host("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k")
    scale = head_dim**-0.5 if softmax_scale is None else float(softmax_scale)
    if out is None:
        # rows beyond cu_seqlens_q[-1] are never written: a fresh output reads 0 there
        out = torch.zeros_like(q)
    _varlen_attention_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, out)
    return out
