"""varlen_attention compiled on CUDA against the fp64 reference within twice the error of torch
SDPA in the same dtype (flash-attention's rule, tests/tolerances.py), at adversarial shapes."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import varlen_attention, varlen_attention_reference
from tests.kernels.cuda import requires_cuda
from tests.kernels.test_varlen_attention import _make
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.gpu, pytest.mark.varlen_attention, requires_cuda]

# name -> (query lengths, key lengths or None for the same, H, Hk, d); --quick keeps the first two
CASES = {
    "edges": ([0, 1, 2, 17, 33, 63, 64, 65, 127, 128, 129], None, 8, 8, 128),
    "prefix_gqa": ([1, 16, 100, 256, 3], [1000, 1016, 987, 1256, 0], 32, 8, 128),
    "odd_head_dim": ([5, 77, 130], [5, 200, 131], 4, 2, 80),
    "head_dim_59": ([17, 33], [40, 33], 4, 1, 59),
    "head_dim_256": ([64, 9, 200], [64, 300, 150], 4, 4, 256),
}


def _check(q, k, v, cq, ck, lq, lk, dtype, msg):
    for causal in (False, True):
        got = varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=causal)
        exact = varlen_attention_reference(q.double(), k.double(), v.double(), cq, ck, 0, 0, causal=causal)
        torch_same = varlen_attention_reference(q, k, v, cq, ck, 0, 0, causal=causal, compute_dtype=dtype)
        assert torch.isfinite(got).all(), msg
        assert_within_baseline_error(got, torch_same, exact, msg=f"{msg} causal={causal}")


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_within_twice_torch_error(name, quick):
    if quick and name not in list(CASES)[:2]:
        pytest.skip("--quick keeps the first two shapes")
    lq, lk, heads, kv_heads, head_dim = CASES[name]
    lk = lq if lk is None else lk
    q, k, v, cq, ck = (t.cuda() for t in _make(lq, lk, heads, kv_heads, head_dim, torch.bfloat16))
    _check(q, k, v, cq, ck, lq, lk, torch.bfloat16, name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_matches_torch(dtype):
    lq, lk = [0, 1, 2, 17, 129, 300], [5, 1, 0, 17, 200, 1300]
    q, k, v, cq, ck = (t.cuda() for t in _make(lq, lk, 8, 2, 80, dtype))
    _check(q, k, v, cq, ck, lq, lk, dtype, str(dtype))
