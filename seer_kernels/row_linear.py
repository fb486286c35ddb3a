"""A linear layer over the first ``count`` rows of a fixed-capacity buffer (DyLLM's sparse rows).

``out[:count] = x[:count] @ weight.T + bias``; rows at or past ``count`` are zero. DyLLM's sparse
steps run the K/V projections and the FFN for the live rows only: those rows arrive as a compact
``[capacity, K]`` block (the norm by index writes it) whose live count stays on the device, so
the layer computes on the live rows without the host ever learning how many there are.
:func:`row_linear_pair` runs two projections of the same rows (K and V, gate and up) in one launch.

Kernel: a tiled GEMM, one program per ``BLOCK_M x BLOCK_N`` output tile (grouped along M so that
a weight tile is reused from L2), fp32 accumulation with ``tl.dot``; the pair kernel adds a grid
axis that picks the projection (each projection's programs read their own x tiles). A tile whose
rows all lie at or past the count skips the K loop and only writes its zeros, so the work is
``ceil(count / BLOCK_M) * BLOCK_M`` rows of a full GEMM plus the zero writes of the rest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _dispatch

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_CONFIGS = _dispatch.single_config_when_interpreting(
    [
        # first entry: the one the interpreter uses; its cost is per program, so tiles as wide as a
        # tiny model's layers (the kernel tests size their shapes off these to cross tile edges)
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 2}, num_warps=4, num_stages=1),
        # Hopper-sized tiles for bf16/fp16 (fp32 ieee dots fit the smaller ones)
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=4),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=3),
    ]
)

# shared memory of one thread block on Hopper (H100 / H200: 227 KiB of an SM's 228)
_SHARED_MEMORY_PER_BLOCK = 232_448


def _fits_shared_memory(tiles_per_program: int):
    """An autotune prune keeping the configs whose pipelined x and W tiles (``num_stages`` deep,
    ``tiles_per_program`` GEMMs per program) fit a Hopper block's shared memory in the call's dtype:
    the others cannot launch there (``python -m bench.compile_kernels`` found float32 and the
    pair's 128x256 tiles over it). Keeps the first config when none fits."""

    def prune(configs, named_args, **kwargs):
        elem = named_args["x_ptr"].element_size()
        kept = [c for c in configs if c.num_stages * tiles_per_program * elem * c.kwargs["BLOCK_K"]
                * (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) <= _SHARED_MEMORY_PER_BLOCK]
        return kept or configs[:1]

    return prune


@triton.jit
def _row_linear_tile(
    x_ptr, w_ptr, b_ptr, out_ptr, count_ptr, count_val, pid, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, HAS_COUNT_PTR: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Output tile ``pid`` of ``out = x[:count] @ w.T + b`` (zero rows past the count)."""
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    # grouped order: GROUP_M consecutive row tiles walk the weight's column tiles together
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    if HAS_COUNT_PTR:
        count = tl.load(count_ptr).to(tl.int64)
    else:
        count = count_val.to(tl.int64)
    count = tl.minimum(tl.maximum(count, 0), M)

    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    live = offs_m < count
    n_ok = offs_n < N
    # a tile wholly at or past the count reads nothing: it only writes zeros
    k_end = tl.where(pid_m.to(tl.int64) * BLOCK_M < count, K, 0)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    for k0 in range(0, k_end, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        a = tl.load(x_ptrs, mask=live[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    acc = tl.where(live[:, None], acc, 0.0)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_ok[None, :])


@triton.autotune(configs=_CONFIGS, key=["M", "N", "K"], prune_configs_by={"early_config_prune": _fits_shared_memory(1)})
@triton.jit(do_not_specialize=["count_val"])
def _row_linear_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, count_ptr, count_val, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, HAS_COUNT_PTR: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    _row_linear_tile(
        x_ptr, w_ptr, b_ptr, out_ptr, count_ptr, count_val, tl.program_id(0), M, N, K,
        stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
        HAS_BIAS, HAS_COUNT_PTR, DOT_PREC, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    )  # fmt: skip


@triton.autotune(configs=_CONFIGS, key=["M", "N", "K"], prune_configs_by={"early_config_prune": _fits_shared_memory(2)})
@triton.jit(do_not_specialize=["count_val"])
def _row_linear_pair_kernel(
    x_ptr, wa_ptr, ba_ptr, outa_ptr, wb_ptr, bb_ptr, outb_ptr, count_ptr, count_val, M, N, K,
    stride_xm, stride_xk, stride_wan, stride_wak, stride_wbn, stride_wbk, stride_oam, stride_oan,
    stride_obm, stride_obn,
    HAS_BIAS_A: tl.constexpr, HAS_BIAS_B: tl.constexpr, HAS_COUNT_PTR: tl.constexpr, DOT_PREC: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    # grid axis 1 picks the projection: the two share x's rows and every tile size
    if tl.program_id(1) == 0:
        _row_linear_tile(
            x_ptr, wa_ptr, ba_ptr, outa_ptr, count_ptr, count_val, tl.program_id(0), M, N, K,
            stride_xm, stride_xk, stride_wan, stride_wak, stride_oam, stride_oan,
            HAS_BIAS_A, HAS_COUNT_PTR, DOT_PREC, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
        )  # fmt: skip
    else:
        _row_linear_tile(
            x_ptr, wb_ptr, bb_ptr, outb_ptr, count_ptr, count_val, tl.program_id(0), M, N, K,
            stride_xm, stride_xk, stride_wbn, stride_wbk, stride_obm, stride_obn,
            HAS_BIAS_B, HAS_COUNT_PTR, DOT_PREC, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
        )  # fmt: skip


def _row_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, count: int | torch.Tensor, out: torch.Tensor
) -> None:
    """Launch on validated ``x [M, K]``, ``weight [N, K]``, ``bias [N]`` or None into ``out [M, N]``."""
    M, K = x.shape
    N = weight.shape[0]
    if M == 0 or N == 0:
        return
    count_tensor, count_int = _dispatch.split_count(count)
    # bf16 arithmetic is silently wrong in the interpreter: there the dots run on fp32 copies
    upcast = _dispatch.interpreting() and x.dtype == torch.bfloat16
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    _row_linear_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,  # dummy pointer, never read without a bias
        out,
        count_tensor if count_tensor is not None else out,  # dummy pointer when the count is an int
        count_int,
        M,
        N,
        K,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        out.stride(1),
        HAS_BIAS=bias is not None,
        HAS_COUNT_PTR=count_tensor is not None,
        # fp32 must not silently drop to tf32 (F.linear's default does not either)
        DOT_PREC="ieee" if x.dtype == torch.float32 or upcast else "tf32",
        UPCAST=upcast,
    )


def _row_linear_pair_triton(
    x: torch.Tensor, weight_a: torch.Tensor, bias_a: torch.Tensor | None, weight_b: torch.Tensor,
    bias_b: torch.Tensor | None, count: int | torch.Tensor, out_a: torch.Tensor, out_b: torch.Tensor,
) -> None:
    """Launch on validated ``x [M, K]``, ``weight_a``/``weight_b`` ``[N, K]``, biases ``[N]`` or None
    into ``out_a``/``out_b`` ``[M, N]``: one grid, axis 1 choosing the projection."""
    M, K = x.shape
    N = weight_a.shape[0]
    if M == 0 or N == 0:
        return
    count_tensor, count_int = _dispatch.split_count(count)
    upcast = _dispatch.interpreting() and x.dtype == torch.bfloat16
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), 2)  # noqa: E731
    _row_linear_pair_kernel[grid](
        x, weight_a, bias_a if bias_a is not None else weight_a, out_a,
        weight_b, bias_b if bias_b is not None else weight_b, out_b,
        count_tensor if count_tensor is not None else out_a, count_int, M, N, K,
        x.stride(0), x.stride(1), weight_a.stride(0), weight_a.stride(1), weight_b.stride(0), weight_b.stride(1),
        out_a.stride(0), out_a.stride(1), out_b.stride(0), out_b.stride(1),
        HAS_BIAS_A=bias_a is not None, HAS_BIAS_B=bias_b is not None, HAS_COUNT_PTR=count_tensor is not None,
        DOT_PREC="ieee" if x.dtype == torch.float32 or upcast else "tf32", UPCAST=upcast,
    )  # fmt: skip


def row_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, count: int | torch.Tensor
) -> torch.Tensor:
    """Torch reference: ``F.linear`` on exactly the live rows (bitwise what it gives on them).

    Reads a tensor ``count`` on the host (a sync on CUDA); a count outside ``[0, capacity]`` acts
    as the nearest end, as in the kernel.
    """
    n = int(count.reshape(()).item()) if isinstance(count, torch.Tensor) else int(count)
    n = min(max(n, 0), x.shape[0])
    out = x.new_zeros((x.shape[0], weight.shape[0]))
    out[:n] = F.linear(x[:n], weight, bias)
    return out


def _row_linear_impl(x, weight, bias, count, count_int) -> torch.Tensor:
    live = count if count is not None else count_int
    if not _dispatch.use_triton(x):
        return row_linear_reference(x, weight, bias, live)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _row_linear_triton(x, weight, bias, live, out)
    return out


# the registered op (seer_kernels._dispatch): validated arguments
_row_linear_op = _dispatch.define_op(
    "row_linear(Tensor x, Tensor weight, Tensor? bias, Tensor? count, int count_int) -> Tensor",
    _row_linear_impl,
    lambda x, weight, bias, count, count_int: x.new_empty((x.shape[0], weight.shape[0])),
)


def row_linear_pair_reference(
    x: torch.Tensor, weight_a: torch.Tensor, bias_a: torch.Tensor | None, weight_b: torch.Tensor,
    bias_b: torch.Tensor | None, count: int | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`row_linear_pair`: :func:`row_linear_reference` of each weight."""
    return row_linear_reference(x, weight_a, bias_a, count), row_linear_reference(x, weight_b, bias_b, count)


def _row_linear_pair_impl(x, weight_a, bias_a, weight_b, bias_b, count, count_int) -> tuple[torch.Tensor, torch.Tensor]:
    live = count if count is not None else count_int
    if not _dispatch.use_triton(x):
        return row_linear_pair_reference(x, weight_a, bias_a, weight_b, bias_b, live)
    out_a = torch.empty((x.shape[0], weight_a.shape[0]), dtype=x.dtype, device=x.device)
    out_b = torch.empty_like(out_a)
    _row_linear_pair_triton(x, weight_a, bias_a, weight_b, bias_b, live, out_a, out_b)
    return out_a, out_b


_row_linear_pair_op = _dispatch.define_op(
    "row_linear_pair(Tensor x, Tensor weight_a, Tensor? bias_a, Tensor weight_b, Tensor? bias_b, Tensor? count, "
    "int count_int) -> (Tensor, Tensor)",
    _row_linear_pair_impl,
    lambda x, weight_a, bias_a, weight_b, bias_b, count, count_int: (
        x.new_empty((x.shape[0], weight_a.shape[0])), x.new_empty((x.shape[0], weight_b.shape[0]))),
)


def _check_weight(x, weight, bias, weight_name: str, bias_name: str) -> None:
    _dispatch.check_tensor(weight_name, weight, dtypes=(x.dtype,), dim=2)
    if weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"{weight_name} must be [N, K] with K = {x.shape[1]} (x's columns), got {tuple(weight.shape)}"
        )
    if bias is not None:
        _dispatch.check_tensor(bias_name, bias, dtypes=(x.dtype,), dim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"{bias_name} must be [N] = [{weight.shape[0]}], got {tuple(bias.shape)}")


def _check_row_linear(x, weight, bias, count) -> None:
    _dispatch.check_tensor("x", x, dtypes=_DTYPES, dim=2)
    _check_weight(x, weight, bias, "weight", "bias")
    _dispatch.check_count("count", count, x.shape[0], "x's capacity rows")
    _dispatch.check_same_device(
        x=x, weight=weight, bias=bias, count=count if isinstance(count, torch.Tensor) else None
    )


def row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, count: int | torch.Tensor, *,
    check: bool = True,
) -> torch.Tensor:
    """``F.linear`` of the first ``count`` rows of ``x``; the other rows of the result are zero.

    Args:
        x: ``[capacity, K]`` fp16/bf16/fp32, any strides.
        weight: ``[N, K]`` of ``x``'s dtype and device (``nn.Linear.weight``), any strides.
        bias: ``[N]`` of ``x``'s dtype, or None.
        count: live rows: a Python int in ``[0, capacity]``, or an int32/int64 tensor of one
            element on ``x``'s device, never read on the host (values outside ``[0, capacity]``
            act as the nearest end; not checked, that would need a host sync).
        check: validate the arguments (default). False skips every check, for a caller that
            builds them itself and calls in a hot loop (the engine's sparse layers): wrong
            arguments are then undefined behaviour.

    Returns:
        ``[capacity, N]`` in ``x``'s dtype: ``out[:count] = x[:count] @ weight.T + bias``,
        accumulated in fp32 (IEEE fp32 dots for fp32 inputs, never tf32), the bias added in fp32
        and the sum rounded once; rows at or past ``count`` are zero. ``K = 0`` gives the bias
        (zeros without one) on the live rows; ``capacity = 0`` or ``N = 0`` an empty result.
        Under the Triton interpreter bf16 dots run in fp32 (its bf16 arithmetic is wrong).

    No host synchronisation on CUDA (graph-capturable); the first CUDA call per ``(capacity, N,
    K)`` and dtype autotunes the tile sizes on that call's count, so warm up before a capture.
    """
    if check:
        _check_row_linear(x, weight, bias, count)
    return _row_linear_op(x, weight, bias, *_dispatch.split_count(count))


def row_linear_pair(
    x: torch.Tensor, weight_a: torch.Tensor, bias_a: torch.Tensor | None, weight_b: torch.Tensor,
    bias_b: torch.Tensor | None, count: int | torch.Tensor, *, check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two projections of the same live rows in one launch: :func:`row_linear` with ``weight_a``
    and with ``weight_b`` (DyLLM's K and V, or gate and up, of the rows it recomputes).

    Args:
        x: ``[capacity, K]`` fp16/bf16/fp32, any strides.
        weight_a, weight_b: ``[N, K]`` each, the same shape, of ``x``'s dtype and device, any
            strides.
        bias_a, bias_b: ``[N]`` of ``x``'s dtype, or None (each on its own).
        count: live rows, as in :func:`row_linear`.
        check: validate the arguments (default); False skips every check, as in :func:`row_linear`.

    Returns:
        ``(out_a, out_b)``, each ``[capacity, N]`` in ``x``'s dtype: what :func:`row_linear` gives
        for that weight (rows past the count zero). The same arithmetic per output tile; on a GPU
        the pair autotunes its tile sizes on its own, so it agrees with two :func:`row_linear`
        calls within fp32 accumulation order (bitwise under the interpreter and on the CPU).

    No host synchronisation on CUDA (graph-capturable; warm up before a capture, as for
    :func:`row_linear`).
    """
    if check:
        _dispatch.check_tensor("x", x, dtypes=_DTYPES, dim=2)
        _check_weight(x, weight_a, bias_a, "weight_a", "bias_a")
        _check_weight(x, weight_b, bias_b, "weight_b", "bias_b")
        if weight_b.shape != weight_a.shape:
            raise ValueError(
                f"weight_b must have weight_a's shape {tuple(weight_a.shape)}, got {tuple(weight_b.shape)}"
            )
        _dispatch.check_count("count", count, x.shape[0], "x's capacity rows")
        _dispatch.check_same_device(x=x, weight_a=weight_a, bias_a=bias_a, weight_b=weight_b, bias_b=bias_b,
                                    count=count if isinstance(count, torch.Tensor) else None)
    return _row_linear_pair_op(x, weight_a, bias_a, weight_b, bias_b, *_dispatch.split_count(count))
