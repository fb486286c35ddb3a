"""A linear layer over the first ``count`` rows of a fixed-capacity buffer (DyLLM's sparse rows).

``out[:count] = x[:count] @ weight.T + bias``; rows at or past ``count`` are zero. ``count`` may
live on the device, so the caller never reads it on the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def row_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         count: int | torch.Tensor) -> torch.Tensor:
    """Torch reference: ``F.linear`` on exactly the live rows (bitwise what it gives on them)."""
    n = int(count.reshape(()).item()) if isinstance(count, torch.Tensor) else int(count)
    out = x.new_zeros((x.shape[0], weight.shape[0]))
    out[:n] = F.linear(x[:n], weight, bias)
    return out


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               count: int | torch.Tensor) -> torch.Tensor:
    """``x [capacity, K]``, ``weight [N, K]``, ``bias [N]`` or None, ``count`` an int or a one-element
    int tensor in ``[0, capacity]`` -> ``[capacity, N]`` (rows past ``count`` zero)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [capacity, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    return row_linear_reference(x, weight, bias, count)
