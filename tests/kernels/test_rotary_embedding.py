"""seer_kernels.rotary_embedding: the Triton kernel (interpreter, fp32/fp16) against the torch reference
(the models' own rotate-half RoPE) and fp64, in both precisions, by position and by row set: head
counts past the kernel's head block, odd half widths, counts 0 / 1 / all / mid, -1 padding, strides."""

from __future__ import annotations

import importlib

import pytest
import torch

from model_adapters.common import apply_rope, rope_cos_sin
from seer_kernels import gather_rows, kernel_backend, rotary_embedding, rotary_embedding_reference
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.interpreter, pytest.mark.rotary_embedding]

DTYPES = [torch.float32, torch.float16]
# (rows, heads, head_dim, table rows, count): one head, 17 heads (past a head block of 16), d = 2, 6, 128
CASES = [(1, 1, 2, 1, 1), (5, 3, 6, 9, 0), (7, 17, 8, 7, 7), (9, 2, 128, 300, 4), (12, 5, 10, 40, 11)]
case_ids = ["M{}-H{}-d{}-N{}-n{}".format(*c) for c in CASES]


def _inputs(m, h, d, n, count, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(m, h, d, generator=g)).to(dtype)
    cos, sin = rope_cos_sin(torch.randint(0, 4096, (n,), generator=g), d, 10000.0)
    index = torch.full((m,), -1, dtype=torch.int32)
    index[:count] = torch.randint(0, n, (count,), generator=g, dtype=torch.int32)
    return x, cos, sin, index


@pytest.mark.parametrize("case", CASES, ids=case_ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("full_precision", [True, False], ids=["fp32-rotation", "dtype-rotation"])
def test_by_position_matches_fp64_within_twice_torch_error(case, dtype, full_precision):
    m, h, d, _, _ = case
    x, cos, sin, _ = _inputs(*case, dtype, seed=m * h * d)
    by_row = torch.arange(m) % cos.shape[0]
    cos, sin = cos[by_row], sin[by_row]  # [m, d]: row j's angles
    out = rotary_embedding(x, cos, sin, full_precision=full_precision)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    exact = rotary_embedding_reference(x.double(), cos.double(), sin.double(), True)
    want = rotary_embedding_reference(x, cos, sin, full_precision)
    assert_within_baseline_error(out, want, exact, msg=f"{case} {dtype} {full_precision}")


@pytest.mark.parametrize("case", CASES, ids=case_ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("full_precision", [True, False], ids=["fp32-rotation", "dtype-rotation"])
def test_row_set_uses_the_indexed_angles(case, dtype, full_precision):
    m, h, d, n, count = case
    x, cos, sin, index = _inputs(*case, dtype, seed=m + h + d + n)
    out = rotary_embedding(x, cos, sin, full_precision=full_precision, index=index,
                           count=torch.tensor([count], dtype=torch.int32))
    assert torch.equal(out[count:], torch.zeros_like(out[count:])), "rows past the count must be zero"
    exact = rotary_embedding_reference(x.double(), cos.double(), sin.double(), True, index, count)
    want = rotary_embedding_reference(x, cos, sin, full_precision, index, count)
    assert_within_baseline_error(out, want, exact, msg=f"{case} {dtype} {full_precision}")


@pytest.mark.parametrize("full_precision", [True, False])
def test_the_reference_is_the_models_rope_bit_for_bit(full_precision):
    """With the count's rows of x zero past it (as row_linear leaves them), the row-set reference is
    what the sparse layer computed before the fused op: apply_rope with gathered cos/sin."""
    x, cos, sin, index = _inputs(8, 3, 16, 20, 5, torch.float16, seed=1)
    x[5:] = 0
    with kernel_backend("reference"):
        before = apply_rope(x, gather_rows(cos, index, 5), gather_rows(sin, index, 5), full_precision=full_precision)
        after = rotary_embedding(x, cos, sin, full_precision=full_precision, index=index, count=5)
        assert torch.equal(after, before)
        by_position = rotary_embedding(x, cos[:8], sin[:8], full_precision=full_precision)
        assert torch.equal(by_position, apply_rope(x, cos[:8], sin[:8], full_precision=full_precision))


def test_strided_inputs_and_int_counts():
    x, cos, sin, index = _inputs(6, 4, 12, 10, 4, torch.float32, seed=2)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # heads outermost in memory
    ct = cos.t().contiguous().t()  # column-major cos
    want = rotary_embedding(x, cos, sin, full_precision=True, index=index, count=4)
    assert torch.equal(rotary_embedding(xt, ct, sin, full_precision=True, index=index, count=4), want)
    assert torch.equal(rotary_embedding(x, cos, sin, full_precision=True, index=index,
                                        count=torch.tensor(4, dtype=torch.int64)), want)


def test_device_counts_outside_the_range_act_as_the_nearest_end():
    x, cos, sin, _ = _inputs(4, 2, 8, 6, 4, torch.float32, seed=3)
    index = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    none = rotary_embedding(x, cos, sin, full_precision=True, index=index, count=torch.tensor([-2], dtype=torch.int32))
    assert torch.equal(none, torch.zeros_like(x))
    full = rotary_embedding(x, cos, sin, full_precision=True, index=index, count=4)
    assert torch.equal(rotary_embedding(x, cos, sin, full_precision=True, index=index,
                                        count=torch.tensor([9], dtype=torch.int32)), full)


def test_empty_shapes():
    cos, sin = rope_cos_sin(torch.arange(3), 4, 10000.0)
    assert rotary_embedding(torch.randn(0, 2, 4), cos[:0], sin[:0], full_precision=True).shape == (0, 2, 4)
    assert rotary_embedding(torch.randn(3, 0, 4), cos, sin, full_precision=False).shape == (3, 0, 4)


def test_triton_path_does_not_call_the_reference(monkeypatch):
    module = importlib.import_module("seer_kernels.rotary_embedding")

    def boom(*args, **kwargs):
        raise AssertionError("the reference ran on the triton backend")

    monkeypatch.setattr(module, "rotary_embedding_reference", boom)
    x, cos, sin, _ = _inputs(3, 2, 4, 3, 3, torch.float32, seed=4)
    with kernel_backend("triton"):
        module.rotary_embedding(x, cos, sin, full_precision=True)
    with kernel_backend("reference"), pytest.raises(AssertionError, match="reference ran"):
        module.rotary_embedding(x, cos, sin, full_precision=True)
