"""gather_rows / scatter_rows / exchange_rows compiled on CUDA in bf16: bitwise against the torch reference,
with the index and count straight from cosine_saliency (device-side count)."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import (
    cosine_saliency,
    exchange_rows,
    exchange_rows_reference,
    gather_rows,
    gather_rows_reference,
    scatter_rows,
    scatter_rows_reference,
)
from tests.kernels.cuda import requires_cuda
from tests.kernels.test_cosine_saliency import _pair

pytestmark = [pytest.mark.gpu, pytest.mark.row_gather_scatter, requires_cuda]


@pytest.mark.parametrize("N, D", [(16 * 1256, 4096), (77, 1000)])
def test_bf16_bitwise(N, D):
    g = torch.Generator(device="cuda").manual_seed(N)
    src = torch.randn(N, D, device="cuda", generator=g).to(torch.bfloat16)
    ctx, cache = (t.cuda() for t in _pair((N, 256), torch.bfloat16, seed=N))
    index, count, _ = cosine_saliency(ctx, cache, 0.99)
    assert 0 < int(count) < N
    assert torch.equal(gather_rows(src, index, count), gather_rows_reference(src, index, count))
    upd = torch.randn(N, D, device="cuda", generator=g).to(torch.bfloat16)
    dst, dst_ref = src.clone(), src.clone()
    scatter_rows(dst, index, count, upd)
    scatter_rows_reference(dst_ref, index, count, upd)
    assert torch.equal(dst, dst_ref)
    table, table_ref = src.clone(), src.clone()
    assert torch.equal(exchange_rows(table, index, count, upd), exchange_rows_reference(table_ref, index, count, upd))
    assert torch.equal(table, table_ref)
    change = exchange_rows(table, index, count, src, delta=True)  # back to src: the change is src - upd
    assert torch.equal(change, exchange_rows_reference(table_ref, index, count, src, delta=True))
    assert torch.equal(table, table_ref)
