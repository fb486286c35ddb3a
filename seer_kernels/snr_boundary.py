"""The Seer jump-to-plateau boundary scan (paper §3.3): per-row answer length ``L*``.

Over a row of per-token sparsity ``s[0..N)``, position ``i`` is a boundary when the window
``W_i = s[i .. i+window)`` sits on a plateau that jumped up from the baseline before it:

    jump(i)  = min(W_i) - baseline(i)          (baseline(i) = s[i-1] by default)
    noise(i) = max(W_i) - min(W_i)
    boundary  <=>  jump(i) >= tau_jump  and  noise(i) <= gamma * jump(i)

The first boundary ``i*`` gives ``L* = i* + 1``; a row without one keeps ``valid_len``.
The kernel runs one program per row and walks it left to right in blocks, stopping at the
first block that holds a boundary, so a typical row reads only its answer plus one block.
Everything is computed in fp32 with the same operation order as the reference, so the
integer result is identical on every backend.
"""

from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl

from . import _dispatch

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _snr_boundary_kernel(
    s_ptr,
    valid_len_ptr,
    out_ptr,
    N,
    stride_b,
    stride_n,
    tau_jump,
    gamma,
    window,
    baseline_window,
    min_position,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = tl.load(valid_len_ptr + row).to(tl.int64)
    # An out-of-range length can reach the kernel only on CUDA (checking it there would sync
    # the host): answer -1 for that row instead of reading out of bounds or guessing.
    bad = (n < 0) | (n > N)
    last = tl.where(bad, -1, n - window)  # last candidate: the window ends at valid_len
    s_row = s_ptr + row * stride_b

    not_found = N + 1  # larger than any candidate
    first = tl.zeros((), dtype=tl.int64) + not_found
    start = tl.zeros((), dtype=tl.int64) + min_position
    while (start <= last) & (first == not_found):
        i = start + tl.arange(0, BLOCK).to(tl.int64)
        cand = i <= last
        # window min/max; |x| < inf is false for NaN and +-inf
        x = tl.load(s_row + i * stride_n, mask=cand, other=0.0).to(tl.float32)
        w_min = x
        w_max = x
        finite = tl.abs(x) < float("inf")
        for j in range(1, window):
            x = tl.load(s_row + (i + j) * stride_n, mask=cand, other=0.0).to(tl.float32)
            w_min = tl.minimum(w_min, x)
            w_max = tl.maximum(w_max, x)
            finite = finite & (tl.abs(x) < float("inf"))
        # baseline: mean of the up-to-baseline_window values before i, summed from i-1 down
        b = tl.load(s_row + (i - 1) * stride_n, mask=cand, other=0.0).to(tl.float32)
        finite = finite & (tl.abs(b) < float("inf"))
        acc = b
        for k in range(2, baseline_window + 1):
            b = tl.load(s_row + (i - k) * stride_n, mask=cand & (i >= k), other=0.0).to(tl.float32)
            finite = finite & (tl.abs(b) < float("inf"))
            acc = acc + b
        count = tl.minimum(i, baseline_window).to(tl.float32)
        baseline = tl.math.div_rn(acc, tl.maximum(count, 1.0))
        jump = w_min - baseline
        noise = w_max - w_min
        fire = cand & finite & (jump >= tau_jump) & (noise <= gamma * jump)
        first = tl.min(tl.where(fire, i, not_found), axis=0)
        start += BLOCK

    result = tl.where(first <= last, first + 1, n)
    result = tl.where(bad, -1, result)
    tl.store(out_ptr + row, result.to(tl.int32))


def _block_size(N: int) -> int:
    # interpreter: small blocks so that tests cross block edges with short rows
    cap = 16 if _dispatch.interpreting() else 512
    return min(max(triton.next_power_of_2(max(N, 1)), 16), cap)


def _fp32(x: float) -> float:
    # thresholds are applied in fp32: round once here so every backend compares the same value
    return float(torch.tensor(x, dtype=torch.float32).item())


def _snr_boundary_triton(
    sparsity: torch.Tensor,
    valid_len: torch.Tensor,
    out: torch.Tensor,
    *,
    tau_jump: float,
    gamma: float,
    window: int,
    baseline_window: int,
    min_position: int,
    block_size: int | None = None,
) -> None:
    """Launch on ``sparsity [B, N]`` (any strides), ``valid_len [B]``, into ``out`` int32 ``[B]``."""
    B, N = sparsity.shape
    if B == 0:
        return
    _snr_boundary_kernel[(B,)](
        sparsity,
        valid_len,
        out,
        N,
        sparsity.stride(0),
        sparsity.stride(1),
        _fp32(tau_jump),
        _fp32(gamma),
        window,
        baseline_window,
        min_position,
        BLOCK=block_size or _block_size(N),
        num_warps=4,
        enable_fp_fusion=False,  # the same fp32 rounding steps as the reference
    )


def snr_boundary_reference(
    sparsity: torch.Tensor,
    valid_len: torch.Tensor,
    *,
    tau_jump: float = 0.03,
    gamma: float = 0.6,
    window: int = 3,
    baseline_window: int = 1,
    min_position: int = 1,
) -> torch.Tensor:
    """Torch reference of :func:`snr_boundary` (same semantics, no validation, no host sync)."""
    s = sparsity.float()
    B, N = s.shape
    n = valid_len.to(torch.int64)
    n_pos = N - window + 1  # positions whose window fits in the row
    if n_pos <= 1:  # no i >= 1 has a full window: nothing can fire
        return n.to(torch.int32)

    win = s.unfold(1, window, 1)  # [B, n_pos, window]: W_i for i = 0 .. N-window
    w_min = win.amin(dim=-1)
    w_max = win.amax(dim=-1)
    finite = torch.isfinite(win).all(dim=-1)

    zeros = s.new_zeros(B, n_pos)
    prev = zeros.clone()
    prev[:, 1:] = s[:, : n_pos - 1]  # s[i-1]
    finite[:, 1:] &= torch.isfinite(s[:, : n_pos - 1])
    acc = prev
    for k in range(2, baseline_window + 1):
        if k >= n_pos:
            break
        shifted = zeros.clone()
        shifted[:, k:] = s[:, : n_pos - k]  # s[i-k], 0 where i < k (as the kernel's masked load)
        finite[:, k:] &= torch.isfinite(s[:, : n_pos - k])
        acc = acc + shifted
    pos = torch.arange(n_pos, device=s.device)
    count = pos.clamp(min=1, max=baseline_window).to(torch.float32)
    baseline = acc / count
    jump = w_min - baseline
    noise = w_max - w_min
    fire = (
        finite
        & (jump >= _fp32(tau_jump))
        & (noise <= _fp32(gamma) * jump)
        & (pos >= min_position)
        & (pos <= n[:, None] - window)
    )
    first = torch.where(fire, pos, torch.full_like(pos, n_pos)).amin(dim=1)
    return torch.where(first < n_pos, first + 1, n).to(torch.int32)


def _snr_boundary_impl(sparsity, valid_len, tau_jump, gamma, window, baseline_window, min_position):
    options = dict(
        tau_jump=tau_jump, gamma=gamma, window=window, baseline_window=baseline_window, min_position=min_position
    )
    if not _dispatch.use_triton(sparsity):
        return snr_boundary_reference(sparsity, valid_len, **options)
    out = torch.empty(sparsity.shape[0], dtype=torch.int32, device=sparsity.device)
    _snr_boundary_triton(sparsity, valid_len, out, **options)
    return out


# the registered op (seer_kernels._dispatch): validated arguments
_snr_boundary_op = _dispatch.define_op(
    "snr_boundary(Tensor sparsity, Tensor valid_len, float tau_jump, float gamma, int window, int baseline_window, "
    "int min_position) -> Tensor",
    _snr_boundary_impl,
    lambda sparsity, valid_len, *options: valid_len.new_empty(sparsity.shape[:1], dtype=torch.int32),
)


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def snr_boundary(
    sparsity: torch.Tensor,
    valid_len: torch.Tensor,
    *,
    tau_jump: float = 0.03,
    gamma: float = 0.6,
    window: int = 3,
    baseline_window: int = 1,
    min_position: int = 1,
) -> torch.Tensor:
    """First jump-to-plateau boundary of each row's sparsity profile: the answer length ``L*``.

    Scans 0-based positions ``i`` of row ``b`` left to right with ``W_i = s[i .. i+window)``;
    the baseline is ``s[i-1]`` when ``baseline_window == 1`` (the paper), in general the mean
    of ``s[max(0, i-baseline_window) .. i)`` (summed from ``s[i-1]`` down, then divided).
    ``jump = min(W_i) - baseline``, ``noise = max(W_i) - min(W_i)``; ``i`` is a boundary when
    ``jump >= tau_jump`` and ``noise <= gamma * jump``. The first boundary ``i*`` gives
    ``L* = i* + 1`` (the predicted answer plus one end token).

    Args:
        sparsity: ``[B, N]`` fp32/fp16/bf16 (upcast to fp32; any strides), one row per request
            over its response positions.
        valid_len: ``[B]`` int32/int64 on the same device, ``0 <= valid_len <= N``: only
            ``s[:valid_len]`` of each row is looked at.
        tau_jump: minimum jump, ``> 0``. gamma: noise-to-jump ratio, ``>= 0``.
        window: plateau window, ``>= 1`` (paper: 3). baseline_window: values averaged into the
            baseline, ``>= 1`` (paper: 1; larger is steadier on small, noisy models).
        min_position: first candidate position, ``>= 1``.
        Thresholds are rounded once to fp32 and every comparison is made in fp32.

    Returns:
        int32 ``[B]`` on the input's device: ``L*`` for rows with a boundary, else
        ``valid_len``. Always ``0 <= L* <= valid_len``.

    Edges:
        * candidates are ``i`` in ``[max(1, min_position), valid_len - window]``: position 0
          has no baseline, and a window never runs past ``valid_len`` (values there are
          ignored), so rows with ``valid_len <= window`` never fire and ``valid_len = 0``
          gives 0;
        * a NaN or +-inf anywhere in ``W_i`` or in the baseline values makes ``i`` not a
          boundary (the scan goes on);
        * ``valid_len`` outside ``[0, N]`` raises ValueError on the host path (CPU tensors in
          eager mode, ``_dispatch.host_path``); on CUDA it is not checked (that would sync the
          host) and that row's result is -1;
        * ``B = 0`` returns an empty tensor. No host synchronisation on CUDA (graph-capturable).
    """
    _dispatch.check_tensor("sparsity", sparsity, dtypes=_FLOAT_DTYPES, dim=2)
    _dispatch.check_tensor("valid_len", valid_len, dtypes=_INT_DTYPES, dim=1)
    if valid_len.shape[0] != sparsity.shape[0]:
        raise ValueError(
            f"valid_len must have shape [{sparsity.shape[0]}] (one length per sparsity row), "
            f"got {tuple(valid_len.shape)}"
        )
    _dispatch.check_same_device(sparsity=sparsity, valid_len=valid_len)
    tau_jump = _check_real("tau_jump", tau_jump)
    if not 0 < tau_jump < math.inf:  # also rejects NaN; at inf no jump could ever reach it
        raise ValueError(f"tau_jump must be a finite number > 0, got {tau_jump}")
    gamma = _check_real("gamma", gamma)
    if not 0 <= gamma < math.inf:  # at inf the plateau half of the test would vanish
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma}")
    window = _check_int("window", window, 1)
    baseline_window = _check_int("baseline_window", baseline_window, 1)
    min_position = _check_int("min_position", min_position, 1)
    B, N = sparsity.shape
    # values are checked on the host path only: reading a CUDA tensor's values would sync the host
    if _dispatch.host_path(valid_len) and B > 0:
        lo, hi = int(valid_len.min()), int(valid_len.max())
        if lo < 0 or hi > N:
            raise ValueError(
                f"valid_len must lie in [0, {N}] (sparsity.shape[1]), got values in [{lo}, {hi}]"
            )

    return _snr_boundary_op(sparsity, valid_len, tau_jump, gamma, window, baseline_window, min_position)
