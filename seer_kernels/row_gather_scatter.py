"""Row gather, scatter and exchange through a fixed-capacity index buffer with a device-side count.

A row set is ``index[:count]``: ``index`` a fixed-capacity int buffer, ``count`` a host int or a
one-element device tensor, so the number of live rows can stay on the device and the ops are
CUDA-graph capturable. :func:`gather_rows` copies the set's rows of an ``[N, D]`` table into a
dense ``[capacity, D]`` block; :func:`scatter_rows` writes such a block into the table;
:func:`exchange_rows` writes it and returns, in the same pass, the rows it overwrote or (with
``delta=True``) each row's change ``new - old``.

DyLLM's sparse layer writes the recomputed rows' keys with :func:`exchange_rows` (the previous
keys feed the key-corrected attention), their values with ``exchange_rows(delta=True)`` (the
change feeds the value correction) and the salient rows' FFN outputs with :func:`scatter_rows`,
all at indices and counts that :func:`cosine_saliency` left on the device. It gathers nothing:
the rows it computes come compact out of the norm by index (``seer_kernels.rms_norm``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _dispatch

_CONFIGS = _dispatch.single_config_when_interpreting(
    [
        # first entry: the one the interpreter uses (small, so tests cross block edges)
        triton.Config({"BLOCK_M": 4, "BLOCK_D": 32}, num_warps=4),
        triton.Config({"BLOCK_M": 2, "BLOCK_D": 512}, num_warps=4),
        triton.Config({"BLOCK_M": 4, "BLOCK_D": 512}, num_warps=4),
        triton.Config({"BLOCK_M": 8, "BLOCK_D": 256}, num_warps=4),
        triton.Config({"BLOCK_M": 16, "BLOCK_D": 128}, num_warps=4),
        triton.Config({"BLOCK_M": 4, "BLOCK_D": 1024}, num_warps=8),
    ]
)

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _live_count(count_ptr, count_val, capacity, HAS_COUNT_PTR: tl.constexpr):
    if HAS_COUNT_PTR:
        cnt = tl.load(count_ptr).to(tl.int64)
    else:
        cnt = count_val.to(tl.int64)
    return tl.minimum(tl.maximum(cnt, 0), capacity)


@triton.autotune(configs=_CONFIGS, key=["D"])
@triton.jit(do_not_specialize=["count_val", "capacity"])
def _gather_rows_kernel(
    src_ptr,
    index_ptr,
    count_ptr,
    count_val,
    out_ptr,
    capacity,
    D,
    stride_sm,
    stride_sd,
    stride_om,
    stride_od,
    HAS_COUNT_PTR: tl.constexpr,
    ZERO_TAIL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1).to(tl.int64)
    cnt = _live_count(count_ptr, count_val, capacity, HAS_COUNT_PTR)
    j = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    live = j < cnt
    # slots past count are never dereferenced: they may hold padding such as -1
    rows = tl.load(index_ptr + j, mask=live, other=0).to(tl.int64)
    c = pid_d * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)
    cmask = c < D
    vals = tl.load(
        src_ptr + rows[:, None] * stride_sm + c[None, :] * stride_sd,
        mask=live[:, None] & cmask[None, :],
        other=0.0,
    )
    if ZERO_TAIL:
        keep = j < capacity
    else:
        keep = live
    tl.store(
        out_ptr + j[:, None] * stride_om + c[None, :] * stride_od, vals, mask=keep[:, None] & cmask[None, :]
    )


@triton.autotune(configs=_CONFIGS, key=["D"])
@triton.jit(do_not_specialize=["count_val", "capacity"])
def _scatter_rows_kernel(
    src_ptr,
    index_ptr,
    count_ptr,
    count_val,
    dst_ptr,
    capacity,
    D,
    stride_sm,
    stride_sd,
    stride_dm,
    stride_dd,
    HAS_COUNT_PTR: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1).to(tl.int64)
    cnt = _live_count(count_ptr, count_val, capacity, HAS_COUNT_PTR)
    j = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    live = j < cnt
    rows = tl.load(index_ptr + j, mask=live, other=0).to(tl.int64)
    c = pid_d * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)
    m = live[:, None] & (c < D)[None, :]
    vals = tl.load(src_ptr + j[:, None] * stride_sm + c[None, :] * stride_sd, mask=m)
    tl.store(dst_ptr + rows[:, None] * stride_dm + c[None, :] * stride_dd, vals, mask=m)


@triton.autotune(configs=_CONFIGS, key=["D"], restore_value=["table_ptr"])  # the table is written in place
@triton.jit(do_not_specialize=["count_val", "capacity"])
def _exchange_rows_kernel(
    table_ptr,
    index_ptr,
    count_ptr,
    count_val,
    rows_ptr,
    out_ptr,
    capacity,
    D,
    stride_tm,
    stride_td,
    stride_rm,
    stride_rd,
    stride_om,
    stride_od,
    HAS_COUNT_PTR: tl.constexpr,
    DELTA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1).to(tl.int64)
    cnt = _live_count(count_ptr, count_val, capacity, HAS_COUNT_PTR)
    j = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    live = j < cnt
    rows = tl.load(index_ptr + j, mask=live, other=0).to(tl.int64)
    c = pid_d * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)
    c_ok = (c < D)[None, :]
    m = live[:, None] & c_ok
    at = table_ptr + rows[:, None] * stride_tm + c[None, :] * stride_td
    previous = tl.load(at, mask=m, other=0.0)  # the live rows are unique: no other program touches them
    new = tl.load(rows_ptr + j[:, None] * stride_rm + c[None, :] * stride_rd, mask=m, other=0.0)
    tl.store(at, new, mask=m)
    result = previous
    if DELTA:  # new - old, rounded once as torch's subtraction is (fp64 stays fp64)
        if new.dtype == tl.float64:
            result = new - previous
        else:
            result = (new.to(tl.float32) - previous.to(tl.float32)).to(new.dtype)
    tl.store(out_ptr + j[:, None] * stride_om + c[None, :] * stride_od, result, mask=(j < capacity)[:, None] & c_ok)


def _count_args(count: int | torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    if isinstance(count, torch.Tensor):
        return count, 0, True
    return index, int(count), False  # index doubles as a dummy pointer, never read as a count


def _gather_rows_triton(
    src2: torch.Tensor, index: torch.Tensor, count, out2: torch.Tensor, zero_tail: bool
) -> None:
    capacity, D = out2.shape
    if capacity == 0 or D == 0:
        return
    count_ptr, count_val, has_ptr = _count_args(count, index)
    grid = lambda meta: (triton.cdiv(capacity, meta["BLOCK_M"]), triton.cdiv(D, meta["BLOCK_D"]))
    _gather_rows_kernel[grid](
        src2,
        index,
        count_ptr,
        count_val,
        out2,
        capacity,
        D,
        src2.stride(0),
        src2.stride(1),
        out2.stride(0),
        out2.stride(1),
        HAS_COUNT_PTR=has_ptr,
        ZERO_TAIL=zero_tail,
    )


def _scatter_rows_triton(dst2: torch.Tensor, index: torch.Tensor, count, src2: torch.Tensor) -> None:
    capacity, D = src2.shape
    if capacity == 0 or D == 0:
        return
    count_ptr, count_val, has_ptr = _count_args(count, index)
    grid = lambda meta: (triton.cdiv(capacity, meta["BLOCK_M"]), triton.cdiv(D, meta["BLOCK_D"]))
    _scatter_rows_kernel[grid](
        src2,
        index,
        count_ptr,
        count_val,
        dst2,
        capacity,
        D,
        src2.stride(0),
        src2.stride(1),
        dst2.stride(0),
        dst2.stride(1),
        HAS_COUNT_PTR=has_ptr,
    )


def _exchange_rows_triton(table2: torch.Tensor, index: torch.Tensor, count, rows2: torch.Tensor,
                          out2: torch.Tensor, delta: bool) -> None:
    capacity, D = rows2.shape
    if capacity == 0 or D == 0:
        return
    count_ptr, count_val, has_ptr = _count_args(count, index)
    grid = lambda meta: (triton.cdiv(capacity, meta["BLOCK_M"]), triton.cdiv(D, meta["BLOCK_D"]))  # noqa: E731
    _exchange_rows_kernel[grid](
        table2,
        index,
        count_ptr,
        count_val,
        rows2,
        out2,
        capacity,
        D,
        table2.stride(0),
        table2.stride(1),
        rows2.stride(0),
        rows2.stride(1),
        out2.stride(0),
        out2.stride(1),
        HAS_COUNT_PTR=has_ptr,
        DELTA=bool(delta),
    )


def _live_mask(count: int | torch.Tensor, capacity: int, device: torch.device) -> torch.Tensor:
    slots = torch.arange(capacity, device=device)
    if isinstance(count, torch.Tensor):
        return slots < count.reshape(()).to(slots.dtype).clamp(0, capacity)
    return slots < min(max(int(count), 0), capacity)


def gather_rows_reference(
    src: torch.Tensor,
    index: torch.Tensor,
    count: int | torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    zero_tail: bool = True,
) -> torch.Tensor:
    """Torch reference of :func:`gather_rows` (no host sync)."""
    capacity = index.shape[0]
    live = _live_mask(count, capacity, index.device)
    if out is None:
        out = torch.zeros((capacity, *src.shape[1:]), dtype=src.dtype, device=src.device)
    if src.shape[0] == 0:
        vals = torch.zeros_like(out)
    else:
        safe = torch.where(
            live, index.to(torch.int64), torch.zeros((), dtype=torch.int64, device=index.device)
        )
        vals = src.index_select(0, safe)
    bshape = (capacity,) + (1,) * (src.dim() - 1)
    if zero_tail:
        out.copy_(vals.masked_fill_(~live.view(bshape), 0))
    else:
        out.copy_(torch.where(live.view(bshape), vals, out))
    return out


def scatter_rows_reference(
    dst: torch.Tensor, index: torch.Tensor, count: int | torch.Tensor, src: torch.Tensor
) -> torch.Tensor:
    """Torch reference of :func:`scatter_rows`; reads a tensor ``count`` on the host (syncs)."""
    n = int(_live_mask(count, index.shape[0], index.device).sum())
    dst.index_copy_(0, index[:n].to(torch.int64), src[:n])
    return dst


def exchange_rows_reference(
    table: torch.Tensor, index: torch.Tensor, count: int | torch.Tensor, rows: torch.Tensor, *, delta: bool = False
) -> torch.Tensor:
    """Torch reference of :func:`exchange_rows`: :func:`gather_rows_reference`, then
    :func:`scatter_rows_reference` (which reads a tensor ``count`` on the host: syncs); with
    ``delta``, ``rows - previous`` on the live slots (zero past the count)."""
    previous = gather_rows_reference(table, index, count)
    scatter_rows_reference(table, index, count, rows)
    if not delta:
        return previous
    live = _live_mask(count, index.shape[0], index.device).view(-1, *([1] * (rows.dim() - 1)))
    return torch.where(live, rows - previous, torch.zeros((), dtype=rows.dtype, device=rows.device))


def _gather_rows_impl(src, index, count, count_int, zero_tail, out) -> None:
    live = count if count is not None else count_int
    if not _dispatch.use_triton(src):
        gather_rows_reference(src, index, live, out=out, zero_tail=zero_tail)
        return
    _gather_rows_triton(_rows_2d("src", src), index, live, _rows_2d("out", out), zero_tail)


def _scatter_rows_impl(dst, index, count, count_int, src) -> None:
    live = count if count is not None else count_int
    if not _dispatch.use_triton(dst):
        scatter_rows_reference(dst, index, live, src)
        return
    _scatter_rows_triton(_rows_2d("dst", dst), index, live, _rows_2d("src", src))


def _exchange_rows_impl(table, index, count, count_int, rows, delta) -> torch.Tensor:
    live = count if count is not None else count_int
    if not _dispatch.use_triton(table):
        return exchange_rows_reference(table, index, live, rows, delta=delta)
    out = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
    _exchange_rows_triton(_rows_2d("table", table), index, live, _rows_2d("rows", rows), _rows_2d("out", out),
                          delta)
    return out


# the registered ops (seer_kernels._dispatch): validated arguments, buffers allocated by the caller
_gather_rows_op = _dispatch.define_op(
    "gather_rows(Tensor src, Tensor index, Tensor? count, int count_int, bool zero_tail, Tensor(a!) out) -> ()",
    _gather_rows_impl,
    lambda src, index, count, count_int, zero_tail, out: None,
)
_exchange_rows_op = _dispatch.define_op(
    "exchange_rows(Tensor(a!) table, Tensor index, Tensor? count, int count_int, Tensor rows, bool delta) -> Tensor",
    _exchange_rows_impl,
    lambda table, index, count, count_int, rows, delta: torch.empty_like(rows, memory_format=torch.contiguous_format),
)
_scatter_rows_op = _dispatch.define_op(
    "scatter_rows(Tensor(a!) dst, Tensor index, Tensor? count, int count_int, Tensor src) -> ()",
    _scatter_rows_impl,
    lambda dst, index, count, count_int, src: None,
)


def _rows_2d(name: str, t: torch.Tensor) -> torch.Tensor:
    """View ``t`` as ``[rows, prod(trailing)]`` without copying (writes must land in ``t``)."""
    if t.dim() == 2:
        return t
    try:
        return t.view(t.shape[0], math.prod(t.shape[1:]))
    except RuntimeError:
        raise ValueError(f"{name} must have trailing dims that flatten into one without a copy") from None


def _check_common(index: object, count: object) -> torch.Tensor:
    _dispatch.check_tensor("index", index, dtypes=_INDEX_DTYPES, dim=1)
    if not index.is_contiguous():
        raise ValueError("index must be contiguous")
    _dispatch.check_count("count", count, index.shape[0], "the index capacity")
    return index


def _check_index_values(index: torch.Tensor, count: int | torch.Tensor, n_rows: int, *, unique: bool) -> None:
    """On the host path the live index values cost nothing to check; on a GPU that would need a sync."""
    if not _dispatch.host_path(index):
        return
    n = int(_live_mask(count, index.shape[0], index.device).sum())
    live = index[:n]
    if n and (int(live.min()) < 0 or int(live.max()) >= n_rows):
        raise ValueError(f"index values in slots [0, count) must lie in [0, {n_rows}), got {live.tolist()}")
    if unique and n and torch.unique(live).numel() != n:
        raise ValueError("index values in slots [0, count) must be unique for scatter_rows")


def check_row_set(index: object, count: object, n_rows: int) -> None:
    """The checks of an optional row set ``(index, count)`` over a table of ``n_rows`` rows that
    another op family takes (``rms_norm``, ``rotary_embedding``): both or neither given; ``index``
    int32/int64 ``[capacity]`` contiguous, ``count`` an int in ``[0, capacity]`` or a one-element
    int tensor, and, on the host path, the live slots' values in ``[0, n_rows)``."""
    if (index is None) != (count is None):
        raise ValueError("index and count go together: pass both (a row set) or neither")
    if index is None:
        return
    _check_common(index, count)
    _check_index_values(index, count, n_rows, unique=False)


def _check_row_op(table_name: str, table: object, index: object, count: object, rows_name: str,
                  rows: object, *, unique: bool) -> None:
    """The argument checks :func:`gather_rows` and :func:`scatter_rows` share: ``table`` ``[N, *F]``
    (read or written), ``index`` and ``count``, and ``rows`` ``[capacity, *F]`` of the table's dtype
    (the gathered rows, or the rows to scatter; None: allocated by the caller), on one device;
    live index values in ``[0, N)`` (``unique`` for a scatter) on the host path."""
    _dispatch.check_tensor(table_name, table, dtypes=_FLOAT_DTYPES, min_dim=2)
    _check_common(index, count)
    capacity = index.shape[0]
    if rows is not None:
        _dispatch.check_tensor(rows_name, rows, dtypes=(table.dtype,))
        if tuple(rows.shape) != (capacity, *table.shape[1:]):
            raise ValueError(f"{rows_name} must have shape {(capacity, *table.shape[1:])}, got {tuple(rows.shape)}")
    devices = {table_name: table, "index": index, "count": count if isinstance(count, torch.Tensor) else None}
    _dispatch.check_same_device(**devices, **{rows_name: rows})
    _rows_2d(table_name, table)
    if rows is not None:
        _rows_2d(rows_name, rows)
    _check_index_values(index, count, table.shape[0], unique=unique)


def gather_rows(
    src: torch.Tensor,
    index: torch.Tensor,
    count: int | torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    zero_tail: bool = True,
    check: bool = True,
) -> torch.Tensor:
    """``out[j] = src[index[j]]`` for ``j < count``; a fixed-capacity, graph-capturable gather.

    Args:
        src: ``[N, *F]`` fp16/bf16/fp32/fp64, any strides (trailing dims must flatten to one
            without a copy when there are more than one).
        index: int32/int64 ``[capacity]`` contiguous; slots ``j < count`` hold row ids in
            ``[0, N)`` (checked on the host path only, ``_dispatch.host_path``: a CUDA check would
            need a host sync); slots at or past ``count`` are never read as row ids (``-1``
            padding is fine).
        count: number of live slots: a Python int in ``[0, capacity]``, or an int32/int64
            tensor of one element on the device (values outside ``[0, capacity]`` act as the
            nearest end; not checked, that would need a host sync).
        out: optional ``[capacity, *F]`` buffer of ``src``'s dtype.
        zero_tail: rows ``j >= count`` of ``out`` are zero-filled (default), or left untouched
            when False (saves the writes when the caller ignores those rows).
        check: validate the arguments (default). False skips every check, for a caller that
            builds them itself and calls in a hot loop (the engine's sparse layers): wrong
            arguments are then undefined behaviour.

    Returns:
        ``out`` ``[capacity, *F]``. Repeated indices are allowed. ``capacity = 0`` or ``N = 0``
        (with ``count = 0``) are valid no-ops apart from the zero fill.
    """
    capacity = index.shape[0]
    if check:
        _check_row_op("src", src, index, count, "out", out, unique=False)
    if out is None:
        out = torch.empty((capacity, *src.shape[1:]), dtype=src.dtype, device=src.device)
        if not zero_tail:
            out.zero_()  # a fresh buffer has no previous contents worth keeping
    _gather_rows_op(src, index, *_dispatch.split_count(count), bool(zero_tail), out)
    return out


def scatter_rows(
    dst: torch.Tensor, index: torch.Tensor, count: int | torch.Tensor, src: torch.Tensor, *, check: bool = True
) -> torch.Tensor:
    """In place ``dst[index[j]] = src[j]`` for ``j < count``; returns ``dst``.

    Args:
        dst: ``[N, *F]`` fp16/bf16/fp32/fp64, written in place (trailing dims must flatten to
            one without a copy when there are more than one).
        index: int32/int64 ``[capacity]`` contiguous; slots ``j < count`` hold **unique** row
            ids in ``[0, N)``. Duplicates are forbidden: on a GPU the last writer is not
            deterministic. Range and uniqueness are checked on the host path only (a CUDA
            check would need a host sync). Slots at or past ``count`` are never read.
        count: as in :func:`gather_rows`.
        src: ``[capacity, *F]`` of ``dst``'s dtype; rows ``j >= count`` are ignored.
        check: validate the arguments (default); False skips every check, as in
            :func:`gather_rows`.

    Rows of ``dst`` not named by a live slot are left untouched. Graph-capturable (the first
    CUDA call per row width autotunes: warm up before a capture).
    """
    if check:
        _check_row_op("dst", dst, index, count, "src", src, unique=True)
    _scatter_rows_op(dst, index, *_dispatch.split_count(count), src)
    return dst


def exchange_rows(
    table: torch.Tensor, index: torch.Tensor, count: int | torch.Tensor, rows: torch.Tensor, *, delta: bool = False,
    check: bool = True,
) -> torch.Tensor:
    """In place ``table[index[j]] = rows[j]`` for ``j < count``, returning the rows it overwrote.

    One pass over the live rows instead of a :func:`gather_rows` and a :func:`scatter_rows`.

    Args:
        table: ``[N, *F]`` fp16/bf16/fp32/fp64, written in place (trailing dims must flatten to
            one without a copy when there are more than one).
        index: int32/int64 ``[capacity]`` contiguous; slots ``j < count`` hold **unique** row
            ids in ``[0, N)`` (checked on the host path only); slots at or past ``count`` are
            never read.
        count: as in :func:`gather_rows`.
        rows: ``[capacity, *F]`` of ``table``'s dtype; rows ``j >= count`` are ignored.
        delta: return ``rows[j] - table[index[j]]`` (the change each live row makes, computed in
            fp32 and rounded once to the dtype as torch's subtraction is; fp64 in fp64) instead of
            the overwritten rows: DyLLM's ``V_new - V_old`` in the same pass.
        check: validate the arguments (default); False skips every check, as in
            :func:`gather_rows`.

    Returns:
        ``[capacity, *F]`` contiguous: row ``j < count`` is ``table[index[j]]`` as it was before
        the call (or the change, with ``delta``), rows at or past ``count`` are zero. Rows of
        ``table`` not named by a live slot are left untouched. Graph-capturable (the first CUDA
        call per row width autotunes, restoring the table between trials: warm up before a
        capture).
    """
    if check:
        _check_row_op("table", table, index, count, "rows", rows, unique=True)
        if not isinstance(delta, bool):
            raise TypeError(f"delta must be a bool, got {type(delta).__name__}")
    return _exchange_rows_op(table, index, *_dispatch.split_count(count), rows, bool(delta))
