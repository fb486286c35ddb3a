"""Shared by the gpu-marked tests (``tests/kernels/test_*_gpu.py``): when they run, bit views.

They need a CUDA device and the compiled kernels: ``tests/conftest.py`` defaults
``TRITON_INTERPRET`` to 1, so run them as ``bench/gpu_check.sh`` does, with
``TRITON_INTERPRET=0 pytest -m gpu tests/kernels``.
"""

from __future__ import annotations

import pytest
import torch

from seer_kernels import interpreting

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(),
    reason="needs CUDA and TRITON_INTERPRET=0 (bench/gpu_check.sh runs these)",
)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bit patterns as int64 (ints pass through)."""
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).to(torch.int64)


def nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal everywhere, NaN where the other is NaN."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
