"""Per-token MLP activation sparsity (the Seer probe signal), alone or fused with SwiGLU.

``mlp_sparsity(act, eps)`` is the fraction of a token's ``F`` activation entries with
``|a| < eps``. ``swiglu_sparsity(gate, up, eps)`` computes the down-projection input
``silu(gate) * up`` and its sparsity in one pass, so the probe layer reads ``gate``/``up``
once and writes the product once (no extra read of the product for the probe).

Both kernels run one program per (row, block of tokens) and loop over ``F`` in blocks, so
``F`` need not be a power of two (LLaDA/MMaDA 12288, Dream 18944). Counts are exact
integers; the fraction is ``count / F`` rounded once to fp32 (IEEE division), so every
backend gives the same bits.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as torch_F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import _dispatch

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _mlp_sparsity_kernel(
    act_ptr,
    lengths_ptr,
    out_ptr,
    T,
    F,
    stride_ar,
    stride_at,
    eps,
    HAS_LENGTHS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    # a 1-D grid over (row, token block): the second grid axis is capped at 65535
    pid = tl.program_id(0).to(tl.int64)
    n_t_blocks = tl.cdiv(T, BLOCK_T)
    row = pid // n_t_blocks
    offs_t = (pid % n_t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_row = offs_t < T
    if HAS_LENGTHS:
        n = tl.load(lengths_ptr + row).to(tl.int64)
        # an out-of-range length (only possible on CUDA, where it is not checked to avoid a
        # host sync) makes the whole row NaN rather than being clamped to something plausible
        n = tl.where(n <= T, n, -1)
        valid = in_row & (offs_t < n)
    else:
        valid = in_row
    # a tile with no valid token reads nothing: skip the F loop
    f_end = tl.where(tl.max(valid.to(tl.int32), axis=0) > 0, F, 0)

    count = tl.zeros([BLOCK_T, BLOCK_F], dtype=tl.int32)
    base = act_ptr + row * stride_ar + offs_t[:, None] * stride_at
    for f0 in range(0, f_end, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        mask = valid[:, None] & (offs_f < F)[None, :]
        # NaN fill: masked lanes and NaN entries both fail |a| < eps, so no extra mask is needed
        a = tl.load(base + offs_f[None, :], mask=mask, other=float("nan")).to(tl.float32)
        count += (tl.abs(a) < eps).to(tl.int32)

    total = tl.sum(count, axis=1).to(tl.float32)
    frac = tl.math.div_rn(total, tl.zeros([BLOCK_T], dtype=tl.float32) + F)
    frac = tl.where(valid, frac, float("nan"))
    tl.store(out_ptr + row * T + offs_t, frac, mask=in_row)


@triton.jit
def _swiglu_sparsity_kernel(
    gate_ptr,
    up_ptr,
    prod_ptr,
    lengths_ptr,
    sparsity_ptr,
    T,
    F,
    stride_gr,
    stride_gt,
    stride_ur,
    stride_ut,
    stride_pr,
    stride_pt,
    eps,
    HAS_LENGTHS: tl.constexpr,
    USE_LIBDEVICE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    # a 1-D grid over (row, token block): the second grid axis is capped at 65535
    pid = tl.program_id(0).to(tl.int64)
    n_t_blocks = tl.cdiv(T, BLOCK_T)
    row = pid // n_t_blocks
    offs_t = (pid % n_t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_row = offs_t < T
    if HAS_LENGTHS:
        n = tl.load(lengths_ptr + row).to(tl.int64)
        n = tl.where(n <= T, n, -1)  # out of range (unchecked on CUDA): no valid token
        valid = in_row & (offs_t < n)
    else:
        valid = in_row
    out_ty = prod_ptr.dtype.element_ty

    count = tl.zeros([BLOCK_T, BLOCK_F], dtype=tl.int32)
    g_base = gate_ptr + row * stride_gr + offs_t[:, None] * stride_gt
    u_base = up_ptr + row * stride_ur + offs_t[:, None] * stride_ut
    p_base = prod_ptr + row * stride_pr + offs_t[:, None] * stride_pt
    # the product is needed for every token (the model consumes it), lengths or not
    for f0 in range(0, F, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        in_f = (offs_f < F)[None, :]
        mask = in_row[:, None] & in_f
        g = tl.load(g_base + offs_f[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_base + offs_f[None, :], mask=mask, other=0.0).to(tl.float32)
        # torch eager: silu = x / (1 + exp(-x)) in fp32, rounded to the dtype; then the product
        # in fp32, rounded again. libdevice expf and IEEE division are what torch's CUDA
        # kernel compiles to (tl.exp and "/" are approximate on GPU). The interpreter has no
        # libdevice, and numpy's fp32 exp is less accurate than torch's: exp in fp64 instead.
        if USE_LIBDEVICE:
            e = libdevice.exp(-g)
        else:
            e = tl.exp((-g).to(tl.float64)).to(tl.float32)
        silu = tl.math.div_rn(g, 1.0 + e).to(out_ty).to(tl.float32)
        p = (silu * u).to(out_ty)
        tl.store(p_base + offs_f[None, :], p, mask=mask)
        # sparsity of the stored (rounded) product, so it equals mlp_sparsity(product) bitwise
        hit = tl.abs(p.to(tl.float32)) < eps
        count += (hit & valid[:, None] & in_f).to(tl.int32)

    total = tl.sum(count, axis=1).to(tl.float32)
    frac = tl.math.div_rn(total, tl.zeros([BLOCK_T], dtype=tl.float32) + F)
    frac = tl.where(valid, frac, float("nan"))
    tl.store(sparsity_ptr + row * T + offs_t, frac, mask=in_row)


def _block_sizes(T: int, F: int) -> tuple[int, int, int]:
    """``(BLOCK_T, BLOCK_F, num_warps)`` for a ``[T, F]`` row.

    On GPU a tile holds up to 4096 entries (16 per thread at 8 warps), all of them along F
    for real intermediate sizes. Under the interpreter the tiles are small so that tests with
    small F cross block edges (and every program costs the same fixed overhead anyway).
    """
    max_f, max_tile = (128, 512) if _dispatch.interpreting() else (4096, 4096)
    block_f = min(triton.next_power_of_2(max(F, 1)), max_f)
    block_t = min(triton.next_power_of_2(max(T, 1)), max(1, max_tile // block_f))
    num_warps = 8 if block_t * block_f >= 2048 else 4
    return block_t, block_f, num_warps


def _fp32_threshold(eps: float) -> float:
    # the comparison is done in fp32: round eps once here so every backend sees the same value
    return float(torch.tensor(eps, dtype=torch.float32).item())


def _mlp_sparsity_triton(
    act: torch.Tensor, eps: float, lengths: torch.Tensor | None, out: torch.Tensor
) -> None:
    """Launch on ``act [R, T, F]`` (last dim contiguous) into ``out [R, T]`` fp32 contiguous."""
    R, T, F = act.shape
    if R == 0 or T == 0:
        return
    block_t, block_f, num_warps = _block_sizes(T, F)
    grid = (R * triton.cdiv(T, block_t),)
    _mlp_sparsity_kernel[grid](
        act,
        lengths if lengths is not None else out,  # dummy pointer, never read without lengths
        out,
        T,
        F,
        act.stride(0),
        act.stride(1),
        _fp32_threshold(eps),
        HAS_LENGTHS=lengths is not None,
        BLOCK_T=block_t,
        BLOCK_F=block_f,
        num_warps=num_warps,
        enable_fp_fusion=False,  # nothing to fuse; stated so the result never depends on it
    )


def _swiglu_sparsity_triton(
    gate: torch.Tensor,
    up: torch.Tensor,
    eps: float,
    lengths: torch.Tensor | None,
    product: torch.Tensor,
    sparsity: torch.Tensor,
) -> None:
    """Launch on ``gate, up, product [R, T, F]`` (last dims contiguous), ``sparsity [R, T]``."""
    R, T, F = gate.shape
    if R == 0 or T == 0:
        return
    block_t, block_f, num_warps = _block_sizes(T, F)
    grid = (R * triton.cdiv(T, block_t),)
    _swiglu_sparsity_kernel[grid](
        gate,
        up,
        product,
        lengths if lengths is not None else sparsity,  # dummy pointer, never read without lengths
        sparsity,
        T,
        F,
        gate.stride(0),
        gate.stride(1),
        up.stride(0),
        up.stride(1),
        product.stride(0),
        product.stride(1),
        _fp32_threshold(eps),
        HAS_LENGTHS=lengths is not None,
        USE_LIBDEVICE=not _dispatch.interpreting(),
        BLOCK_T=block_t,
        BLOCK_F=block_f,
        num_warps=num_warps,
        # torch's CUDA kernels are built with nvcc's default --fmad=true, which lets the last
        # multiply of the inlined expf fuse with the "1 +"; Triton does the same only with fusion
        # on, so say so (its default is changing). tests/kernels/test_mlp_sparsity_gpu.py checks the bits.
        enable_fp_fusion=True,
    )


def mlp_sparsity_reference(
    act: torch.Tensor, eps: float, *, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """Torch reference of :func:`mlp_sparsity` (same semantics, no validation, no host sync)."""
    F = act.shape[-1]
    below = act.float().abs() < _fp32_threshold(eps)  # NaN compares false: never below eps
    count = below.sum(dim=-1, dtype=torch.int32).to(torch.float32)
    # a tensor divisor, not a Python scalar: CUDA turns division by a scalar into a multiply by
    # its reciprocal, which is not the correctly rounded quotient the kernels produce
    frac = count / torch.full_like(count, float(F))
    if lengths is not None:
        T = act.shape[-2]
        pos = torch.arange(T, device=act.device)
        n = lengths.to(torch.int64).unsqueeze(-1)
        valid = (pos < n) & (n <= T)
        frac = torch.where(valid, frac, torch.full_like(frac, float("nan")))
    return frac


def swiglu_sparsity_reference(
    gate: torch.Tensor,
    up: torch.Tensor,
    eps: float,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`swiglu_sparsity`: eager ``F.silu(gate) * up``, then its sparsity."""
    if out is None:
        product = torch_F.silu(gate) * up
    else:
        product = torch.mul(torch_F.silu(gate), up, out=out)
    return product, mlp_sparsity_reference(product, eps, lengths=lengths)


def _mlp_sparsity_impl(act, eps, lengths) -> torch.Tensor:
    if not _dispatch.use_triton(act):
        return mlp_sparsity_reference(act, eps, lengths=lengths)
    rows = _rows(act)
    out = torch.empty(rows.shape[:2], dtype=torch.float32, device=act.device)
    _mlp_sparsity_triton(rows, eps, None if lengths is None else lengths.reshape(-1), out)
    return out.reshape(act.shape[:-1])


def _swiglu_sparsity_impl(gate, up, eps, lengths, product) -> torch.Tensor:
    if not _dispatch.use_triton(gate):
        return swiglu_sparsity_reference(gate, up, eps, lengths=lengths, out=product)[1]
    T, F = gate.shape[-2:]
    R = math.prod(gate.shape[:-2])
    sparsity = torch.empty((R, T), dtype=torch.float32, device=gate.device)
    _swiglu_sparsity_triton(
        _rows(gate), _rows(up), eps, None if lengths is None else lengths.reshape(-1), product.view(R, T, F), sparsity
    )
    return sparsity.reshape(gate.shape[:-1])


# the registered ops (seer_kernels._dispatch): validated arguments; swiglu's product buffer
# is allocated by the caller
_mlp_sparsity_op = _dispatch.define_op(
    "mlp_sparsity(Tensor act, float eps, Tensor? lengths) -> Tensor",
    _mlp_sparsity_impl,
    lambda act, eps, lengths: act.new_empty(act.shape[:-1], dtype=torch.float32),
)
_swiglu_sparsity_op = _dispatch.define_op(
    "swiglu_sparsity(Tensor gate, Tensor up, float eps, Tensor? lengths, Tensor(a!) product) -> Tensor",
    _swiglu_sparsity_impl,
    lambda gate, up, eps, lengths, product: gate.new_empty(gate.shape[:-1], dtype=torch.float32),
)


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not eps >= 0:  # also rejects NaN
        raise ValueError(f"eps must be >= 0 (and not NaN), got {eps}")
    return float(eps)


def _check_activation(name: str, t: object) -> torch.Tensor:
    _dispatch.check_tensor(name, t, dtypes=_FLOAT_DTYPES, min_dim=2)
    if t.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (feature) dimension, got shape {tuple(t.shape)}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")
    return t


def _check_lengths(lengths: object, act: torch.Tensor, act_name: str) -> torch.Tensor | None:
    if lengths is None:
        return None
    _dispatch.check_tensor("lengths", lengths, dtypes=_INT_DTYPES)
    if lengths.shape != act.shape[:-2]:
        raise ValueError(
            f"lengths must have shape {tuple(act.shape[:-2])} ({act_name}.shape[:-2]), "
            f"got {tuple(lengths.shape)}"
        )
    _dispatch.check_same_device(**{act_name: act, "lengths": lengths})
    # values are checked on the host path only: reading a CUDA tensor's values would sync the host
    if _dispatch.host_path(lengths) and lengths.numel() > 0:
        T = act.shape[-2]
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > T:
            raise ValueError(
                f"lengths must lie in [0, {T}] ({act_name}.shape[-2]), got values in [{lo}, {hi}]"
            )
    return lengths


def _rows(t: torch.Tensor) -> torch.Tensor:
    """View ``[..., T, F]`` as ``[R, T, F]`` (copies only when the leading dims cannot be merged)."""
    return t.reshape(math.prod(t.shape[:-2]), t.shape[-2], t.shape[-1])


def mlp_sparsity(act: torch.Tensor, eps: float, *, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token fraction of MLP activation entries with ``|a| < eps``.

    Args:
        act: ``[..., T, F]`` fp32/fp16/bf16, contiguous in the last dimension (other strides
            are free; leading dims that cannot be merged into one row dimension are copied).
            Any number of leading dims, including none (``[T, F]``) or an empty one.
        eps: absolute threshold, a real number ``>= 0`` (``inf`` allowed, NaN rejected). It is
            rounded once to fp32 and compared in fp32 against ``|a|`` upcast to fp32 (strict
            ``<``, so ``eps = 0`` gives 0). NaN entries never count as below ``eps``.
        lengths: optional int32/int64 tensor of shape ``act.shape[:-2]`` on ``act``'s device:
            only the first ``lengths[...]`` tokens of each row are read; positions at or past
            the length are returned as NaN. Values must lie in ``[0, T]``: checked (ValueError)
            on the host path (CPU tensors in eager mode, ``_dispatch.host_path``); on CUDA they
            are not checked (that would sync the host) and a row with an out-of-range length
            comes back all NaN.

    Returns:
        fp32 ``[..., T]`` (contiguous) on ``act``'s device: ``count / F`` rounded once to fp32,
        the same bits on every backend.

    Edges: ``F = 0`` raises ValueError (a fraction of nothing is undefined); ``T = 0`` or an
    empty leading dim returns an empty ``[..., T]`` tensor without launching anything.
    No host synchronisation on CUDA (CUDA-graph capturable).
    """
    _check_activation("act", act)
    eps = _check_eps(eps)
    lengths = _check_lengths(lengths, act, "act")
    return _mlp_sparsity_op(act, eps, lengths)


def swiglu_sparsity(
    gate: torch.Tensor,
    up: torch.Tensor,
    eps: float,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused SwiGLU product ``silu(gate) * up`` and its per-token sparsity, in one pass.

    Args:
        gate, up: ``[..., T, F]``, the same shape, dtype (fp32/fp16/bf16) and device, each
            contiguous in the last dimension.
        eps: as in :func:`mlp_sparsity`.
        lengths: as in :func:`mlp_sparsity`, for the sparsity only: the product is computed
            for every token (the model needs it); sparsity is NaN at positions ``>= lengths``.
        out: optional preallocated product, the shape/dtype/device of ``gate``, contiguous in
            the last dimension with mergeable leading dims (so it can be written in place).

    Returns:
        ``(product, sparsity)``: ``product`` in the input dtype (``out`` when given), computed
        exactly as torch eager computes ``F.silu(gate) * up`` in that dtype: silu in fp32
        rounded to the dtype, then the product in fp32 rounded to the dtype. On CUDA it uses
        the same libdevice ``expf`` and IEEE division as torch's kernel; under the Triton
        interpreter exp goes through fp64 (correctly rounded): fp16 outputs then match torch
        CPU bitwise in the tests, fp32 within a few ulp (torch CPU's fp32 exp is not
        correctly rounded, so fp32 cannot be bitwise there). ``sparsity`` fp32 ``[..., T]``
        is measured on the stored (rounded) product, so it equals
        ``mlp_sparsity(product, eps, lengths=lengths)`` bitwise.

    Edges: ``F = 0`` raises ValueError naming ``gate``; ``T = 0`` or an empty leading dim
    returns empty results. No host synchronisation on CUDA.
    """
    _check_activation("gate", gate)
    _check_activation("up", up)
    if up.shape != gate.shape:
        raise ValueError(f"up must have the shape of gate {tuple(gate.shape)}, got {tuple(up.shape)}")
    if up.dtype != gate.dtype:
        raise TypeError(f"up must have the dtype of gate ({gate.dtype}), got {up.dtype}")
    eps = _check_eps(eps)
    lengths = _check_lengths(lengths, gate, "gate")
    T, F = gate.shape[-2:]
    R = math.prod(gate.shape[:-2])
    if out is not None:
        _dispatch.check_tensor("out", out)
        if out.shape != gate.shape or out.dtype != gate.dtype:
            raise ValueError(
                f"out must have the shape and dtype of gate ({tuple(gate.shape)}, {gate.dtype}), "
                f"got ({tuple(out.shape)}, {out.dtype})"
            )
        if F > 1 and out.stride(-1) != 1:
            raise ValueError(f"out must be contiguous in its last dimension, got strides {out.stride()}")
        try:
            out.view(R, T, F)
        except RuntimeError as exc:
            msg = f"out must have leading dims that merge into one, got strides {out.stride()}"
            raise ValueError(msg) from exc
    _dispatch.check_same_device(gate=gate, up=up, out=out)
    if out is None:
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    return out, _swiglu_sparsity_op(gate, up, eps, lengths, out)
