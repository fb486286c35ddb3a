"""seer_kernels.row_linear: the Triton GEMM (interpreter, fp32/fp16) against the torch reference
and fp64, on counts 0, 1, the capacity and in between, K and N off the tile and off powers of two."""

from __future__ import annotations

import importlib

import pytest
import torch

from seer_kernels import kernel_backend, row_linear, row_linear_pair, row_linear_pair_reference, row_linear_reference
from seer_kernels.row_linear import _CONFIGS
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.interpreter, pytest.mark.row_linear]

BM, BN, BK = (_CONFIGS[0].kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
DTYPES = [torch.float32, torch.float16]

# (capacity, K, N, count): tile edges on every axis, counts 0 / 1 / capacity / mid-tile
CASES = [
    (1, 1, 1, 1),
    (1, 5, 3, 0),
    (BM, BK, BN, BM),
    (BM + 1, BK + 1, BN + 1, 1),
    (2 * BM + 5, 3 * BK - 3, 2 * BN + 7, BM + 3),
    (3 * BM + 2, 45, 23, 3 * BM + 2),
    (2 * BM + 9, 2 * BK, 19, 2 * BM),
]
case_ids = ["cap{}-K{}-N{}-n{}".format(*c) for c in CASES]


def _inputs(cap, K, N, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(cap, K, generator=g).to(dtype)
    weight = (torch.randn(N, K, generator=g) / max(K, 1) ** 0.5).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    return x, weight, bias


def _count(kind, n):
    return {"int": n, "i32": torch.tensor([n], dtype=torch.int32), "i64": torch.tensor(n, dtype=torch.int64)}[kind]


@pytest.mark.parametrize("case", CASES, ids=case_ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_matches_fp64_within_twice_torch_error(case, dtype, with_bias):
    cap, K, N, n = case
    x, weight, bias = _inputs(cap, K, N, dtype, seed=cap * K + N)
    bias = bias if with_bias else None
    count = _count("i32", n)
    out = row_linear(x, weight, bias, count)
    assert out.shape == (cap, N) and out.dtype == dtype
    assert torch.equal(out[n:], torch.zeros(cap - n, N, dtype=dtype)), "rows past the count must be zero"
    exact = row_linear_reference(x.double(), weight.double(), None if bias is None else bias.double(), n)
    assert_within_baseline_error(out, row_linear_reference(x, weight, bias, n), exact, msg=f"{case} {dtype}")


@pytest.mark.parametrize("count_kind", ["int", "i32", "i64"])
def test_count_forms_agree(count_kind):
    x, weight, bias = _inputs(2 * BM + 1, 20, 9, torch.float32, seed=1)
    want = row_linear(x, weight, bias, 5)
    assert torch.equal(row_linear(x, weight, bias, _count(count_kind, 5)), want)
    assert torch.equal(want[5:], torch.zeros_like(want[5:]))


def test_strided_inputs():
    x, weight, bias = _inputs(2 * BM + 3, 2 * BK + 1, BN + 5, torch.float16, seed=2)
    xt = x.t().contiguous().t()  # column-major x
    wt = torch.cat([weight, weight], dim=1)[:, ::2]  # weight with a column stride of 2
    got = row_linear(xt, wt, bias, torch.tensor([BM + 2], dtype=torch.int32))
    assert torch.equal(got, row_linear(x, wt.contiguous(), bias, BM + 2))


def test_device_counts_outside_the_range_act_as_the_nearest_end():
    x, weight, bias = _inputs(BM + 3, 7, 5, torch.float32, seed=3)
    assert torch.equal(row_linear(x, weight, bias, torch.tensor([-4], dtype=torch.int32)), torch.zeros(BM + 3, 5))
    full = row_linear(x, weight, bias, BM + 3)
    assert torch.equal(row_linear(x, weight, bias, torch.tensor([BM + 40], dtype=torch.int32)), full)
    with kernel_backend("reference"):
        assert torch.equal(row_linear(x, weight, bias, torch.tensor([-4], dtype=torch.int32)), torch.zeros(BM + 3, 5))


def test_empty_shapes():
    for cap, K, N in [(0, 4, 3), (4, 4, 0), (4, 0, 3)]:
        x, weight, bias = _inputs(cap, K, N, torch.float32, seed=4)
        n = min(cap, 2)
        out = row_linear(x, weight, bias, n)
        assert out.shape == (cap, N)
        assert torch.equal(out, row_linear_reference(x, weight, bias, n))


def test_triton_path_does_not_call_the_reference(monkeypatch):
    module = importlib.import_module("seer_kernels.row_linear")

    def boom(*args, **kwargs):
        raise AssertionError("the reference ran on the triton backend")

    monkeypatch.setattr(module, "row_linear_reference", boom)
    x, weight, bias = _inputs(5, 4, 3, torch.float32, seed=5)
    with kernel_backend("triton"):
        module.row_linear(x, weight, bias, 2)
    with kernel_backend("reference"), pytest.raises(AssertionError, match="reference ran"):
        module.row_linear(x, weight, bias, 2)


BIASES = ["both", "a", "b", "none"]


@pytest.mark.parametrize("case,biases", [(c, BIASES[i % len(BIASES)]) for i, c in enumerate(CASES)],
                         ids=[f"{i}-{BIASES[j % len(BIASES)]}" for j, i in enumerate(case_ids)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pair_is_two_row_linears_bit_for_bit(case, dtype, biases):
    """One launch, both projections: each output equals row_linear of its weight (the same tile
    code and, under the interpreter, the same tiles), on every backend."""
    cap, K, N, n = case
    x, weight_a, bias_a = _inputs(cap, K, N, dtype, seed=cap + 2 * K + N)
    _, weight_b, bias_b = _inputs(cap, K, N, dtype, seed=cap + 2 * K + N + 1)
    bias_a = bias_a if biases in ("both", "a") else None
    bias_b = bias_b if biases in ("both", "b") else None
    count = _count("i32", n)
    for backend in ("auto", "reference"):
        with kernel_backend(backend):
            out_a, out_b = row_linear_pair(x, weight_a, bias_a, weight_b, bias_b, count)
            assert torch.equal(out_a, row_linear(x, weight_a, bias_a, count)), backend
            assert torch.equal(out_b, row_linear(x, weight_b, bias_b, count)), backend
    ref_a, ref_b = row_linear_pair_reference(x, weight_a, bias_a, weight_b, bias_b, n)
    assert torch.equal(ref_a, row_linear_reference(x, weight_a, bias_a, n))
    assert torch.equal(ref_b, row_linear_reference(x, weight_b, bias_b, n))


def test_pair_with_strided_weights_and_int_counts():
    x, weight_a, bias_a = _inputs(2 * BM + 3, 2 * BK + 1, BN + 5, torch.float16, seed=6)
    weight_b = torch.cat([weight_a, weight_a.flip(0)], dim=1)[:, ::2]  # a column stride of 2
    for n in (0, 1, BM + 2, 2 * BM + 3):
        out_a, out_b = row_linear_pair(x.t().contiguous().t(), weight_a, bias_a, weight_b, None, n)
        assert torch.equal(out_a, row_linear(x, weight_a, bias_a, n))
        assert torch.equal(out_b, row_linear(x, weight_b.contiguous(), None, n))


def _call(**changes):
    args = dict(x=torch.randn(6, 4), weight=torch.randn(3, 4), bias=torch.randn(3), count=2)
    args.update(changes)
    return lambda: row_linear(args["x"], args["weight"], args["bias"], args["count"])


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (_call(x=torch.randn(6, 4).double()), TypeError, "x"),
        (_call(x=torch.randn(6)), ValueError, "x"),
        (_call(weight=torch.randn(3, 5)), ValueError, "weight"),
        (_call(weight=torch.randn(3, 4).half()), TypeError, "weight"),
        (_call(bias=torch.randn(4)), ValueError, "bias"),
        (_call(bias=torch.randn(3).half()), TypeError, "bias"),
        (_call(count=7), ValueError, "count"),
        (_call(count=-1), ValueError, "count"),
        (_call(count=2.0), TypeError, "count"),
        (_call(count=True), TypeError, "count"),
        (_call(count=torch.tensor([1, 2])), ValueError, "count"),
        (_call(count=torch.tensor([1.0])), ValueError, "count"),
        (_call(weight=torch.randn(3, 4, device="meta"), bias=None), ValueError, "device"),
    ],
)
def test_bad_inputs_name_the_argument(call, exc, name):
    with pytest.raises(exc, match=name):
        call()
