"""rms_norm compiled on CUDA in bf16 (and fp16, fp32) at LLaDA-8B's and Dream-7B's widths: against
fp64 within twice torch's error in the same dtype (every row and a row set), rows past the device
count zero, and the op replayed in a CUDA graph with the count changed between replays."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import rms_norm, rms_norm_reference
from tests.kernels.cuda import requires_cuda
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.gpu, pytest.mark.rms_norm, requires_cuda]


def _inputs(n, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (3 * torch.randn(n, d, device="cuda", generator=g)).to(dtype)
    weight = (1 + 0.5 * torch.randn(d, device="cuda", generator=g)).to(dtype)
    index = torch.randperm(n, device="cuda", generator=g).to(torch.int32)
    return x, weight, index


@pytest.mark.parametrize("n, d", [(4096, 4096), (4096, 3584), (333, 1000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_within_twice_torch_error(n, d, dtype):
    x, weight, index = _inputs(n, d, dtype, seed=n + d)
    exact = rms_norm_reference(x.double(), weight.double(), 1e-5)
    assert_within_baseline_error(rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), exact,
                                 msg=f"{dtype} every row")
    for live in (0, 1, n // 5 + 3, n):
        count = torch.tensor([live], dtype=torch.int32, device="cuda")
        out = rms_norm(x, weight, 1e-5, index=index, count=count)
        assert torch.equal(out[live:], torch.zeros_like(out[live:])), live
        exact = rms_norm_reference(x.double(), weight.double(), 1e-5, index, live)
        assert_within_baseline_error(out, rms_norm_reference(x, weight, 1e-5, index, live), exact,
                                     msg=f"{dtype} n={live}")


def test_replays_in_a_cuda_graph_with_the_count_on_the_device():
    x, weight, index = _inputs(1024, 4096, torch.bfloat16, seed=7)
    count = torch.tensor([100], dtype=torch.int32, device="cuda")
    rms_norm(x, weight, 1e-5, index=index, count=count)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rms_norm(x, weight, 1e-5, index=index, count=count)
    for n in (3, 100, 1024, 0):
        count.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        want = rms_norm(x, weight, 1e-5, index=index, count=torch.tensor([n], dtype=torch.int32, device="cuda"))
        assert torch.equal(out, want), n
