"""seer_kernels.rms_norm: the Triton kernel (interpreter, fp32/fp16) against the torch reference (the
models' own RMSNorm) and fp64, on every row and on row sets: widths off powers of two, counts 0, 1,
the capacity and in between, -1 padding past the count, strided rows, zero rows, mixed dtypes."""

from __future__ import annotations

import importlib

import pytest
import torch

from model_adapters.common import RMSNorm
from seer_kernels import gather_rows, kernel_backend, rms_norm, rms_norm_reference
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.interpreter, pytest.mark.rms_norm]

DTYPES = [torch.float32, torch.float16]
# (rows, width, capacity, count): a width of 1, odd widths, one past a power of two, counts 0 / 1 / all / mid
CASES = [(1, 1, 1, 1), (5, 3, 4, 0), (7, 33, 7, 7), (9, 64, 12, 5), (3, 257, 2, 1), (16, 1000, 20, 13)]
case_ids = ["N{}-D{}-cap{}-n{}".format(*c) for c in CASES]


def _inputs(n, d, cap, count, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(n, d, generator=g)).to(dtype)
    weight = (1 + 0.5 * torch.randn(d, generator=g)).to(dtype)
    index = torch.full((cap,), -1, dtype=torch.int32)
    index[:count] = torch.randint(0, n, (count,), generator=g, dtype=torch.int32)  # repeats allowed
    return x, weight, index


@pytest.mark.parametrize("case", CASES, ids=case_ids)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_matches_fp64_within_twice_torch_error(case, dtype):
    n, d, _, _ = case
    x, weight, _ = _inputs(*case, dtype, seed=n * d)
    out = rms_norm(x, weight, 1e-5)
    assert out.shape == (n, d) and out.dtype == dtype and out.is_contiguous()
    exact = rms_norm_reference(x.double(), weight.double(), 1e-5)
    assert_within_baseline_error(out, rms_norm_reference(x, weight, 1e-5), exact, msg=f"{case} {dtype}")


@pytest.mark.parametrize("case", CASES, ids=case_ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count_kind", ["int", "i32"])
def test_row_set_is_the_norm_of_the_gathered_rows(case, dtype, count_kind):
    n, d, cap, count = case
    x, weight, index = _inputs(*case, dtype, seed=n + d + cap)
    live = count if count_kind == "int" else torch.tensor([count], dtype=torch.int32)
    out = rms_norm(x, weight, 1e-6, index=index, count=live)
    assert out.shape == (cap, d) and out.dtype == dtype
    assert torch.equal(out[count:], torch.zeros(cap - count, d, dtype=dtype)), "rows past the count must be zero"
    exact = rms_norm_reference(x.double(), weight.double(), 1e-6, index, count)
    want = rms_norm_reference(x, weight, 1e-6, index, count)
    assert_within_baseline_error(out, want, exact, msg=f"{case} {dtype}")


def test_the_reference_is_the_models_rmsnorm_bit_for_bit():
    """The model's RMSNorm module calls the reference, and ``rows`` gives the same bits on the CPU as
    the module applied to gathered rows (what the sparse layer computed before the fused op)."""
    x, weight, index = _inputs(9, 24, 6, 4, torch.float32, seed=1)
    norm = RMSNorm(24, 1e-6)
    norm.weight.data.copy_(weight)
    with kernel_backend("reference"), torch.no_grad():
        assert torch.equal(norm(x), rms_norm_reference(x, weight, 1e-6))
        assert torch.equal(norm.rows(x), norm(x))
        assert torch.equal(norm.rows(x, index, 4), norm(gather_rows(x, index, 4)))


def test_strided_rows_zero_rows_and_promoted_dtype():
    x, weight, index = _inputs(8, 40, 5, 3, torch.float16, seed=2)
    wide = torch.cat([x, x], dim=1)[:, ::2]  # a column stride of 2
    assert torch.equal(rms_norm(wide, weight, 1e-5), rms_norm(wide.contiguous(), weight, 1e-5))
    zeros = torch.zeros(3, 40, dtype=torch.float16)
    assert torch.equal(rms_norm(zeros, weight, 1e-5), zeros)
    mixed = rms_norm(x, weight.float(), 1e-5)  # fp16 rows, fp32 weight: fp32 out, as torch's product
    assert mixed.dtype == torch.float32
    assert torch.equal(mixed, rms_norm_reference(x, weight.float(), 1e-5))


def test_device_counts_outside_the_range_act_as_the_nearest_end():
    x, weight, _ = _inputs(6, 8, 4, 4, torch.float32, seed=3)
    index = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    assert torch.equal(rms_norm(x, weight, 1e-6, index=index, count=torch.tensor([-3], dtype=torch.int32)),
                       torch.zeros(4, 8))
    full = rms_norm(x, weight, 1e-6, index=index, count=4)
    assert torch.equal(rms_norm(x, weight, 1e-6, index=index, count=torch.tensor([40], dtype=torch.int32)), full)


def test_empty_shapes():
    weight = torch.ones(5)
    assert rms_norm(torch.randn(0, 5), weight, 1e-6).shape == (0, 5)
    empty = torch.empty(0, dtype=torch.int32)
    assert rms_norm(torch.randn(3, 5), weight, 1e-6, index=empty, count=0).shape == (0, 5)


def test_triton_path_does_not_call_the_reference(monkeypatch):
    module = importlib.import_module("seer_kernels.rms_norm")

    def boom(*args, **kwargs):
        raise AssertionError("the reference ran on the triton backend")

    monkeypatch.setattr(module, "rms_norm_reference", boom)
    x, weight, _ = _inputs(4, 6, 2, 1, torch.float32, seed=4)
    with kernel_backend("triton"):
        module.rms_norm(x, weight, 1e-6)
    with kernel_backend("reference"), pytest.raises(AssertionError, match="reference ran"):
        module.rms_norm(x, weight, 1e-6)
