"""row_linear compiled on CUDA in bf16 (and fp16, fp32) at LLaDA-8B's projection widths: against
fp64 within twice torch's error in the same dtype, rows past the device count zero, and the op
replayed in a CUDA graph with the count changed between replays."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import row_linear, row_linear_pair, row_linear_reference
from tests.kernels.cuda import requires_cuda
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.gpu, pytest.mark.row_linear, requires_cuda]


def _inputs(cap, K, N, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(cap, K, device="cuda", generator=g).to(dtype)
    weight = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).to(dtype)
    bias = torch.randn(N, device="cuda", generator=g).to(dtype)
    return x, weight, bias


# (capacity, K, N): LLaDA-8B's K/V projection and FFN up projection, and a shape off every tile
@pytest.mark.parametrize("cap, K, N", [(1024, 4096, 4096), (1024, 4096, 12288), (333, 1000, 700)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_within_twice_torch_error(cap, K, N, dtype):
    x, weight, bias = _inputs(cap, K, N, dtype, seed=cap + N)
    for n in (0, 1, cap // 5 + 3, cap):
        count = torch.tensor([n], dtype=torch.int32, device="cuda")
        for b in (bias, None):
            out = row_linear(x, weight, b, count)
            assert torch.equal(out[n:], torch.zeros_like(out[n:])), (n, b is None)
            exact = row_linear_reference(x.double(), weight.double(), None if b is None else b.double(), n)
            assert_within_baseline_error(out, row_linear_reference(x, weight, b, n), exact, msg=f"{dtype} n={n}")


@pytest.mark.parametrize("cap, K, N", [(1024, 4096, 1024), (1024, 4096, 12288), (333, 1000, 700)])
def test_pair_within_twice_torch_error(cap, K, N):
    """row_linear_pair in bf16 at LLaDA-8B's K/V and gate/up widths: each output within twice
    torch's error of fp64, rows past the device count zero."""
    x, weight_a, bias_a = _inputs(cap, K, N, torch.bfloat16, seed=cap + N + 1)
    _, weight_b, _ = _inputs(cap, K, N, torch.bfloat16, seed=cap + N + 2)
    for n in (0, 1, cap // 3 + 1, cap):
        count = torch.tensor([n], dtype=torch.int32, device="cuda")
        out_a, out_b = row_linear_pair(x, weight_a, bias_a, weight_b, None, count)
        for out, w, b in ((out_a, weight_a, bias_a), (out_b, weight_b, None)):
            assert torch.equal(out[n:], torch.zeros_like(out[n:])), n
            exact = row_linear_reference(x.double(), w.double(), None if b is None else b.double(), n)
            assert_within_baseline_error(out, row_linear_reference(x, w, b, n), exact, msg=f"pair n={n}")


def test_replays_in_a_cuda_graph_with_the_count_on_the_device():
    x, weight, bias = _inputs(512, 1024, 768, torch.bfloat16, seed=7)
    count = torch.tensor([100], dtype=torch.int32, device="cuda")
    row_linear(x, weight, bias, count)  # autotunes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = row_linear(x, weight, bias, count)
    for n in (3, 100, 512, 0):
        count.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, row_linear(x, weight, bias, torch.tensor([n], dtype=torch.int32, device="cuda"))), n
