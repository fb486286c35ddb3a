"""cosine_saliency compiled on CUDA in bf16 against the torch reference on the same device."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import cosine_saliency, cosine_saliency_reference
from seer_kernels.cosine_saliency import INDEX_PAD
from tests.kernels.cuda import requires_cuda
from tests.kernels.test_cosine_saliency import _pair

pytestmark = [pytest.mark.gpu, pytest.mark.cosine_saliency, requires_cuda]


@pytest.mark.parametrize("N, D", [(16 * 256, 4096), (16 * 1256, 4096), (1000, 4096), (37, 130)])
def test_bf16_matches_the_reference(N, D):
    """The same salient set except rows within 1e-5 of tau (fp32 similarity rounding may flip
    them), the index ascending and padded, the similarity within 1e-5, NaN rows salient."""
    tau = 0.99
    ctx, cache = (t.cuda() for t in _pair((N, D), torch.bfloat16, seed=N))
    cache[3] = ctx[3]  # similarity exactly 1: never salient
    ctx[5, 7] = float("nan")  # NaN similarity: salient
    salient = torch.ones(N, dtype=torch.bool, device="cuda")
    index, count, sim = cosine_saliency(ctx, cache, tau, out_salient=salient)
    r_index, r_count, r_sim = cosine_saliency_reference(ctx, cache, tau)
    n = int(count)
    assert torch.equal(salient.nonzero().flatten(), index[:n].long())  # the flags name the index's rows
    got, want = set(index[:n].tolist()), set(r_index[: int(r_count)].tolist())
    near = set(torch.nonzero((r_sim - tau).abs() < 1e-5).flatten().tolist())
    assert got ^ want <= near, f"flips away from tau: {sorted((got ^ want) - near)[:8]}"
    assert bool((index[n:] == INDEX_PAD).all())
    assert n < 2 or bool((index[1:n] > index[: n - 1]).all())
    assert torch.equal(sim.isnan(), r_sim.isnan())
    both = ~sim.isnan()
    assert float((sim[both] - r_sim[both]).abs().max()) < 1e-5
    assert 5 in got and 3 not in got
