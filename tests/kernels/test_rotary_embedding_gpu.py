"""rotary_embedding compiled on CUDA in bf16 (and fp16, fp32) at LLaDA-8B's (32 x 128, fp32 rotation)
and Dream-7B's (28 / 4 heads x 128, rotation in the dtype) shapes: against fp64 within twice torch's
error in the same dtype, by position and by row set, rows past the device count zero, and the op
replayed in a CUDA graph with the count changed between replays."""

from __future__ import annotations

import pytest
import torch

from model_adapters.common import rope_cos_sin
from seer_kernels import rotary_embedding, rotary_embedding_reference
from tests.kernels.cuda import requires_cuda
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.gpu, pytest.mark.rotary_embedding, requires_cuda]


def _inputs(m, h, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (2 * torch.randn(m, h, d, device="cuda", generator=g)).to(dtype)
    cos, sin = rope_cos_sin(torch.randint(0, 4096, (m,), device="cuda", generator=g), d, 500000.0)
    index = torch.randperm(m, device="cuda", generator=g).to(torch.int32)
    return x, cos, sin, index


@pytest.mark.parametrize("m, h, d, full_precision", [(4096, 32, 128, True), (4096, 28, 128, False),
                                                     (4096, 4, 128, False), (333, 5, 10, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_within_twice_torch_error(m, h, d, full_precision, dtype):
    x, cos, sin, index = _inputs(m, h, d, dtype, seed=m + h)
    exact = rotary_embedding_reference(x.double(), cos.double(), sin.double(), True)
    out = rotary_embedding(x, cos, sin, full_precision=full_precision)
    assert_within_baseline_error(out, rotary_embedding_reference(x, cos, sin, full_precision), exact,
                                 msg=f"{dtype} by position")
    for live in (0, 1, m // 5 + 3, m):
        count = torch.tensor([live], dtype=torch.int32, device="cuda")
        out = rotary_embedding(x, cos, sin, full_precision=full_precision, index=index, count=count)
        assert torch.equal(out[live:], torch.zeros_like(out[live:])), live
        exact = rotary_embedding_reference(x.double(), cos.double(), sin.double(), True, index, live)
        want = rotary_embedding_reference(x, cos, sin, full_precision, index, live)
        assert_within_baseline_error(out, want, exact, msg=f"{dtype} n={live}")


def test_replays_in_a_cuda_graph_with_the_count_on_the_device():
    x, cos, sin, index = _inputs(1024, 8, 128, torch.bfloat16, seed=7)
    count = torch.tensor([100], dtype=torch.int32, device="cuda")
    rotary_embedding(x, cos, sin, full_precision=True, index=index, count=count)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rotary_embedding(x, cos, sin, full_precision=True, index=index, count=count)
    for n in (3, 100, 1024, 0):
        count.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        live = torch.tensor([n], dtype=torch.int32, device="cuda")
        assert torch.equal(out, rotary_embedding(x, cos, sin, full_precision=True, index=index, count=live)), n
