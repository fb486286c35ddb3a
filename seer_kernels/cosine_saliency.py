"""DyLLM saliency: temporal cosine similarity of attention contexts, compacted to a row list.

A row (token) is *salient* at a layer when the cosine similarity between its attention
context now and at the previous step drops below ``tau`` (strict ``<``). The salient rows
are written, in ascending order, into a fixed-capacity int32 buffer with a device-side
count, so the whole op is CUDA-graph capturable (no host sync, no data-dependent shapes).

Two kernels: a row-parallel kernel writes the fp32 similarity of every row; a single-program
kernel then walks the rows block by block and compacts the salient ones with ``tl.cumsum``.
The compaction is sequential on purpose: it is deterministic, needs no cross-program
spin-wait (the Triton interpreter runs programs one after another), and touches only
4 bytes per row, so one program keeps up with the similarity pass.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _dispatch

# Value left in the index buffer after the ``count`` valid entries.
INDEX_PAD = -1

_SIM_CONFIGS = _dispatch.single_config_when_interpreting(
    [
        # first entry: the one the interpreter uses (small, so tests cross block edges)
        triton.Config({"BLOCK_M": 8, "BLOCK_D": 64}, num_warps=4),
        triton.Config({"BLOCK_M": 2, "BLOCK_D": 512}, num_warps=4),
        triton.Config({"BLOCK_M": 2, "BLOCK_D": 1024}, num_warps=4),
        triton.Config({"BLOCK_M": 4, "BLOCK_D": 512}, num_warps=4),
        triton.Config({"BLOCK_M": 4, "BLOCK_D": 1024}, num_warps=8),
        triton.Config({"BLOCK_M": 8, "BLOCK_D": 512}, num_warps=8),
    ]
)


@triton.autotune(configs=_SIM_CONFIGS, key=["D"])
@triton.jit(do_not_specialize=["N", "n_rows_val"])
def _cosine_similarity_kernel(
    a_ptr,
    b_ptr,
    sim_ptr,
    n_rows_ptr,
    n_rows_val,
    N,
    D,
    stride_am,
    stride_ad,
    stride_bm,
    stride_bd,
    HAS_N_ROWS_PTR: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    if HAS_N_ROWS_PTR:
        n_lim = tl.load(n_rows_ptr).to(tl.int64)
    else:
        n_lim = n_rows_val.to(tl.int64)
    n_lim = tl.minimum(tl.maximum(n_lim, 0), N)

    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    live = rows < n_lim
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    acc_ab = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    acc_aa = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    acc_bb = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = live[:, None] & (c < D)[None, :]
        # upcast before any arithmetic: bf16 math is wrong in the interpreter and lossy anyway
        a = tl.load(a_ptr + rows[:, None] * stride_am + c[None, :] * stride_ad, mask=m, other=0.0).to(
            tl.float32
        )
        b = tl.load(b_ptr + rows[:, None] * stride_bm + c[None, :] * stride_bd, mask=m, other=0.0).to(
            tl.float32
        )
        acc_ab += a * b
        acc_aa += a * a
        acc_bb += b * b
    dot = tl.sum(acc_ab, axis=1)
    naa = tl.sum(acc_aa, axis=1)
    nbb = tl.sum(acc_bb, axis=1)
    denom = tl.sqrt(naa) * tl.sqrt(nbb)
    both_zero = (naa == 0.0) & (nbb == 0.0)
    safe = tl.where(denom > 0.0, denom, 1.0)
    sim = tl.where(denom > 0.0, dot / safe, tl.where(both_zero, 1.0, 0.0))
    # clamp rounding overshoot into [-1, 1]
    sim = tl.minimum(tl.maximum(sim, -1.0), 1.0)
    # a NaN/inf element (or a squared norm overflowing fp32) makes the row NaN: always salient
    finite = (naa < float("inf")) & (nbb < float("inf"))
    sim = tl.where(finite, sim, float("nan"))
    sim = tl.where(live, sim, 1.0)
    tl.store(sim_ptr + rows, sim, mask=rows < N)


@triton.jit(do_not_specialize=["N", "capacity", "n_rows_val", "tau"])
def _compact_salient_kernel(
    sim_ptr,
    index_ptr,
    count_ptr,
    salient_ptr,
    n_rows_ptr,
    n_rows_val,
    N,
    capacity,
    tau,
    HAS_N_ROWS_PTR: tl.constexpr,
    HAS_SALIENT: tl.constexpr,
    PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    if HAS_N_ROWS_PTR:
        n_lim = tl.load(n_rows_ptr).to(tl.int32)
    else:
        n_lim = n_rows_val.to(tl.int32)
    n_lim = tl.minimum(tl.maximum(n_lim, 0), N)

    offs = tl.arange(0, BLOCK)
    total = tl.zeros((), dtype=tl.int32)
    for start in range(0, n_lim, BLOCK):
        rows = start + offs
        live = rows < n_lim
        s = tl.load(sim_ptr + rows, mask=live, other=1.0)
        # NaN (from inf/NaN input) never satisfies s >= tau: recomputing is always safe
        flag = live & ((s < tau) | (s != s))
        f = flag.to(tl.int32)
        pos = total + tl.cumsum(f, axis=0) - 1
        tl.store(index_ptr + pos, rows, mask=flag)
        if HAS_SALIENT:
            tl.store(salient_ptr + rows, flag, mask=live)
        total += tl.sum(f, axis=0)
    tl.store(count_ptr, total)
    if HAS_SALIENT:  # the rows past n_rows: never salient
        for start in range(n_lim, N, BLOCK):
            rows = start + offs
            tl.store(salient_ptr + rows, tl.zeros((BLOCK,), tl.int1), mask=rows < N)
    for start in range(0, capacity, BLOCK):
        slots = start + offs
        tl.store(
            index_ptr + slots, tl.full((BLOCK,), PAD, tl.int32), mask=(slots >= total) & (slots < capacity)
        )


def _cosine_saliency_triton(
    a: torch.Tensor,
    b: torch.Tensor,
    tau: float,
    n_rows: int | torch.Tensor,
    index: torch.Tensor,
    count: torch.Tensor,
    similarity: torch.Tensor,
    index_pad: int,
    salient: torch.Tensor | None,
) -> None:
    N, D = a.shape
    has_ptr = isinstance(n_rows, torch.Tensor)
    n_rows_ptr = n_rows if has_ptr else count  # dummy pointer, never read when HAS_N_ROWS_PTR=False
    n_rows_val = 0 if has_ptr else int(n_rows)
    if N > 0:
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_M"]),)
        _cosine_similarity_kernel[grid](
            a,
            b,
            similarity,
            n_rows_ptr,
            n_rows_val,
            N,
            D,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            HAS_N_ROWS_PTR=has_ptr,
        )
    block = 16 if _dispatch.interpreting() else 1024
    _compact_salient_kernel[(1,)](
        similarity,
        index,
        count,
        salient if salient is not None else count,  # dummy pointer, never written without HAS_SALIENT
        n_rows_ptr,
        n_rows_val,
        N,
        index.shape[0],
        float(tau),
        HAS_N_ROWS_PTR=has_ptr,
        HAS_SALIENT=salient is not None,
        PAD=index_pad,
        BLOCK=block,
        num_warps=4,
    )


def cosine_saliency_reference(
    ctx: torch.Tensor,
    ctx_cache: torch.Tensor,
    tau: float,
    *,
    n_rows: int | torch.Tensor | None = None,
    capacity: int | None = None,
    index_pad: int = INDEX_PAD,
    out_index: torch.Tensor | None = None,
    out_count: torch.Tensor | None = None,
    out_similarity: torch.Tensor | None = None,
    out_salient: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`cosine_saliency` (same semantics; no host sync, graph-safe).

    Returns ``(index int32 [capacity], count int32 [1], similarity fp32 [N])``, freshly allocated
    or, with ``out_index``/``out_count``/``out_similarity``, written into those buffers (as the
    kernel writes the op's; ``capacity`` is then ``out_index``'s), ``capacity`` defaulting to
    ``N``; slots past the count hold ``index_pad``. ``out_salient`` (bool ``[N]``) receives each
    row's salient flag (True exactly for the rows ``index[:count]`` names).
    """
    N = ctx.shape[0]
    D = math.prod(ctx.shape[1:])
    a = ctx.reshape(N, D).float()
    b = ctx_cache.reshape(N, D).float()
    capacity = out_index.shape[0] if out_index is not None else (N if capacity is None else capacity)
    dot = (a * b).sum(dim=1)
    naa = (a * a).sum(dim=1)
    nbb = (b * b).sum(dim=1)
    denom = naa.sqrt() * nbb.sqrt()
    one = torch.ones((), dtype=torch.float32, device=a.device)
    zero = torch.zeros((), dtype=torch.float32, device=a.device)
    sim = torch.where(denom > 0, dot / denom, torch.where((naa == 0) & (nbb == 0), one, zero))
    sim = sim.clamp(-1.0, 1.0)
    nan = torch.full((), float("nan"), dtype=torch.float32, device=a.device)
    sim = torch.where(naa.isfinite() & nbb.isfinite(), sim, nan)
    rows = torch.arange(N, device=a.device)
    if n_rows is None:
        live = torch.ones(N, dtype=torch.bool, device=a.device)
    elif isinstance(n_rows, torch.Tensor):
        live = rows < n_rows.reshape(()).to(rows.dtype).clamp(0, N)
    else:
        live = rows < min(max(int(n_rows), 0), N)
    if out_index is not None and (out_count is None or out_similarity is None):
        raise ValueError("out_index, out_count and out_similarity must be given together")
    # with the op's buffers every result is written in place (as the kernel writes them), no copies
    sim = torch.where(live, sim, one, out=out_similarity)
    flag = torch.logical_and(live, (sim < tau) | sim.isnan(), out=out_salient)
    # the j-th salient row is the first whose running count of salient rows reaches j + 1
    running = torch.cumsum(flag, dim=0, dtype=torch.int32)
    slots = torch.arange(1, capacity + 1, dtype=torch.int32, device=a.device)
    count = torch.sum(flag, dim=0, keepdim=True, dtype=torch.int32,
                      out=None if out_count is None else out_count.view(1))
    first = torch.searchsorted(running, slots, out_int32=True, out=out_index)
    pad = torch.full((), index_pad, dtype=torch.int32, device=a.device)
    index = torch.where(slots <= count, first, pad, out=out_index)
    return (index, out_count, sim) if out_count is not None else (index, count, sim)


def _cosine_saliency_impl(ctx, ctx_cache, tau, n_rows, n_rows_int, index_pad, index, count, similarity,
                          salient) -> None:
    live = n_rows if n_rows is not None else n_rows_int
    if not _dispatch.use_triton(ctx):
        cosine_saliency_reference(ctx, ctx_cache, tau, n_rows=live, index_pad=index_pad, out_index=index,
                                  out_count=count, out_similarity=similarity, out_salient=salient)
        return
    N = ctx.shape[0]
    D = math.prod(ctx.shape[1:])
    _cosine_saliency_triton(ctx.reshape(N, D), ctx_cache.reshape(N, D), tau, live, index, count, similarity,
                            index_pad, salient)


# the registered op (seer_kernels._dispatch): validated arguments, the buffers allocated by the caller
_cosine_saliency_op = _dispatch.define_op(
    "cosine_saliency(Tensor ctx, Tensor ctx_cache, float tau, Tensor? n_rows, int n_rows_int, int index_pad, "
    "Tensor(a!) index, Tensor(b!) count, Tensor(c!) similarity, Tensor(d!)? salient) -> ()",
    _cosine_saliency_impl,
    lambda *args: None,
)


def _check_ctx(name: str, t: object) -> torch.Tensor:
    _dispatch.check_tensor(name, t, dtypes=(torch.float16, torch.bfloat16, torch.float32))
    if t.dim() not in (2, 3):
        raise ValueError(f"{name} must be [N, D] or [N, H, d], got shape {tuple(t.shape)}")
    return t


def _check_arguments(ctx, ctx_cache, tau, n_rows, out_index, out_count, out_similarity, out_salient,
                     index_pad) -> None:
    """:func:`cosine_saliency`'s argument checks, each error naming its argument."""
    _check_ctx("ctx", ctx)
    _check_ctx("ctx_cache", ctx_cache)
    if ctx_cache.shape != ctx.shape:
        raise ValueError(
            f"ctx_cache must have the shape of ctx {tuple(ctx.shape)}, got {tuple(ctx_cache.shape)}"
        )
    if ctx_cache.dtype != ctx.dtype:
        raise TypeError(f"ctx_cache must have the dtype of ctx ({ctx.dtype}), got {ctx_cache.dtype}")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)):
        raise TypeError(f"tau must be a real number, got {type(tau).__name__}")
    if math.isnan(tau):
        raise ValueError("tau must not be NaN")
    if isinstance(index_pad, bool) or not isinstance(index_pad, int):
        raise TypeError(f"index_pad must be an int, got {type(index_pad).__name__}")
    if not -(2**31) <= index_pad < 2**31:
        raise ValueError(f"index_pad must fit in int32, got {index_pad}")
    N = ctx.shape[0]
    max_rows = N
    if n_rows is not None:
        _dispatch.check_count("n_rows", n_rows, N, "ctx's rows", dtypes=(torch.int32,))
        if not isinstance(n_rows, torch.Tensor):
            max_rows = n_rows
    if out_index is not None:
        _dispatch.check_tensor("out_index", out_index, dtypes=(torch.int32,), dim=1)
        if out_index.shape[0] < max_rows:
            raise ValueError(f"out_index must hold at least {max_rows} entries, got {out_index.shape[0]}")
        if not out_index.is_contiguous():
            raise ValueError("out_index must be contiguous")
    if out_count is not None:
        _dispatch.check_tensor("out_count", out_count, dtypes=(torch.int32,))
        if out_count.numel() != 1:
            raise ValueError(f"out_count must have exactly one element, got shape {tuple(out_count.shape)}")
    if out_similarity is not None:
        _dispatch.check_tensor("out_similarity", out_similarity, dtypes=(torch.float32,), dim=1)
        if out_similarity.shape[0] != N or not out_similarity.is_contiguous():
            raise ValueError(
                f"out_similarity must be a contiguous fp32 [{N}], got shape {tuple(out_similarity.shape)}"
            )
    if out_salient is not None:
        _dispatch.check_tensor("out_salient", out_salient, dtypes=(torch.bool,), dim=1)
        if out_salient.shape[0] != N or not out_salient.is_contiguous():
            raise ValueError(f"out_salient must be a contiguous bool [{N}], got shape {tuple(out_salient.shape)}")
    _dispatch.check_same_device(
        ctx=ctx,
        ctx_cache=ctx_cache,
        n_rows=n_rows if isinstance(n_rows, torch.Tensor) else None,
        out_index=out_index,
        out_count=out_count,
        out_similarity=out_similarity,
        out_salient=out_salient,
    )


def cosine_saliency(
    ctx: torch.Tensor,
    ctx_cache: torch.Tensor,
    tau: float,
    *,
    n_rows: int | torch.Tensor | None = None,
    out_index: torch.Tensor | None = None,
    out_count: torch.Tensor | None = None,
    out_similarity: torch.Tensor | None = None,
    out_salient: torch.Tensor | None = None,
    index_pad: int = INDEX_PAD,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DyLLM salient rows: ``cos(ctx[i], ctx_cache[i]) < tau``, compacted ascending.

    Args:
        ctx: ``[N, D]`` (or ``[N, H, d]``, flattened to ``D = H * d``) fp16/bf16/fp32, the
            attention context of this step (all heads, before the output projection).
        ctx_cache: same shape, dtype and device: the context of the previous step.
        tau: threshold; a row is salient when its similarity is strictly below ``tau``
            (compared in fp32). ``tau > 1`` makes every considered row salient; NaN is
            rejected.
        n_rows: only rows ``< n_rows`` are considered; rows at or past it are not read,
            never salient, and get similarity ``1.0``. A Python int in ``[0, N]``, or an
            int32 ``[1]`` tensor on the device (for CUDA graphs; values outside ``[0, N]``
            act as the nearest end since a device value cannot be checked without a sync).
            Default: all ``N`` rows.
        out_index: optional int32 ``[capacity]`` buffer, ``capacity >= N`` (``>= n_rows``
            when ``n_rows`` is an int) so no salient row can be dropped.
        out_count: optional int32 ``[1]`` buffer.
        out_similarity: optional fp32 ``[N]`` buffer.
        out_salient: optional bool ``[N]`` buffer (contiguous), written with each row's salient
            flag: True exactly for the rows ``index[:count]`` names (so never for rows at or past
            ``n_rows``), in the same launch; not returned.
        index_pad: the value written into the index slots at or past the count (an int32;
            default ``INDEX_PAD``, -1). A caller that feeds the index to ``index_select`` as a
            fixed-capacity row set passes a valid row (0) so that no slot is out of range.
        check: validate the arguments (default). False skips every check, for a caller that
            builds them itself and calls in a hot loop (DyLLM's sparse layers): wrong arguments
            are then undefined behaviour.

    Returns:
        ``(index, count, similarity)``: ``index`` int32 ``[capacity]`` (``capacity = N``
        unless ``out_index`` is given) holding the salient row ids in ascending order in
        slots ``[0, count)`` and ``index_pad`` after them; ``count`` int32 ``[1]`` on
        the device; ``similarity`` fp32 ``[N]``.

    Edges: similarity is computed in fp32 over the whole row, clamped to ``[-1, 1]``. Both
    rows zero -> 1 (unchanged, not salient unless ``tau > 1``); exactly one zero -> 0
    (salient for ``tau > 0``). A NaN/inf element in either row (or a squared norm that
    overflows fp32) gives similarity NaN and the row is salient whatever ``tau``:
    recomputing is always safe.
    ``N = 0`` -> ``count = 0`` and the index all padding. The result is deterministic
    (bitwise repeatable) on every backend. No host synchronisation: CUDA-graph capturable
    (the first CUDA call per row width autotunes the similarity kernel: warm up before a
    capture).
    """
    if check:
        _check_arguments(ctx, ctx_cache, tau, n_rows, out_index, out_count, out_similarity, out_salient, index_pad)
    N = ctx.shape[0]
    device = ctx.device
    index = out_index if out_index is not None else torch.empty(N, dtype=torch.int32, device=device)
    count = out_count if out_count is not None else torch.empty(1, dtype=torch.int32, device=device)
    sim = out_similarity if out_similarity is not None else torch.empty(N, dtype=torch.float32, device=device)
    n_rows_tensor, n_rows_int = _dispatch.split_count(N if n_rows is None else n_rows)
    _cosine_saliency_op(ctx, ctx_cache, float(tau), n_rows_tensor, n_rows_int, int(index_pad), index, count, sim,
                        out_salient)
    return index, count, sim
