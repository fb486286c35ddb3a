"""Rotate-half RoPE of ``[rows, heads, head_dim]`` tensors, with each row's angle row given by
position (row ``j`` of ``cos``/``sin``) or by a row set (row ``index[j]`` for ``j < count``).

``out = x * cos + rotate_half(x) * sin`` per row and head, ``rotate_half(x) = cat(-x2, x1)`` of
the two halves of the head dimension (the NeoX layout LLaDA and Dream use), in one of the two
precisions the models use (:func:`apply_rotary`, which ``model_adapters.common.apply_rope`` also
calls): ``full_precision`` (LLaDA's ``rope_full_precision``: rotate in fp32, round once) or in
``x``'s dtype (Dream: cos/sin rounded to it, each product and the sum rounded). A sparse layer
rotates its queries and the keys of its row set; torch spends seven ops per tensor on it, plus
two gathers of cos/sin for the row set's keys; this kernel one launch per tensor.

Kernel: one program per row and ``BLOCK_H`` heads, both halves of the head dimension in
registers; rows at or past the count write zeros. Not bitwise torch's on a GPU in full precision
(the fp32 products may fuse into an FMA): the engine uses it only where a layer computes some
rows (``Taps.rows``), never in the baseline's forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _dispatch
from .row_gather_scatter import _live_count, _live_mask, check_row_set, gather_rows_reference

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit(do_not_specialize=["count_val"])
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    index_ptr,
    count_ptr,
    count_val,
    M,
    H,
    HALF,
    stride_xm,
    stride_xh,
    stride_xd,
    stride_cm,
    stride_cd,
    stride_sm,
    stride_sd,
    HAS_INDEX: tl.constexpr,
    HAS_COUNT_PTR: tl.constexpr,
    FULL_PRECISION: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK_HALF)
    h_ok = heads < H
    d_ok = offs < HALF
    if HAS_INDEX:
        count = _live_count(count_ptr, count_val, M, HAS_COUNT_PTR)
        angle_row = tl.load(index_ptr + row, mask=row < count, other=0).to(tl.int64)
        live = (row + tl.zeros([BLOCK_HALF], dtype=tl.int64)) < count  # as a vector: the interpreter's masks
        c_mask = d_ok & live
        x_mask = h_ok[:, None] & c_mask[None, :]
    else:
        angle_row = row
        c_mask = d_ok
        x_mask = h_ok[:, None] & d_ok[None, :]
    c_ptrs = cos_ptr + angle_row * stride_cm + offs.to(tl.int64) * stride_cd
    s_ptrs = sin_ptr + angle_row * stride_sm + offs.to(tl.int64) * stride_sd
    c1 = tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
    c2 = tl.load(c_ptrs + HALF * stride_cd, mask=c_mask, other=0.0).to(tl.float32)
    s1 = tl.load(s_ptrs, mask=c_mask, other=0.0).to(tl.float32)
    s2 = tl.load(s_ptrs + HALF * stride_sd, mask=c_mask, other=0.0).to(tl.float32)
    x_ptrs = x_ptr + row * stride_xm + heads[:, None] * stride_xh + offs[None, :].to(tl.int64) * stride_xd
    x1_raw = tl.load(x_ptrs, mask=x_mask, other=0.0)
    x2_raw = tl.load(x_ptrs + HALF * stride_xd, mask=x_mask, other=0.0)
    x1 = x1_raw.to(tl.float32)
    x2 = x2_raw.to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    if FULL_PRECISION:  # fp32 throughout, rounded once
        o1 = x1 * c1[None, :] - x2 * s1[None, :]
        o2 = x2 * c2[None, :] + x1 * s2[None, :]
    else:  # cos/sin in x's dtype; each product rounded, then the sum
        c1 = c1.to(dtype).to(tl.float32)
        c2 = c2.to(dtype).to(tl.float32)
        s1 = s1.to(dtype).to(tl.float32)
        s2 = s2.to(dtype).to(tl.float32)
        o1 = (x1 * c1[None, :]).to(dtype).to(tl.float32) - (x2 * s1[None, :]).to(dtype).to(tl.float32)
        o2 = (x2 * c2[None, :]).to(dtype).to(tl.float32) + (x1 * s2[None, :]).to(dtype).to(tl.float32)
    if HAS_INDEX:
        o1 = tl.where(live[None, :], o1, 0.0)
        o2 = tl.where(live[None, :], o2, 0.0)
    ok = h_ok[:, None] & d_ok[None, :]
    # out is contiguous [M, H, 2 * HALF]
    o_ptrs = out_ptr + row * H * 2 * HALF + heads[:, None] * 2 * HALF + offs[None, :]
    tl.store(o_ptrs, o1.to(dtype), mask=ok)
    tl.store(o_ptrs + HALF, o2.to(dtype), mask=ok)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` of the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, full_precision: bool) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``cos``/``sin`` already broadcastable to ``x``:
    in fp32 rounded once (``full_precision``, LLaDA) or in ``x``'s dtype (Dream)."""
    if full_precision:
        xf = x.float()
        return (xf * cos + rotate_half(xf) * sin).to(x.dtype)
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def rotary_embedding_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    full_precision: bool,
    index: torch.Tensor | None = None,
    count: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference: :func:`apply_rotary` of ``x [M, H, d]`` with ``cos``/``sin`` rows
    gathered by ``index`` (``gather_rows_reference``) when given, else ``cos/sin [M, d]``; rows at
    or past the count zero. No host sync."""
    if index is not None:
        cos = gather_rows_reference(cos, index, count)
        sin = gather_rows_reference(sin, index, count)
    out = apply_rotary(x, cos.unsqueeze(-2), sin.unsqueeze(-2), full_precision=full_precision)
    if index is not None:
        out = out.masked_fill(~_live_mask(count, index.shape[0], index.device).view(-1, 1, 1), 0)
    return out.contiguous()


def _rotary_triton(x, cos, sin, full_precision, index, count, out) -> None:
    """Launch on validated arguments into ``out`` (contiguous, ``x``'s shape)."""
    M, H, d = x.shape
    if M == 0 or H == 0 or d == 0:
        return
    count_tensor, count_int = _dispatch.split_count(count if count is not None else M)
    block_h = min(triton.next_power_of_2(H), 16)
    _rotary_kernel[(M, triton.cdiv(H, block_h))](
        x,
        cos,
        sin,
        out,
        index if index is not None else out,  # dummy pointer, never read without an index
        count_tensor if count_tensor is not None else out,  # dummy pointer when the count is an int
        count_int,
        M,
        H,
        d // 2,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        cos.stride(0),
        cos.stride(1),
        sin.stride(0),
        sin.stride(1),
        HAS_INDEX=index is not None,
        HAS_COUNT_PTR=count_tensor is not None,
        FULL_PRECISION=bool(full_precision),
        BLOCK_H=block_h,
        BLOCK_HALF=triton.next_power_of_2(max(d // 2, 1)),
    )


def _rotary_impl(x, cos, sin, full_precision, index, count, count_int) -> torch.Tensor:
    live = (count if count is not None else count_int) if index is not None else None
    if not _dispatch.use_triton(x):
        return rotary_embedding_reference(x, cos, sin, full_precision, index, live)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rotary_triton(x, cos, sin, full_precision, index, live, out)
    return out


# the registered op (seer_kernels._dispatch): validated arguments; count/count_int only with an index
_rotary_op = _dispatch.define_op(
    "rotary_embedding(Tensor x, Tensor cos, Tensor sin, bool full_precision, Tensor? index, Tensor? count, "
    "int count_int) -> Tensor",
    _rotary_impl,
    lambda x, cos, sin, full_precision, index, count, count_int: torch.empty_like(
        x, memory_format=torch.contiguous_format
    ),
)


def _check_rotary(x, cos, sin, index, count) -> None:
    _dispatch.check_tensor("x", x, dtypes=_DTYPES, dim=3)
    d = x.shape[2]
    if d % 2:
        raise ValueError(f"x's head dimension must be even (rotate-half pairs its halves), got {d}")
    for name, table in (("cos", cos), ("sin", sin)):
        _dispatch.check_tensor(name, table, dtypes=_DTYPES, dim=2)
        if table.shape[1] != d:
            raise ValueError(f"{name} must be [N, {d}] (x's head dimension), got {tuple(table.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    check_row_set(index, count, cos.shape[0])
    if index is None and cos.shape[0] != x.shape[0]:
        raise ValueError(f"cos must have one row per row of x ({x.shape[0]}) without an index, got {cos.shape[0]}")
    if index is not None and index.shape[0] != x.shape[0]:
        raise ValueError(f"index must have x's {x.shape[0]} rows (its capacity), got {index.shape[0]}")
    _dispatch.check_same_device(x=x, cos=cos, sin=sin, index=index,
                                count=count if isinstance(count, torch.Tensor) else None)


def rotary_embedding(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    full_precision: bool,
    index: torch.Tensor | None = None,
    count: int | torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """Rotate-half RoPE of ``x``'s rows, each with its own row of ``cos``/``sin``.

    Args:
        x: ``[M, H, d]`` fp16/bf16/fp32 (rows, heads, head dim; ``d`` even), any strides.
        cos, sin: ``[N, d]`` fp16/bf16/fp32 (the models pass fp32), any strides. Without an
            index ``N = M`` and row ``j`` of ``x`` uses row ``j``; with one, row ``j < count``
            uses row ``index[j]``.
        full_precision: rotate in fp32 and round once (LLaDA), or in ``x``'s dtype with cos/sin
            rounded to it (Dream).
        index: optional int32/int64 ``[M]`` contiguous, live slots in ``[0, N)`` (checked on the
            host path only, ``_dispatch.host_path``); slots at or past ``count`` are never read.
        count: with ``index`` (and only with it), the live rows: an int in ``[0, M]`` or an
            int32/int64 tensor of one element, never read on the device path (out-of-range
            values act as the nearest end).
        check: validate the arguments (default); False skips every check, for a caller that
            builds them itself (the engine's sparse layers).

    Returns:
        ``[M, H, d]`` contiguous in ``x``'s dtype; with an index, rows at or past ``count`` are
        zero. Under the Triton interpreter use fp16/fp32 (its bf16 arithmetic is wrong).

    No host synchronisation on CUDA (graph-capturable).
    """
    if check:
        _check_rotary(x, cos, sin, index, count)
    if index is None:
        return _rotary_op(x, cos, sin, bool(full_precision), None, None, 0)
    return _rotary_op(x, cos, sin, bool(full_precision), index, *_dispatch.split_count(count))
