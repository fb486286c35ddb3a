"""seer_kernels.mlp_sparsity / swiglu_sparsity: Triton (interpreter) against the torch reference,
an independent count, and torch eager's SwiGLU."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as torch_F
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_kernels import interpreting, kernel_backend
from seer_kernels.mlp_sparsity import (
    _block_sizes,
    _mlp_sparsity_triton,
    _swiglu_sparsity_triton,
    mlp_sparsity,
    mlp_sparsity_reference,
    swiglu_sparsity,
    swiglu_sparsity_reference,
)
from tests.tolerances import assert_close

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.mlp_sparsity,
    # silu's exp(-x) overflows fp32 for x < -88 by design (silu -> -0); the interpreter's numpy
    # cast says so on every such element
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
]

DTYPES = [torch.float32, torch.float16]
# [..., T, F]: rows of 1-3 tokens, F = 1, 7, a block edge +- 1, 1000 (not a power of two),
# and a real intermediate size kept short in T; 0, 1 and 2 leading dims
SHAPES = [
    (1, 1),
    (3, 1),
    (2, 7),
    (1, 3, 7),
    (2, 2, 129),
    (2, 127),
    (1, 2, 128),
    (2, 1, 3, 33),
    (1, 3, 1000),
    (2, 12288),
]


def _exactly_equal(actual: torch.Tensor, expected: torch.Tensor, msg: str = ""):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{msg}\n{m}")


def _activation(shape, dtype, eps, seed=0):
    """Random values around eps with exact hits on the edges: +-eps, zeros, NaN, +-inf."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g) * (2 * eps if eps > 0 else 1.0)
    flat = a.view(-1)
    n = flat.numel()
    if n:
        idx = torch.randperm(n, generator=g)
        special = [eps, -eps, 0.0, -0.0, float("nan"), float("inf"), float("-inf")]
        for j, v in zip(idx[: len(special)].tolist(), special):
            flat[j] = v
    return a.to(dtype)


def _count_fraction(act: torch.Tensor, eps: float) -> torch.Tensor:
    """Independent count in fp64: |a| < fp32(eps), NaN never counts, fraction rounded once."""
    eps32 = float(np.float32(eps))
    a = act.double().abs()
    count = (a < eps32).sum(-1).double()
    return (count / act.shape[-1]).float()


def _both_backends(fn, *args, **kwargs):
    with kernel_backend("triton"):
        tri = fn(*args, **kwargs)
    with kernel_backend("reference"):
        ref = fn(*args, **kwargs)
    return tri, ref


def test_interpreter_is_on():
    # every other test here means "Triton in the interpreter" only if this holds
    assert interpreting()


def test_triton_path_does_not_call_the_reference(monkeypatch):
    # importlib, not "import ... as": that form may resolve to the package attribute (the function)
    module = importlib.import_module("seer_kernels.mlp_sparsity")

    def boom(*args, **kwargs):
        raise AssertionError("the reference ran on the triton backend")

    monkeypatch.setattr(module, "mlp_sparsity_reference", boom)
    monkeypatch.setattr(module, "swiglu_sparsity_reference", boom)
    x = torch.randn(2, 3, 5)
    with kernel_backend("triton"):
        module.mlp_sparsity(x, 0.5)
        module.swiglu_sparsity(x, x, 0.5)
    with kernel_backend("reference"), pytest.raises(AssertionError, match="reference ran"):
        module.mlp_sparsity(x, 0.5)


# ----------------------------------------------------------------------------- mlp_sparsity


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_mlp_sparsity_matches_reference_and_count(shape, dtype):
    eps = 0.25
    act = _activation(shape, dtype, eps, seed=len(shape) * 1000 + shape[-1])
    tri, ref = _both_backends(mlp_sparsity, act, eps)
    assert tri.dtype == torch.float32 and tri.shape == act.shape[:-1]
    _exactly_equal(tri, ref, "triton vs reference")
    _exactly_equal(ref, _count_fraction(act, eps), "reference vs independent fp64 count")


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_mlp_sparsity_threshold_edges(backend):
    eps = 0.5
    below = float(np.nextafter(np.float32(eps), np.float32(0)))
    row = [eps, -eps, below, -below, 0.0, -0.0, float("nan"), float("inf"), float("-inf"), 7.0]
    act = torch.tensor([row], dtype=torch.float32)
    with kernel_backend(backend):
        # strict <: exactly eps is not below; NaN never counts; +-inf never below a finite eps
        assert mlp_sparsity(act, eps).tolist() == [np.float32(4 / 10)]
        assert mlp_sparsity(act, 0.0).tolist() == [0.0]
        # inf: every non-NaN finite value counts
        assert mlp_sparsity(act, math.inf).tolist() == [np.float32(7 / 10)]
        # ints and numpy scalars are accepted as thresholds
        assert mlp_sparsity(act, 1).tolist() == [np.float32(6 / 10)]
        assert mlp_sparsity(act, np.float32(1.0)).tolist() == [np.float32(6 / 10)]


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_mlp_sparsity_eps_is_rounded_to_fp32(backend):
    eps = 0.7  # fp32(0.7) < 0.7: compared in fp64, fp32(0.7) would count as below eps
    e32 = np.float32(eps)
    assert float(e32) < eps
    act = torch.tensor([[float(e32), float(np.nextafter(e32, np.float32(0)))]], dtype=torch.float32)
    with kernel_backend(backend):
        assert mlp_sparsity(act, eps).tolist() == [0.5]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(), (3,), (2, 2)])
def test_mlp_sparsity_lengths_nan_fill(lead, dtype):
    F = 7
    block_t, _, _ = _block_sizes(1000, F)
    T = 2 * block_t + 1  # three token blocks; lengths land on and around their edges
    assert _block_sizes(T, F)[0] == block_t
    act = _activation((*lead, T, F), dtype, 0.3, seed=T)
    choices = torch.tensor([0, 1, block_t - 1, block_t, block_t + 1, T - 1, T])
    n_rows = math.prod(lead)
    lengths = choices[torch.arange(n_rows) % len(choices)].reshape(lead)
    for ldtype in (torch.int32, torch.int64):
        tri, ref = _both_backends(mlp_sparsity, act, 0.3, lengths=lengths.to(ldtype))
        _exactly_equal(tri, ref)
        full = mlp_sparsity_reference(act, 0.3)
        pos = torch.arange(T)
        valid = pos < lengths.unsqueeze(-1)
        assert torch.isnan(tri[~valid]).all()
        _exactly_equal(tri[valid], full[valid])


def test_mlp_sparsity_lengths_2d_input_takes_0d_lengths():
    act = _activation((9, 5), torch.float32, 0.3)
    tri, ref = _both_backends(mlp_sparsity, act, 0.3, lengths=torch.tensor(4))
    _exactly_equal(tri, ref)
    assert not torch.isnan(tri[:4]).any() and torch.isnan(tri[4:]).all()


@pytest.mark.parametrize("shape", [(0, 4, 8), (2, 0, 8), (0, 8), (3, 0, 0, 8)])
def test_mlp_sparsity_empty(shape):
    act = torch.randn(shape)
    tri, ref = _both_backends(mlp_sparsity, act, 0.3)
    assert tri.shape == ref.shape == act.shape[:-1] and tri.dtype == torch.float32


def test_mlp_sparsity_strided_inputs():
    base = _activation((3, 12, 40), torch.float32, 0.3)
    tokens_strided = base[:, 2:9, :33]  # token and row strides, last dim contiguous
    not_mergeable = base.transpose(0, 1)[:, :, :17].unflatten(0, (3, 4))  # copied by reshape
    for act in (tokens_strided, not_mergeable):
        tri, ref = _both_backends(mlp_sparsity, act, 0.3)
        _exactly_equal(tri, ref)
        _exactly_equal(tri, _count_fraction(act, 0.3))


def test_mlp_sparsity_bitwise_repeatable():
    act = _activation((3, 5, 129), torch.float16, 0.2)
    lengths = torch.tensor([5, 2, 0])
    with kernel_backend("triton"):
        first = mlp_sparsity(act, 0.2, lengths=lengths)
        second = mlp_sparsity(act, 0.2, lengths=lengths)
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))


def test_mlp_sparsity_out_of_range_lengths_in_kernel_give_nan_rows():
    # on CUDA lengths are not range-checked (no host sync): the kernel must not clamp them
    act = _activation((3, 6, 9), torch.float32, 0.3)
    out = torch.empty(3, 6)
    _mlp_sparsity_triton(act, 0.3, torch.tensor([-1, 7, 4]), out)
    assert torch.isnan(out[:2]).all()
    _exactly_equal(out[2], mlp_sparsity_reference(act[2:], 0.3, lengths=torch.tensor([4]))[0])


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(
    rows=st.integers(0, 3),
    T=st.integers(0, 5),
    F=st.integers(1, 300),
    eps=st.sampled_from([0.0, 0.05, 0.5, 3.0]),
    with_lengths=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_mlp_sparsity_property_matches_reference(rows, T, F, eps, with_lengths, seed):
    act = _activation((rows, T, F), torch.float16, max(eps, 0.1), seed=seed)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (rows,), generator=g) if with_lengths else None
    tri, ref = _both_backends(mlp_sparsity, act, eps, lengths=lengths)
    _exactly_equal(tri, ref)


# -------------------------------------------------------------------------- swiglu_sparsity


def _swiglu_model(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """numpy model of the contract: silu in fp32 (correctly rounded exp) rounded to the dtype,
    then the product in fp32 rounded to the dtype."""
    np_dtype = {torch.float32: np.float32, torch.float16: np.float16}[gate.dtype]
    g = gate.float().numpy()
    u = up.float().numpy()
    with np.errstate(over="ignore"):
        e = np.exp(-g.astype(np.float64)).astype(np.float32)
    silu = (g / (np.float32(1) + e)).astype(np_dtype).astype(np.float32)
    return torch.from_numpy((silu * u).astype(np_dtype))


def _gate_up(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(shape, generator=g) * 4
    up = torch.randn(shape, generator=g)
    flat = gate.view(-1)
    if flat.numel() > 4:  # silu's far tails: exp overflow (-> -0) and exp underflow (-> x)
        flat[:4] = torch.tensor([-100.0, 100.0, -20.0, 0.0])
    return gate.to(dtype), up.to(dtype)


@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (1, 3, 129), (2, 2, 1000), (2, 1, 3, 33)])
def test_swiglu_fp16_is_bitwise_torch_eager(shape):
    gate, up = _gate_up(shape, torch.float16, seed=shape[-1])
    with kernel_backend("triton"):
        product, sparsity = swiglu_sparsity(gate, up, 0.05)
    eager = torch_F.silu(gate) * up
    assert product.dtype == torch.float16
    mismatches = (product.view(torch.int16) != eager.view(torch.int16)).sum().item()
    assert mismatches == 0, f"{mismatches} fp16 products differ from torch eager"
    assert torch.equal(product.view(torch.int16), _swiglu_model(gate, up).view(torch.int16))


@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (1, 3, 129), (2, 2, 1000)])
def test_swiglu_fp32_rounding_steps(shape):
    gate, up = _gate_up(shape, torch.float32, seed=shape[-1])
    with kernel_backend("triton"):
        product, _ = swiglu_sparsity(gate, up, 0.05)
    # bitwise: the same rounding steps as the model (torch CPU's fp32 exp is not correctly
    # rounded, so against torch eager fp32 the table's fp32 tolerance applies)
    assert torch.equal(product.view(torch.int32), _swiglu_model(gate, up).view(torch.int32))
    assert_close(product, torch_F.silu(gate) * up, msg="fp32 product vs torch eager")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (2, 7), (1, 3, 129), (2, 2, 1000), (1, 18944)])
def test_swiglu_sparsity_is_mlp_sparsity_of_product(shape, dtype):
    gate, up = _gate_up(shape, dtype, seed=7)
    eps = 0.05
    lengths = torch.full(shape[:-2], shape[-2] - 1) if len(shape) > 2 else None
    with kernel_backend("triton"):
        product, sparsity = swiglu_sparsity(gate, up, eps, lengths=lengths)
        unfused = mlp_sparsity(product, eps, lengths=lengths)
    assert torch.equal(sparsity.view(torch.int32), unfused.view(torch.int32))
    _exactly_equal(sparsity, mlp_sparsity_reference(product, eps, lengths=lengths))
    if dtype == torch.float16:  # bitwise product: the reference's sparsity is the same too
        _, ref_sparsity = swiglu_sparsity_reference(gate, up, eps, lengths=lengths)
        _exactly_equal(sparsity, ref_sparsity)


def test_swiglu_sparsity_counts_the_rounded_product():
    # products that are below eps in fp32 but round up to eps in fp16 (and so are not below it)
    eps = float(np.float16(0.05))
    gate = torch.linspace(0.5, 3.0, 256).half()
    up = torch.linspace(0.01, 0.2, 512).half()
    g, u = torch.meshgrid(gate, up, indexing="ij")
    silu = _swiglu_model(g, torch.ones_like(u))  # silu rounded to fp16, as the kernel does
    exact = silu.float() * u.float()  # the fp32 product of two fp16 values is exact
    straddle = (exact < eps) & (exact.half().float() >= eps)
    assert straddle.sum() >= 8, "no straddling products in the grid"
    picked = torch.nonzero(straddle)[:64]
    gate_row = g[picked[:, 0], picked[:, 1]].reshape(1, -1)
    up_row = u[picked[:, 0], picked[:, 1]].reshape(1, -1)
    with kernel_backend("triton"):
        product, sparsity = swiglu_sparsity(gate_row, up_row, eps)
    assert sparsity.tolist() == [0.0]  # none of them is below eps once rounded
    assert torch.equal(sparsity, mlp_sparsity_reference(product, eps))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_lengths_product_everywhere_sparsity_nan_after(dtype):
    F = 9
    block_t, _, _ = _block_sizes(1000, F)
    T = block_t + 2
    assert _block_sizes(T, F)[0] == block_t
    gate, up = _gate_up((4, T, F), dtype, seed=3)
    lengths = torch.tensor([0, block_t - 1, block_t + 1, T], dtype=torch.int32)
    with kernel_backend("triton"):
        product, sparsity = swiglu_sparsity(gate, up, 0.1, lengths=lengths)
        full_product, full_sparsity = swiglu_sparsity(gate, up, 0.1)
    assert torch.equal(product, full_product)  # every token's product is written
    valid = torch.arange(T) < lengths[:, None]
    assert torch.isnan(sparsity[~valid]).all()
    _exactly_equal(sparsity[valid], full_sparsity[valid])
    _, ref_sparsity = swiglu_sparsity_reference(gate, up, 0.1, lengths=lengths)
    if dtype == torch.float16:
        _exactly_equal(sparsity, ref_sparsity)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_swiglu_out_buffer(backend):
    gate, up = _gate_up((2, 5, 33), torch.float16, seed=1)
    buffer = torch.full((2, 8, 40), 7.0, dtype=torch.float16)
    out = buffer[:, 1:6, 3:36]  # strided rows and tokens, contiguous last dim
    with kernel_backend(backend):
        product, sparsity = swiglu_sparsity(gate, up, 0.1, out=out)
        expected, expected_sparsity = swiglu_sparsity(gate, up, 0.1)
    assert product.data_ptr() == out.data_ptr()
    assert torch.equal(out, expected)
    _exactly_equal(sparsity, expected_sparsity)
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, 1:6, 3:36] = False
    assert (buffer[outside] == 7.0).all()  # nothing written outside the view


def test_swiglu_bitwise_repeatable():
    gate, up = _gate_up((2, 3, 129), torch.float16, seed=5)
    with kernel_backend("triton"):
        p1, s1 = swiglu_sparsity(gate, up, 0.1, lengths=torch.tensor([3, 1]))
        p2, s2 = swiglu_sparsity(gate, up, 0.1, lengths=torch.tensor([3, 1]))
    assert torch.equal(p1.view(torch.int16), p2.view(torch.int16))
    assert torch.equal(s1.view(torch.int32), s2.view(torch.int32))


@pytest.mark.parametrize("shape", [(0, 4, 8), (2, 0, 8), (0, 8)])
def test_swiglu_empty(shape):
    gate, up = torch.randn(shape), torch.randn(shape)
    (tp, ts), (rp, rs) = _both_backends(swiglu_sparsity, gate, up, 0.1)
    assert tp.shape == rp.shape == gate.shape
    assert ts.shape == rs.shape == gate.shape[:-1]


def test_swiglu_out_of_range_lengths_in_kernel_give_nan_rows():
    gate, up = _gate_up((3, 4, 9), torch.float32, seed=2)
    product = torch.empty_like(gate)
    sparsity = torch.empty(3, 4)
    _swiglu_sparsity_triton(gate, up, 0.1, torch.tensor([-1, 5, 2]), product, sparsity)
    assert torch.isnan(sparsity[:2]).all() and not torch.isnan(sparsity[2, :2]).any()
    assert torch.equal(product, _swiglu_model(gate, up))  # the product is still complete


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_mlp_sparsity_rejects_bad_input(backend):
    x = torch.randn(2, 3, 4)
    with kernel_backend(backend):
        with pytest.raises(TypeError, match="act"):
            mlp_sparsity(x.numpy(), 0.1)
        with pytest.raises(TypeError, match="act"):
            mlp_sparsity(x.to(torch.int32), 0.1)
        with pytest.raises(ValueError, match="act"):
            mlp_sparsity(torch.randn(4), 0.1)
        with pytest.raises(ValueError, match="act"):
            mlp_sparsity(torch.randn(2, 3, 0), 0.1)
        with pytest.raises(ValueError, match="act"):
            mlp_sparsity(torch.randn(2, 4, 3).transpose(1, 2), 0.1)
        with pytest.raises(ValueError, match="eps"):
            mlp_sparsity(x, -0.1)
        with pytest.raises(ValueError, match="eps"):
            mlp_sparsity(x, math.nan)
        with pytest.raises(TypeError, match="eps"):
            mlp_sparsity(x, "0.1")
        with pytest.raises(TypeError, match="eps"):
            mlp_sparsity(x, True)
        with pytest.raises(ValueError, match="lengths"):
            mlp_sparsity(x, 0.1, lengths=torch.tensor([3, 3, 3]))
        with pytest.raises(TypeError, match="lengths"):
            mlp_sparsity(x, 0.1, lengths=torch.tensor([3.0, 3.0]))
        with pytest.raises(ValueError, match="lengths"):
            mlp_sparsity(x, 0.1, lengths=torch.tensor([3, 4]))
        with pytest.raises(ValueError, match="lengths"):
            mlp_sparsity(x, 0.1, lengths=torch.tensor([-1, 2]))
        with pytest.raises(ValueError, match="lengths"):
            mlp_sparsity(x, 0.1, lengths=torch.tensor([1, 2], device="meta"))


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_swiglu_rejects_bad_input(backend):
    g = torch.randn(2, 3, 4)
    with kernel_backend(backend):
        with pytest.raises(ValueError, match="up"):
            swiglu_sparsity(g, torch.randn(2, 3, 5), 0.1)
        with pytest.raises(TypeError, match="up"):
            swiglu_sparsity(g, g.half(), 0.1)
        with pytest.raises(ValueError, match="gate"):
            swiglu_sparsity(torch.randn(2, 0), torch.randn(2, 0), 0.1)
        with pytest.raises(TypeError, match="gate"):
            swiglu_sparsity(g.to(torch.int64), g.to(torch.int64), 0.1)
        with pytest.raises(ValueError, match="eps"):
            swiglu_sparsity(g, g, -1.0)
        with pytest.raises(ValueError, match="out"):
            swiglu_sparsity(g, g, 0.1, out=torch.empty(2, 3, 5))
        with pytest.raises(ValueError, match="out"):
            swiglu_sparsity(g, g, 0.1, out=torch.empty(2, 3, 4, dtype=torch.float16))
        with pytest.raises(ValueError, match="out"):
            swiglu_sparsity(g, g, 0.1, out=torch.empty(2, 4, 3).transpose(1, 2))
        g4 = torch.randn(2, 2, 3, 4)
        with pytest.raises(ValueError, match="out"):  # leading dims that cannot merge into one
            swiglu_sparsity(g4, g4, 0.1, out=torch.empty(2, 2, 3, 4).transpose(0, 1))
        with pytest.raises(ValueError, match="lengths"):
            swiglu_sparsity(g, g, 0.1, lengths=torch.tensor([4, 1]))
        with pytest.raises(ValueError, match="out"):
            swiglu_sparsity(g, g, 0.1, out=torch.empty(2, 3, 4, device="meta"))
