"""RMSNorm of whole rows, or of the first ``count`` rows an index names (DyLLM's sparse rows).

``out[j] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps))`` with ``r = j`` (no index) or
``r = index[j]`` for ``j < count``, the norm computed in fp32 and rounded to ``x``'s dtype before
the weight multiplies it, as LLaDA's and Dream's RMSNorm do (``model_adapters.common.RMSNorm``
calls :func:`rms_norm_reference`); rows at or past ``count`` are zero. A sparse layer normalises
its query rows before the projections and the salient rows before the FFN: torch spends six ops
on a norm and two more on the gather before it, this kernel one launch.

Kernel: one program per output row, the whole row in registers (``BLOCK_D`` = the next power of
two of the width); fp32 sum of squares, ``rsqrt``, one rounding to ``x``'s dtype, the weight's
product in fp32 rounded once to the output dtype (what torch's elementwise product of the two
does). Not bitwise torch's on a GPU (the sum's order differs): the engine uses it only where a
layer computes some rows (``Taps.rows``), never in the baseline's forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _dispatch
from .row_gather_scatter import _live_count, check_row_set, gather_rows_reference

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the widest row one program holds in registers
MAX_WIDTH = 65536


@triton.jit(do_not_specialize=["count_val"])
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    index_ptr,
    count_ptr,
    count_val,
    n_out,
    D,
    eps,
    stride_xm,
    stride_xd,
    stride_om,
    HAS_INDEX: tl.constexpr,
    HAS_COUNT_PTR: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    ok = offs < D
    if HAS_INDEX:
        count = _live_count(count_ptr, count_val, n_out, HAS_COUNT_PTR)
        src = tl.load(index_ptr + row, mask=row < count, other=0).to(tl.int64)
        live = (row + tl.zeros([BLOCK_D], dtype=tl.int64)) < count  # as a vector: the interpreter's masks
        x_mask = ok & live
    else:
        src = row
        x_mask = ok
    x = tl.load(x_ptr + src * stride_xm + offs.to(tl.int64) * stride_xd, mask=x_mask, other=0.0)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / D
    normed = (xf * tl.math.rsqrt(mean_sq + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = w * normed.to(tl.float32)
    if HAS_INDEX:
        y = tl.where(live, y, 0.0)
    tl.store(out_ptr + row * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    index: torch.Tensor | None = None,
    count: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference: LLaDA's and Dream's RMSNorm (fp32 norm, cast back, times the weight), of
    ``x``'s rows gathered by ``index`` (``gather_rows_reference``: zero past the count) when given.

    ``x [..., D]`` without an index (the model's own call), ``[N, D]`` with one. Reads a tensor
    ``count`` on the host (a sync on CUDA).
    """
    if index is not None:
        x = gather_rows_reference(x, index, count)
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def _rms_norm_triton(x, weight, eps, index, count, out) -> None:
    """Launch on validated arguments into ``out [n_out, D]`` (contiguous)."""
    n_out, D = out.shape
    if n_out == 0 or D == 0:
        return
    count_tensor, count_int = _dispatch.split_count(count if count is not None else n_out)
    _rms_norm_kernel[(n_out,)](
        x,
        weight,
        out,
        index if index is not None else out,  # dummy pointer, never read without an index
        count_tensor if count_tensor is not None else out,  # dummy pointer when the count is an int
        count_int,
        n_out,
        D,
        float(eps),
        x.stride(0),
        x.stride(1),
        out.stride(0),
        HAS_INDEX=index is not None,
        HAS_COUNT_PTR=count_tensor is not None,
        BLOCK_D=triton.next_power_of_2(D),
    )


def _out_like(x: torch.Tensor, weight: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    rows = index.shape[0] if index is not None else x.shape[0]
    dtype = torch.promote_types(x.dtype, weight.dtype)
    return x.new_empty((rows, x.shape[1]), dtype=dtype)


def _rms_norm_impl(x, weight, eps, index, count, count_int) -> torch.Tensor:
    live = count if count is not None else count_int
    if not _dispatch.use_triton(x):
        return rms_norm_reference(x, weight, eps, index, live if index is not None else None)
    out = _out_like(x, weight, index)
    _rms_norm_triton(x, weight, eps, index, live if index is not None else None, out)
    return out


# the registered op (seer_kernels._dispatch): validated arguments; count/count_int only with an index
_rms_norm_op = _dispatch.define_op(
    "rms_norm(Tensor x, Tensor weight, float eps, Tensor? index, Tensor? count, int count_int) -> Tensor",
    _rms_norm_impl,
    lambda x, weight, eps, index, count, count_int: _out_like(x, weight, index),
)


def _check_rms_norm(x, weight, eps, index, count) -> None:
    _dispatch.check_tensor("x", x, dtypes=_DTYPES, dim=2)
    if x.shape[1] > MAX_WIDTH:
        raise ValueError(f"x must have at most {MAX_WIDTH} columns (one row per program), got {x.shape[1]}")
    _dispatch.check_tensor("weight", weight, dtypes=_DTYPES, dim=1)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight must be [D] = [{x.shape[1]}] (x's columns), got {tuple(weight.shape)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0 or eps == float("inf"):
        raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
    check_row_set(index, count, x.shape[0])
    device_count = count if isinstance(count, torch.Tensor) else None
    _dispatch.check_same_device(x=x, weight=weight, index=index, count=device_count)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    index: torch.Tensor | None = None,
    count: int | torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """RMSNorm of ``x``'s rows, or of the rows ``index[:count]`` names.

    Args:
        x: ``[N, D]`` fp16/bf16/fp32, any strides; ``D <= MAX_WIDTH``.
        weight: ``[D]`` fp16/bf16/fp32 (the output dtype is ``x``'s and ``weight``'s promoted
            type, as for torch's product of the two).
        eps: the norm's epsilon, a finite float > 0.
        index: optional int32/int64 ``[capacity]`` contiguous: output row ``j < count`` is the
            norm of ``x[index[j]]`` (rows in ``[0, N)``; checked on the host path only,
            ``_dispatch.host_path``); slots at or past ``count`` are never read (``-1`` padding is
            fine). Without it, output row ``j`` is the norm of ``x[j]``.
        count: with ``index`` (and only with it), the live slots: a Python int in ``[0,
            capacity]`` or an int32/int64 tensor of one element, never read on the device path
            (out-of-range values act as the nearest end).
        check: validate the arguments (default); False skips every check, for a caller that
            builds them itself (the engine's sparse layers): wrong arguments are then undefined
            behaviour.

    Returns:
        ``[capacity or N, D]``, contiguous: ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``
        per row, the norm in fp32; rows at or past ``count`` are zero. Rows of zeros give zeros.
        Under the Triton interpreter use fp16/fp32 (its bf16 arithmetic is wrong).

    No host synchronisation on CUDA (graph-capturable).
    """
    if check:
        _check_rms_norm(x, weight, eps, index, count)
    if index is None:
        return _rms_norm_op(x, weight, float(eps), None, None, 0)
    return _rms_norm_op(x, weight, float(eps), index, *_dispatch.split_count(count))
