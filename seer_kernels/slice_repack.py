"""Slice, route and re-lay-out a group of rows after Seer's step-0 cut, with no host sync.

Seer §1.5 ("device-resident latency shadowing"): once every row ``b`` of a padded ``[B, N]``
batch knows how many leading positions it keeps (``keep_len[b] = L*_b``), one fused kernel

a. decides the execution path of the group from ``keep_len`` and the router's bucket tables,
   exactly by the padding-waste rule (all programs reach it redundantly and deterministically),
   or takes the layout the host already decided (``route=``) after checking that it holds the
   group;
b. writes the rows in the chosen layout: bucket-padded ``[batch bucket, B_G]`` for the static
   graph, or packed back to back for the varlen graph / eager path;
c. writes ``cu_seqlens``, position ids, the key mask and the source index of every slot;
d. writes a small control word that the host can poll (optionally copied to pinned memory).

The rule is written out in ``slice_repack_control.py`` beside its host implementation
:func:`~seer_kernels.slice_repack_control.slice_repack_decision` (which the router calls), with
the control word, the buffers and the path codes; this file holds the kernel, its launcher, the
torch reference and the public op.

Kernel layout: a 1-D grid of programs; each program loads the group's lengths and the tables,
takes the decision, derives every row's packed offset with ``tl.cumsum``, and then walks the
work items of the chosen layout (``(row, block of positions)`` tiles, and blocks of padding)
with a grid stride. Program 0 also writes the control word and ``cu_seqlens``. Values are
moved as raw bits (reinterpreted as int16/int32/int64), so the copy is exact for every dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from . import _dispatch
from .slice_repack_control import (
    BUFFER_FIELDS,
    CONTROL_SIZE,
    ERR_CAPACITY,
    ERR_KEEP_LEN,
    ERR_ROUTE,
    ERR_ROW_IDS,
    MAX_GROUP,
    PATH_EAGER,
    PATH_ERROR,
    PATH_STATIC,
    PATH_VARLEN,
    ControlValues,
    ControlWord,
    SliceRepackOutput,
    _decide,
    route_problem,
    slice_repack_buffers,
)

_BIG = tl.constexpr(1 << 40)  # "no bucket" sentinel; G * _BIG still fits in int64

_INT_CONTAINER = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_ID_DTYPES = (torch.int64, torch.int32)
_HIDDEN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _copy_value_tile(
    VALS,
    OUT,
    src_row,
    n,
    real,
    dst,
    dst_ok,
    stride_vb,
    stride_vn,
    stride_vd,
    D,
    pad_bits,
    BLOCK_D: tl.constexpr,
    HAS_D: tl.constexpr,
):
    """Copy ``VALS[src_row, n(, :)]`` (pad bits where not ``real``) to ``OUT[dst(, :)]`` where ``dst_ok``."""
    src = VALS + src_row * stride_vb + n * stride_vn
    if HAS_D:
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            d_ok = d < D
            x = tl.load(
                src[:, None] + d[None, :].to(tl.int64) * stride_vd,
                mask=real[:, None] & d_ok[None, :],
                other=pad_bits,
            )
            tl.store(OUT + dst[:, None] * D + d[None, :], x, mask=dst_ok[:, None] & d_ok[None, :])
    else:
        x = tl.load(src, mask=real, other=pad_bits)
        tl.store(OUT + dst, x, mask=dst_ok)


@triton.jit
def _smallest_at_least(TABLE, count, threshold, TB: tl.constexpr):
    """(exists, smallest entry >= threshold) of a 1-D table of ``count`` entries."""
    i = tl.arange(0, TB)
    entries = tl.load(TABLE + i, mask=i < count, other=0).to(tl.int64)
    fits = (i < count) & (entries >= threshold)
    exists = tl.sum(fits.to(tl.int32), 0) > 0
    smallest = tl.min(tl.where(fits, entries, _BIG), 0)
    return exists, smallest


@triton.jit
def _is_entry(TABLE, count, value, TB: tl.constexpr):
    """Whether ``value`` is an entry of a 1-D table of ``count`` entries."""
    exists, smallest = _smallest_at_least(TABLE, count, value, TB)
    return exists & (smallest == value)


@triton.jit(do_not_specialize=["r_path", "r_bucket", "r_total", "r_max_len", "r_batch"])
def _slice_repack_kernel(
    VALS,
    POS,
    KEEP,
    ROW_IDS,
    MICRO,
    PACKED,
    BATCHB,
    PAD_VALS,
    PAD_POS,
    PAD_MASK,
    PAD_SRC,
    PK_VALS,
    PK_POS,
    PK_SEQ,
    PK_SRC,
    CU,
    CTRL,
    stride_vb,
    stride_vn,
    stride_vd,
    stride_pb,
    stride_pn,
    B,
    N,
    D,
    G,
    n_micro,
    n_packed,
    n_batch,
    tau_pad: tl.float64,
    eager_max_bucket,
    pad_bits,
    batch_cap,
    bucket_cap,
    packed_cap,
    cu_len,
    r_path,
    r_bucket,
    r_total,
    r_max_len,
    r_batch,
    GB: tl.constexpr,
    MB: tl.constexpr,
    PB: tl.constexpr,
    BB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_POS: tl.constexpr,
    HAS_ROW_IDS: tl.constexpr,
    FORCED: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    # --- the group's lengths (every program, redundantly) ---
    gi = tl.arange(0, GB)
    g_ok = gi < G
    if HAS_ROW_IDS:
        rows = tl.load(ROW_IDS + gi, mask=g_ok, other=0).to(tl.int64)
    else:
        rows = gi.to(tl.int64)
    row_ok = (rows >= 0) & (rows < B)
    lens = tl.load(KEEP + rows, mask=g_ok & row_ok, other=0).to(tl.int64)
    bad_row = tl.sum((g_ok & ~row_ok).to(tl.int32), 0) > 0
    bad_len = tl.sum((g_ok & ((lens < 0) | (lens > N))).to(tl.int32), 0) > 0
    total = tl.sum(lens, 0)
    max_len = tl.max(lens, 0)
    offsets = tl.cumsum(lens, 0) - lens  # exclusive prefix sum: each row's packed start

    zero = total * 0  # int64 scalar: the scalar arguments below may arrive as constexprs
    if FORCED:
        # --- the layout the host decided (route=): written as given when it holds the group ---
        path = zero + r_path
        bucket = zero + r_bucket
        batch_rows = zero + r_batch
        # the checks of slice_repack_control.route_problem, on the measured T and Lmax
        empty_ok = (total == 0) & (bucket == 0) & (batch_rows == G)
        static_ok = (bucket >= max_len) & _is_entry(MICRO, n_micro, bucket, MB)
        static_ok = static_ok & (batch_rows >= G) & _is_entry(BATCHB, n_batch, batch_rows, BB)
        varlen_ok = (bucket >= total) & _is_entry(PACKED, n_packed, bucket, PB) & (batch_rows == G)
        eager_ok = (bucket == total) & (batch_rows == G)
        holds = tl.where(
            path == 0,
            empty_ok,
            tl.where(path == 1, static_ok, tl.where(path == 2, varlen_ok, (path == 3) & eager_ok)),
        )
        bad_route = ~(holds & (total == r_total) & (max_len == r_max_len))
    else:
        # --- the decision (slice_repack_control's rule); identical in every program ---
        has_bg, b_g = _smallest_at_least(MICRO, n_micro, max_len, MB)
        has_gb, g_b = _smallest_at_least(BATCHB, n_batch, G, BB)
        has_p, p_len = _smallest_at_least(PACKED, n_packed, total, PB)
        pwr = 1.0 - total.to(tl.float64) / tl.maximum(G * b_g, 1).to(tl.float64)  # G = 0 is EMPTY anyway
        path = tl.where(has_p, 2, 3)  # VARLEN, else EAGER
        path = tl.where((pwr <= tau_pad) & has_gb, 1, path)  # STATIC
        path = tl.where((G == 1) | (b_g <= eager_max_bucket), 3, path)
        path = tl.where(has_bg, path, 3)
        path = tl.where(total == 0, 0, path)  # EMPTY
        bucket = tl.where(path == 1, b_g, tl.where(path == 2, p_len, tl.where(path == 3, total, 0)))
        batch_rows = tl.where(path == 1, g_b, G)
        bad_route = zero != zero  # False: no route to check

    too_big = ((path == 1) & ((batch_rows > batch_cap) | (bucket > bucket_cap))) | (
        ((path == 2) | (path == 3)) & (bucket > packed_cap)
    )
    error = (
        bad_len.to(tl.int32) * 1 + bad_row.to(tl.int32) * 2 + too_big.to(tl.int32) * 4 + bad_route.to(tl.int32) * 8
    )
    path = tl.where(error != 0, -1, path)
    bucket = tl.where(error != 0, 0, bucket)
    batch_rows = tl.where(error != 0, 0, batch_rows)

    if pid == 0:
        tl.store(CTRL + 0, path.to(tl.int32))
        tl.store(CTRL + 1, bucket.to(tl.int32))
        tl.store(CTRL + 2, total.to(tl.int32))
        tl.store(CTRL + 3, max_len.to(tl.int32))
        tl.store(CTRL + 4, error)
        tl.store(CTRL + 5, batch_rows.to(tl.int32))
        if error == 0:
            tl.store(CU + gi, offsets.to(tl.int32), mask=g_ok)
            for c0 in range(G, cu_len, GB):
                c = c0 + tl.arange(0, GB)
                tl.store(CU + c, total.to(tl.int32) + tl.zeros([GB], dtype=tl.int32), mask=c < cu_len)

    offs = tl.arange(0, BLOCK_N)
    if path == 1:
        # STATIC: the region [:batch_rows, :bucket] of the padded layout, one (row, column block) per item
        col_blocks = tl.cdiv(bucket, BLOCK_N)
        n_items = batch_rows * col_blocks
        for it in range(0, tl.cdiv(n_items - pid, nprog)):
            item = pid + it * nprog
            r = item // col_blocks
            n = ((item % col_blocks) * BLOCK_N + offs).to(tl.int64)
            sel = gi == r
            len_r = tl.sum(tl.where(sel, lens, 0), 0)  # 0 for the padding rows r >= G
            src_row = tl.sum(tl.where(sel, rows, 0), 0)
            real = n < len_r
            in_bucket = n < bucket
            dst = r.to(tl.int64) * bucket_cap + n
            _copy_value_tile(
                VALS,
                PAD_VALS,
                src_row,
                n,
                real,
                dst,
                in_bucket,
                stride_vb,
                stride_vn,
                stride_vd,
                D,
                pad_bits,
                BLOCK_D,
                HAS_D,
            )
            if HAS_POS:
                pos = tl.load(POS + src_row * stride_pb + n * stride_pn, mask=real, other=0)
            else:
                pos = tl.where(real, n, 0)
            tl.store(PAD_POS + dst, pos, mask=in_bucket)
            tl.store(PAD_MASK + dst, real.to(tl.int8), mask=in_bucket)
            tl.store(PAD_SRC + dst, tl.where(real, src_row * N + n, -1), mask=in_bucket)
    if (path == 2) | (path == 3):
        # VARLEN / EAGER: real tokens row by row to their packed offsets, then padding [T, P)
        row_blocks = tl.cdiv(N, BLOCK_N)
        n_real_items = G * row_blocks
        n_items = n_real_items + tl.cdiv(bucket - total, BLOCK_N)
        for it in range(0, tl.cdiv(n_items - pid, nprog)):
            item = pid + it * nprog
            if item < n_real_items:
                r = item // row_blocks
                n = ((item % row_blocks) * BLOCK_N + offs).to(tl.int64)
                sel = gi == r
                len_r = tl.sum(tl.where(sel, lens, 0), 0)
                src_row = tl.sum(tl.where(sel, rows, 0), 0)
                dst = tl.sum(tl.where(sel, offsets, 0), 0) + n
                real = n < len_r
                _copy_value_tile(
                    VALS,
                    PK_VALS,
                    src_row,
                    n,
                    real,
                    dst,
                    real,
                    stride_vb,
                    stride_vn,
                    stride_vd,
                    D,
                    pad_bits,
                    BLOCK_D,
                    HAS_D,
                )
                if HAS_POS:
                    pos = tl.load(POS + src_row * stride_pb + n * stride_pn, mask=real, other=0)
                else:
                    pos = n
                tl.store(PK_POS + dst, pos, mask=real)
                tl.store(PK_SEQ + dst, r.to(tl.int32) + tl.zeros([BLOCK_N], dtype=tl.int32), mask=real)
                tl.store(PK_SRC + dst, src_row * N + n, mask=real)
            else:
                t = total + (item - n_real_items).to(tl.int64) * BLOCK_N + offs
                pad = t < bucket
                never = t < 0
                _copy_value_tile(
                    VALS,
                    PK_VALS,
                    0,
                    t,
                    never,
                    t,
                    pad,
                    stride_vb,
                    stride_vn,
                    stride_vd,
                    D,
                    pad_bits,
                    BLOCK_D,
                    HAS_D,
                )
                tl.store(PK_POS + t, tl.zeros([BLOCK_N], dtype=tl.int64), mask=pad)
                tl.store(PK_SEQ + t, tl.full([BLOCK_N], -1, dtype=tl.int32), mask=pad)
                tl.store(PK_SRC + t, tl.full([BLOCK_N], -1, dtype=tl.int64), mask=pad)


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as a signed integer tensor of the same element size (exact copies for any dtype)."""
    return t if not t.is_floating_point() else t.view(_INT_CONTAINER[t.element_size()])


def _pad_bits(pad_value: int | float, dtype: torch.dtype) -> int:
    """The bit pattern of ``pad_value`` in ``dtype``, as the signed int the kernel's container holds."""
    if not torch.empty((), dtype=dtype).is_floating_point():
        return int(pad_value)
    return int(
        torch.tensor(pad_value, dtype=dtype).view(_INT_CONTAINER[torch.empty((), dtype=dtype).element_size()])
    )


def _slice_repack_triton(
    values,
    keep_len,
    positions,
    row_ids,
    micro,
    packed,
    batchb,
    *,
    tau_pad,
    eager_max_bucket,
    pad_value,
    out,
    route=None,
    block_n=None,
    num_programs=None,
):
    """Launch the kernel (inputs validated, buffers allocated). ``block_n``/``num_programs`` are for tests."""
    forced = route is not None
    r = route if forced else (0, 0, 0, 0, 0, 0)
    batch, seq_len = values.shape[0], values.shape[1]
    has_d = values.dim() == 3
    hidden = values.shape[2] if has_d else 1
    group = row_ids.numel() if row_ids is not None else batch
    vals = _int_view(values)
    if block_n is None:
        if _dispatch.interpreting():
            block_n = 8
        else:
            block_n = 32 if has_d else 256
    block_d = 1
    if has_d:
        block_d = min(triton.next_power_of_2(hidden), 16 if _dispatch.interpreting() else 256)
    row_blocks = triton.cdiv(seq_len, block_n) if seq_len else 0
    max_items = max(
        group * row_blocks + triton.cdiv(out.packed_cap, block_n),
        out.batch_cap * triton.cdiv(out.bucket_cap, block_n),
        1,
    )
    if num_programs is None:
        num_programs = min(max_items, 4 if _dispatch.interpreting() else 1024)
    stride_vd = vals.stride(2) if has_d else 0
    pos = positions if positions is not None else keep_len
    counts = [t.numel() for t in (micro, packed, batchb)]
    # an empty table still needs a valid pointer; its count (0) keeps every load masked
    micro, packed, batchb = (t if t.numel() else keep_len for t in (micro, packed, batchb))
    _slice_repack_kernel[(num_programs,)](
        vals,
        pos,
        keep_len,
        row_ids if row_ids is not None else keep_len,
        micro,
        packed,
        batchb,
        _int_view(out.padded_values),
        out.padded_positions,
        out.padded_mask.view(torch.int8),
        out.padded_src_index,
        _int_view(out.packed_values),
        out.packed_positions,
        out.packed_seq_index,
        out.packed_src_index,
        out.cu_seqlens,
        out.control,
        vals.stride(0),
        vals.stride(1),
        stride_vd,
        pos.stride(0) if positions is not None else 0,
        pos.stride(1) if positions is not None else 0,
        batch,
        seq_len,
        hidden,
        group,
        counts[0],
        counts[1],
        counts[2],
        float(tau_pad),
        int(eager_max_bucket),
        _pad_bits(pad_value, values.dtype),
        out.batch_cap,
        out.bucket_cap,
        out.packed_cap,
        out.cu_seqlens.numel(),
        int(r[0]),  # path
        int(r[1]),  # bucket
        int(r[2]),  # T
        int(r[3]),  # Lmax
        int(r[5]),  # batch rows
        GB=max(2, triton.next_power_of_2(group)),
        MB=max(2, triton.next_power_of_2(counts[0])),
        PB=max(2, triton.next_power_of_2(counts[1])),
        BB=max(2, triton.next_power_of_2(counts[2])),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        HAS_D=has_d,
        HAS_POS=positions is not None,
        HAS_ROW_IDS=row_ids is not None,
        FORCED=forced,
    )


def slice_repack_reference(
    values: torch.Tensor,
    keep_len: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    row_ids: torch.Tensor | None = None,
    micro_buckets: torch.Tensor | Sequence[int],
    packed_buckets: torch.Tensor | Sequence[int],
    batch_buckets: torch.Tensor | Sequence[int],
    tau_pad: float = 0.2,
    eager_max_bucket: int = 4,
    pad_value: int | float = 0,
    out: SliceRepackOutput,
    route: ControlValues | None = None,
) -> ControlValues:
    """Torch reference: fills ``out`` exactly as the kernel does and returns the control values.

    Takes validated inputs and allocated buffers (the public :func:`slice_repack` does both).
    Reads ``keep_len``, ``row_ids`` and the tables on the host (a sync on CUDA): this is the
    spec and the CPU fallback. Out-of-range input is not raised here but flagged in the control
    word, with nothing else written, exactly like the kernel; so is a ``route`` that does not
    hold the group (``ERR_ROUTE``).
    """
    batch, seq_len = values.shape[0], values.shape[1]
    lens_all = keep_len.tolist()
    rows = list(range(batch)) if row_ids is None else [int(r) for r in row_ids.tolist()]
    error = 0
    lens = []
    for r in rows:
        if 0 <= r < batch:
            lens.append(int(lens_all[r]))
        else:
            error |= ERR_ROW_IDS
            lens.append(0)
    if any(n < 0 or n > seq_len for n in lens):
        error |= ERR_KEEP_LEN
    tables = [
        t.tolist() if isinstance(t, torch.Tensor) else list(t)
        for t in (micro_buckets, packed_buckets, batch_buckets)
    ]
    total, max_len = sum(lens), max(lens, default=0)
    if route is None:
        decision = _decide(lens, *tables, tau_pad, eager_max_bucket)
    else:
        decision = ControlValues(route.path, route.bucket, total, max_len, 0, route.batch_rows)
        problem = route_problem(
            route.path,
            route.bucket,
            route.batch_rows,
            group=len(rows),
            total=total,
            max_len=max_len,
            micro_buckets=tables[0],
            packed_buckets=tables[1],
            batch_buckets=tables[2],
        )
        if problem is not None or (route.total, route.max_len) != (total, max_len):
            error |= ERR_ROUTE
    path, bucket, total, max_len, _, batch_rows = decision
    if path == PATH_STATIC and (batch_rows > out.batch_cap or bucket > out.bucket_cap):
        error |= ERR_CAPACITY
    if path in (PATH_VARLEN, PATH_EAGER) and bucket > out.packed_cap:
        error |= ERR_CAPACITY
    if error:
        result = ControlValues(PATH_ERROR, 0, total, max_len, error, 0)
        out.control.copy_(torch.tensor(result, dtype=torch.int32))
        return result
    result = decision
    out.control.copy_(torch.tensor(result, dtype=torch.int32))
    device = values.device
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    cu = out.cu_seqlens
    cu[: len(offsets)] = torch.tensor(offsets, dtype=torch.int32, device=device)
    cu[len(offsets) :] = total

    def row_positions(src: int, n: int) -> torch.Tensor:
        if positions is None:
            return torch.arange(n, dtype=torch.int64, device=device)
        return positions[src, :n]

    if path == PATH_STATIC:
        region = (slice(0, batch_rows), slice(0, bucket))
        out.padded_values[region] = pad_value
        out.padded_positions[region] = 0
        out.padded_mask[region] = False
        out.padded_src_index[region] = -1
        for r, (src, n) in enumerate(zip(rows, lens)):
            out.padded_values[r, :n] = values[src, :n]
            out.padded_positions[r, :n] = row_positions(src, n)
            out.padded_mask[r, :n] = True
            out.padded_src_index[r, :n] = src * seq_len + torch.arange(n, dtype=torch.int64, device=device)
    elif path in (PATH_VARLEN, PATH_EAGER):
        for r, (src, n) in enumerate(zip(rows, lens)):
            start = offsets[r]
            out.packed_values[start : start + n] = values[src, :n]
            out.packed_positions[start : start + n] = row_positions(src, n)
            out.packed_seq_index[start : start + n] = r
            out.packed_src_index[start : start + n] = src * seq_len + torch.arange(
                n, dtype=torch.int64, device=device
            )
        out.packed_values[total:bucket] = pad_value
        out.packed_positions[total:bucket] = 0
        out.packed_seq_index[total:bucket] = -1
        out.packed_src_index[total:bucket] = -1
    return result


def _slice_repack_impl(
    values, keep_len, positions, row_ids, micro_buckets, packed_buckets, batch_buckets, tau_pad, eager_max_bucket,
    pad_value, route, *buffers,
) -> None:  # fmt: skip
    out = SliceRepackOutput(*buffers)
    route = ControlValues(*route) if route is not None else None
    options = dict(tau_pad=tau_pad, eager_max_bucket=eager_max_bucket, pad_value=pad_value, out=out, route=route)
    tables = (micro_buckets, packed_buckets, batch_buckets)
    if _dispatch.use_triton(values):
        _slice_repack_triton(values, keep_len, positions, row_ids, *tables, **options)
    else:
        slice_repack_reference(
            values, keep_len, positions=positions, row_ids=row_ids, micro_buckets=micro_buckets,
            packed_buckets=packed_buckets, batch_buckets=batch_buckets, **options,
        )  # fmt: skip


# the registered op (seer_kernels._dispatch): validated arguments; it writes the control word and
# the buffers of SliceRepackOutput (BUFFER_FIELDS, in that order)
_slice_repack_op = _dispatch.define_op(
    "slice_repack(Tensor values, Tensor keep_len, Tensor? positions, Tensor? row_ids, Tensor micro_buckets, "
    "Tensor packed_buckets, Tensor batch_buckets, float tau_pad, int eager_max_bucket, Scalar pad_value, "
    "int[]? route, "
    + ", ".join(f"Tensor({chr(ord('a') + i)}!) {name}" for i, name in enumerate(BUFFER_FIELDS))
    + ") -> ()",
    _slice_repack_impl,
    lambda *args: None,
)


# device tensors for host tables given as sequences, so repeated calls upload nothing
_TABLE_CACHE: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}


def _table(name: str, table: object, device: torch.device) -> tuple[torch.Tensor, list[int] | None]:
    """(device int tensor, host list or None when the table lives on a GPU), validated when host-visible."""
    if isinstance(table, torch.Tensor):
        _dispatch.check_tensor(name, table, dtypes=(torch.int32, torch.int64), dim=1)
        if table.device != device:
            raise ValueError(f"{name} must be on {device} like values, got {table.device}")
        if not table.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        host = table.tolist() if _dispatch.host_path(table) else None
        tensor = table
    elif isinstance(table, Sequence) and not isinstance(table, str):
        host = list(table)
        if any(isinstance(x, bool) or not isinstance(x, int) for x in host):
            raise TypeError(f"{name} must hold ints, got {table!r}")
        key = (tuple(host), str(device))
        tensor = _TABLE_CACHE.get(key)
        if tensor is None:
            tensor = torch.tensor(host, dtype=torch.int32, device=device)
            _TABLE_CACHE[key] = tensor
    else:
        raise TypeError(f"{name} must be a 1-D int tensor or a sequence of ints, got {type(table).__name__}")
    if host is not None:
        if any(x <= 0 for x in host):
            raise ValueError(f"{name} entries must be positive, got {host}")
        if any(a >= b for a, b in zip(host[:-1], host[1:])):
            raise ValueError(f"{name} must be sorted strictly ascending, got {host}")
        if host and host[-1] >= 2**31:
            raise ValueError(f"{name} entries must fit int32, got {host[-1]}")
    return tensor, host


def _check_out(out: SliceRepackOutput, values: torch.Tensor, group: int) -> None:
    if not isinstance(out, SliceRepackOutput):
        raise TypeError(
            f"out must be a SliceRepackOutput (see slice_repack_buffers), got {type(out).__name__}"
        )
    tail = tuple(values.shape[2:])
    batch_cap, bucket_cap = out.padded_positions.shape[:2] if out.padded_positions.dim() == 2 else (-1, -1)
    packed_cap = out.packed_positions.shape[0] if out.packed_positions.dim() == 1 else -1
    expected = {
        "control": ((CONTROL_SIZE,), torch.int32),
        "padded_values": ((batch_cap, bucket_cap, *tail), values.dtype),
        "padded_positions": ((batch_cap, bucket_cap), torch.int64),
        "padded_mask": ((batch_cap, bucket_cap), torch.bool),
        "padded_src_index": ((batch_cap, bucket_cap), torch.int64),
        "packed_values": ((packed_cap, *tail), values.dtype),
        "packed_positions": ((packed_cap,), torch.int64),
        "packed_seq_index": ((packed_cap,), torch.int32),
        "packed_src_index": ((packed_cap,), torch.int64),
    }
    if batch_cap < 0:
        raise ValueError(
            "out.padded_positions must be 2-D [batch_cap, bucket_cap], "
            f"got {tuple(out.padded_positions.shape)}"
        )
    if packed_cap < 0:
        raise ValueError(
            f"out.packed_positions must be 1-D [packed_cap], got {tuple(out.packed_positions.shape)}"
        )
    for name, (shape, dtype) in expected.items():
        t = getattr(out, name)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"out.{name} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(
                f"out.{name} must be {str(dtype).replace('torch.', '')} {shape}, "
                f"got {str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"
            )
        if not t.is_contiguous():
            raise ValueError(f"out.{name} must be contiguous")
        if t.device != values.device:
            raise ValueError(f"out.{name} must be on {values.device} like values, got {t.device}")
    cu = out.cu_seqlens
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or not cu.is_contiguous():
        raise ValueError("out.cu_seqlens must be a contiguous 1-D int32 tensor")
    if cu.device != values.device:
        raise ValueError(f"out.cu_seqlens must be on {values.device} like values, got {cu.device}")
    if cu.numel() < group + 1:
        raise ValueError(f"out.cu_seqlens holds {cu.numel()} entries, the group needs G + 1 = {group + 1}")
    if packed_cap < group * values.shape[1]:
        raise ValueError(
            f"out.packed_* hold {packed_cap} tokens; the EAGER path may pack up to G * N = "
            f"{group * values.shape[1]}"
        )


def _check_route(
    route: object,
    group: int,
    seq_len: int,
    micro: list[int] | None,
    packed: list[int] | None,
    batch: list[int] | None,
) -> None:
    """Host checks of a forced route that need no device read (tables None: on a GPU, unchecked)."""
    if not isinstance(route, ControlValues):
        raise TypeError(f"route must be a ControlValues (see slice_repack_decision), got {type(route).__name__}")
    if any(isinstance(x, bool) or not isinstance(x, int) for x in route):
        raise TypeError(f"route must hold ints, got {route!r}")
    if route.error != 0:
        raise ValueError(f"route must have error = 0 (a decision, not a flagged control word), got {route!r}")
    total, max_len = route.total, route.max_len
    if not (0 <= max_len <= seq_len and max_len <= total <= group * max_len):
        raise ValueError(
            f"route's T = {total} and Lmax = {max_len} are not those of {group} rows of at most N = {seq_len}"
        )
    problem = route_problem(
        route.path,
        route.bucket,
        route.batch_rows,
        group=group,
        total=total,
        max_len=max_len,
        micro_buckets=micro,
        packed_buckets=packed,
        batch_buckets=batch,
    )
    if problem is not None:
        raise ValueError(f"route {tuple(route)} is not a layout for this group: {problem}")


def slice_repack(
    values: torch.Tensor,
    keep_len: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    row_ids: torch.Tensor | None = None,
    micro_buckets: torch.Tensor | Sequence[int],
    packed_buckets: torch.Tensor | Sequence[int],
    batch_buckets: torch.Tensor | Sequence[int],
    tau_pad: float = 0.2,
    eager_max_bucket: int = 4,
    pad_value: int | float = 0,
    control_host: torch.Tensor | None = None,
    out: SliceRepackOutput | None = None,
    check: bool | None = None,
    route: ControlValues | None = None,
) -> SliceRepackOutput:
    """Cut each row of a group to its ``L*``, route the group and write it in the chosen layout.

    Args:
        values: ``[B, N]`` int64/int32 token ids, or ``[B, N, D]`` fp32/fp16/bf16 hidden states.
            Copied bit for bit.
        keep_len: ``[B]`` int32/int64 on ``values``' device, ``0 <= L* <= N`` (``L*_b`` leading
            positions of row ``b`` are kept).
        positions: optional ``[B, N]`` int64 position ids (default ``arange(N)`` in every row).
        row_ids: optional ``[G]`` int32/int64 device tensor selecting the group's rows, in order,
            ``G <= 1024`` (default: all ``B`` rows, which then must be ``<= 1024``). Repeats allowed.
        micro_buckets, packed_buckets, batch_buckets: the router's sorted tables, each either a
            sequence of ints (uploaded once per device and cached) or a 1-D int32/int64 tensor on
            ``values``' device. Tensor tables off the host path (on a GPU, or under
            ``emulate_device()``) are not validated (that would sync) and then ``out=`` is
            required, since their maxima size the buffers.
        tau_pad: PWR threshold; eager_max_bucket: groups whose ``B_G`` is at most this run eager.
        pad_value: the value written into padding slots of ``values`` (a token id, or a float
            for hidden states). Padding positions are 0, mask False, seq/src index -1.
        control_host: optional pinned CPU int32 ``[CONTROL_SIZE]`` tensor; on CUDA a non-blocking
            copy of the control word into it is enqueued after the kernel, with an event (also
            non-blocking under ``emulate_device()``).
        out: optional preallocated buffers (:func:`slice_repack_buffers`); graph-captured callers
            pass persistent ones. Default: allocated for this group from the host tables.
        check: validate ``keep_len`` and ``row_ids`` ranges on the host and raise ``ValueError``.
            Default ``None`` checks on the host path (CPU tensors in eager mode, outside
            ``emulate_device()``); on CUDA ``True`` costs a sync.
            Unchecked bad input is never clamped: the kernel flags it in the control word's
            ``error`` entry (``ERR_*`` bits), sets the path to ``PATH_ERROR`` and writes nothing else.
        route: the layout already decided on the host (normally ``slice_repack_decision`` of the
            host lengths and the same tables): ``(path, bucket, batch_rows)`` is written as given
            and reported in the control word; ``total``/``max_len`` are the ``T``/``Lmax`` it was
            decided for, ``error`` is 0. What the host can check without a sync raises
            ``ValueError`` naming ``route`` (path code, ranges, host tables, ``out``'s capacity,
            and with ``check`` ``T``/``Lmax``); the kernel flags the rest as ``ERR_ROUTE`` (``T``
            or ``Lmax`` differ, a bucket or batch rows that do not hold the group or are not in
            their table; see ``slice_repack_control.route_problem``).

    Returns:
        :class:`SliceRepackOutput`: the buffers (``out``'s own tensors when given) and the control
        handle (``.ready()`` / ``.read()``). The control word (int32 ``[6]``) is
        ``(path, bucket, T, Lmax, error, batch_rows)`` with ``bucket = B_G`` (STATIC), ``P``
        (VARLEN), ``T`` (EAGER), 0 (EMPTY); ``batch_rows`` is the batch bucket for STATIC, else G.

    What is written: the control word and ``cu_seqlens`` always (unless an error); STATIC writes
    the padded layout's region ``[:batch_rows, :B_G]`` (rows ``>= G`` are all padding), VARLEN
    the packed layout's ``[:P]``, EAGER the packed ``[:T]``, EMPTY neither. Everything outside
    the written region (the other layout, slots beyond the bucket) keeps what it held; freshly
    allocated buffers are uninitialised there.
    """
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if values.dim() == 2:
        _dispatch.check_tensor("values", values, dtypes=_ID_DTYPES)
    elif values.dim() == 3:
        _dispatch.check_tensor("values", values, dtypes=_HIDDEN_DTYPES)
    else:
        raise ValueError(
            f"values must be [B, N] token ids or [B, N, D] hidden states, got shape {tuple(values.shape)}"
        )
    batch, seq_len = values.shape[0], values.shape[1]
    device = values.device
    _dispatch.check_tensor("keep_len", keep_len, dtypes=(torch.int32, torch.int64), dim=1)
    if keep_len.shape[0] != batch:
        raise ValueError(f"keep_len must be [B] = [{batch}], got {tuple(keep_len.shape)}")
    if not keep_len.is_contiguous():
        raise ValueError("keep_len must be contiguous")
    if positions is not None:
        _dispatch.check_tensor("positions", positions, dtypes=(torch.int64,), dim=2)
        if tuple(positions.shape) != (batch, seq_len):
            raise ValueError(f"positions must be [B, N] = [{batch}, {seq_len}], got {tuple(positions.shape)}")
    if row_ids is not None:
        _dispatch.check_tensor("row_ids", row_ids, dtypes=(torch.int32, torch.int64), dim=1)
        if not row_ids.is_contiguous():
            raise ValueError("row_ids must be contiguous")
    group = row_ids.numel() if row_ids is not None else batch
    if group > MAX_GROUP:
        raise ValueError(
            f"a group holds at most {MAX_GROUP} rows, got {group} "
            f"({'row_ids' if row_ids is not None else 'values rows'})"
        )
    _dispatch.check_same_device(values=values, keep_len=keep_len, positions=positions, row_ids=row_ids)
    if isinstance(tau_pad, bool) or not isinstance(tau_pad, (int, float)) or not math.isfinite(tau_pad):
        raise TypeError(f"tau_pad must be a finite float, got {tau_pad!r}")
    if not 0 <= tau_pad <= 1:  # a padding-waste ratio lies in [0, 1]
        raise ValueError(f"tau_pad must lie in [0, 1], got {tau_pad!r}")
    if isinstance(eager_max_bucket, bool) or not isinstance(eager_max_bucket, int) or eager_max_bucket < 0:
        raise ValueError(f"eager_max_bucket must be an int >= 0, got {eager_max_bucket!r}")
    if values.is_floating_point():
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
            raise TypeError(f"pad_value must be a number, got {type(pad_value).__name__}")
    elif isinstance(pad_value, bool) or not isinstance(pad_value, int):
        raise TypeError(f"pad_value must be an int for token ids, got {type(pad_value).__name__}")
    elif not -(2 ** (8 * values.element_size() - 1)) <= pad_value < 2 ** (8 * values.element_size() - 1):
        raise ValueError(f"pad_value {pad_value} does not fit {values.dtype}")
    micro, micro_host = _table("micro_buckets", micro_buckets, device)
    packed, packed_host = _table("packed_buckets", packed_buckets, device)
    batchb, batch_host = _table("batch_buckets", batch_buckets, device)
    if control_host is not None:
        _dispatch.check_tensor("control_host", control_host, dtypes=(torch.int32,), dim=1)
        if control_host.numel() != CONTROL_SIZE or control_host.device.type != "cpu":
            raise ValueError(
                f"control_host must be a CPU int32 tensor of {CONTROL_SIZE}, "
                f"got {tuple(control_host.shape)} on {control_host.device}"
            )
        if device.type == "cuda" and not control_host.is_pinned():
            raise ValueError(
                "control_host must be pinned (torch.empty(..., pin_memory=True)) for a non-blocking copy"
            )

    if route is not None:
        _check_route(route, group, seq_len, micro_host, packed_host, batch_host)

    if check is None:
        check = _dispatch.host_path(keep_len)
    if check:
        lens = keep_len.tolist()
        rows = list(range(batch)) if row_ids is None else row_ids.tolist()
        bad_rows = [r for r in rows if not 0 <= r < batch]
        if bad_rows:
            raise ValueError(f"row_ids must lie in [0, {batch}), got {bad_rows[:8]}")
        bad = [(r, lens[r]) for r in rows if not 0 <= lens[r] <= seq_len]
        if bad:
            raise ValueError(f"keep_len must lie in [0, N = {seq_len}], got (row, L*) {bad[:8]}")
        group_lens = [lens[r] for r in rows]
        if route is not None and (route.total, route.max_len) != (sum(group_lens), max(group_lens, default=0)):
            raise ValueError(
                f"route was decided for T = {route.total}, Lmax = {route.max_len}, but the group has "
                f"T = {sum(group_lens)}, Lmax = {max(group_lens, default=0)}"
            )

    if out is None:
        if None in (micro_host, packed_host, batch_host):
            raise ValueError(
                "pass out= (see slice_repack_buffers) when the bucket tables are GPU tensors: "
                "their maxima size the buffers and cannot be read without a host sync"
            )
        most = group * seq_len
        packed_fit = [p for p in packed_host if p >= most]
        batch_fit = [b for b in batch_host if b >= group]
        # a forced route may pick a larger batch bucket or packed bucket than the rule would
        forced_rows = route.batch_rows if route is not None and route.path == PATH_STATIC else 0
        forced_packed = route.bucket if route is not None and route.path == PATH_VARLEN else 0
        out = slice_repack_buffers(
            batch_cap=max(min(batch_fit) if batch_fit else 0, forced_rows),
            bucket_cap=max(micro_host, default=0),
            packed_cap=max(most, min(packed_fit) if packed_fit else max(packed_host, default=0), forced_packed),
            cu_len=group + 1,
            dtype=values.dtype,
            device=device,
            hidden_dim=values.shape[2] if values.dim() == 3 else None,
        )
    else:
        _check_out(out, values, group)
    if route is not None:
        if route.path == PATH_STATIC and (route.batch_rows > out.batch_cap or route.bucket > out.bucket_cap):
            raise ValueError(
                f"route STATIC [{route.batch_rows}, {route.bucket}] does not fit out's padded buffers "
                f"[{out.batch_cap}, {out.bucket_cap}]"
            )
        if route.path in (PATH_VARLEN, PATH_EAGER) and route.bucket > out.packed_cap:
            raise ValueError(f"route's bucket {route.bucket} does not fit out's {out.packed_cap} packed slots")

    _slice_repack_op(
        values, keep_len, positions, row_ids, micro, packed, batchb, float(tau_pad), eager_max_bucket, pad_value,
        None if route is None else list(route), *(getattr(out, f) for f in BUFFER_FIELDS),
    )  # fmt: skip
    if control_host is not None:
        # on the device path (a GPU, or emulated) the copy is enqueued without waiting
        control_host.copy_(out.control, non_blocking=not _dispatch.host_path(values))
    event = None
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record()
    handle = ControlWord(out.control, control_host, event)
    return SliceRepackOutput(*(getattr(out, f) for f in BUFFER_FIELDS), handle=handle)
