"""snr_boundary compiled on CUDA: exactly the reference's L*, on the device and on the CPU."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import snr_boundary, snr_boundary_reference
from tests.kernels.cuda import requires_cuda
from tests.kernels.test_snr_boundary import _planted

pytestmark = [pytest.mark.gpu, pytest.mark.snr_boundary, requires_cuda]


@pytest.mark.parametrize(
    "B, N, dtype",
    [(64, 256, torch.bfloat16), (64, 2048, torch.bfloat16), (5, 3, torch.bfloat16), (64, 256, torch.float32)],
)
def test_matches_the_reference_exactly(B, N, dtype):
    s = _planted(B, N, seed=N, with_nonfinite=True).to(dtype)
    valid_len = torch.randint(0, N + 1, (B,), generator=torch.Generator().manual_seed(N))
    valid_len[: B // 2] = N
    s_cuda, valid_cuda = s.cuda(), valid_len.cuda()
    for options in ({}, {"baseline_window": 3, "min_position": 2}, {"window": 1, "gamma": 0.0}):
        out = snr_boundary(s_cuda, valid_cuda, **options)
        assert torch.equal(out, snr_boundary_reference(s_cuda, valid_cuda, **options)), options
        # the CPU reference too: the decision must not depend on the device
        assert torch.equal(out.cpu(), snr_boundary_reference(s, valid_len, **options)), options
