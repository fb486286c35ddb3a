"""seer_kernels.cosine_saliency: Triton (interpreter) against the torch reference and fp64 truth."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from seer_kernels import kernel_backend
from seer_kernels.cosine_saliency import _SIM_CONFIGS, INDEX_PAD, cosine_saliency, cosine_saliency_reference
from tests.tolerances import assert_within_baseline_error

pytestmark = [pytest.mark.interpreter, pytest.mark.cosine_saliency]

# the interpreter's tile: shapes below straddle its edges
BM = _SIM_CONFIGS[0].kwargs["BLOCK_M"]
BD = _SIM_CONFIGS[0].kwargs["BLOCK_D"]


def _pair(shape, dtype, seed=0):
    """ctx and a previous ctx whose per-row similarity spreads from ~0.3 to ~1 - 1e-6."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(shape, generator=g, dtype=torch.float64)
    noise = torch.randn(shape, generator=g, dtype=torch.float64)
    n = shape[0]
    amp = (
        torch.logspace(-3, 0.5, n, dtype=torch.float64)
        if n > 1
        else torch.full((n,), 0.2, dtype=torch.float64)
    )
    amp = amp[torch.randperm(n, generator=g)].view((n,) + (1,) * (len(shape) - 1))
    cache = (
        ctx * (0.5 + torch.rand(shape[:1], generator=g, dtype=torch.float64)).view(amp.shape) + amp * noise
    )
    return ctx.to(dtype), cache.to(dtype)


def _sim64(ctx, cache):
    a = ctx.flatten(1).double()
    b = cache.flatten(1).double()
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def _tau_with_margin(sim64, margin=1e-4):
    """A threshold in the widest gap of the middle half of the similarities (so that fp32
    rounding cannot flip a row), asserting the gap really is wider than ``margin``."""
    s = torch.sort(sim64).values
    if s.numel() < 2:
        tau = float(s[0]) + 0.01 if s.numel() else 0.9
        return tau
    lo, hi = s.numel() // 4, max(s.numel() * 3 // 4, s.numel() // 4 + 1)
    gaps = s[lo + 1 : hi + 1] - s[lo:hi]
    i = int(torch.argmax(gaps))
    assert float(gaps[i]) > 2 * margin, "test data has no usable gap"
    return float((s[lo + i] + s[lo + i + 1]) / 2)


def _expected_index(sim64, tau, capacity):
    rows = torch.nonzero(sim64 < tau).flatten().to(torch.int32)
    idx = torch.full((capacity,), INDEX_PAD, dtype=torch.int32)
    idx[: rows.numel()] = rows
    return idx, rows.numel()


SHAPES = [
    (1, 1),
    (1, 59),
    (2, 16),
    (BM - 1, BD),
    (BM, BD + 1),
    (BM + 1, BD - 1),
    (2 * BM + 1, 2 * BD + 1),
    (37, 130),
    (13, 3, 17),  # [N, H, d], flattened to D = 51
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference_and_fp64(shape, dtype):
    ctx, cache = _pair(shape, dtype, seed=sum(shape))
    sim64 = _sim64(ctx, cache)
    tau = _tau_with_margin(sim64)
    index, count, sim = cosine_saliency(ctx, cache, tau)
    r_index, r_count, r_sim = cosine_saliency_reference(ctx, cache, tau)

    assert index.dtype == torch.int32 and index.shape == (shape[0],)
    assert count.dtype == torch.int32 and count.shape == (1,)
    assert sim.dtype == torch.float32 and sim.shape == (shape[0],)
    exp_index, exp_count = _expected_index(sim64, tau, shape[0])
    assert int(count) == exp_count == int(r_count)
    assert torch.equal(index, exp_index)
    assert torch.equal(r_index, exp_index)
    assert_within_baseline_error(sim, r_sim, sim64, msg="similarity")


@pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning"
)  # numpy inf/inf in the interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_and_nonfinite_rows(dtype):
    D = BD + 3
    ctx, cache = _pair((10, D), dtype, seed=3)
    cache[0] = ctx[0]  # identical: sim 1
    ctx[1] = 0
    cache[1] = 0  # both zero: sim 1, not salient
    ctx[2] = 0  # one zero: sim 0, salient
    cache[3] = 0
    ctx[4, 5] = float("nan")
    cache[5, D - 1] = float("inf")
    ctx[6, 0] = float("-inf")
    cache[7] = -ctx[7]  # opposite: sim -1
    index, count, sim = cosine_saliency(ctx, cache, 0.5)
    r_index, r_count, r_sim = cosine_saliency_reference(ctx, cache, 0.5)
    assert sim[0] == pytest.approx(1.0, abs=1e-6) and sim[1] == 1.0
    assert sim[2] == 0.0 and sim[3] == 0.0
    assert sim[7] == pytest.approx(-1.0, abs=1e-6)
    finite = sim[~sim.isnan()]
    assert float(finite.min()) >= -1.0 and float(finite.max()) <= 1.0
    for row in (4, 5, 6):  # non-finite rows: NaN, always salient
        assert math.isnan(float(sim[row]))
    salient = set(index[: int(count)].tolist())
    assert {2, 3, 4, 5, 6, 7} <= salient and not {0, 1} & salient
    assert torch.equal(index, r_index) and torch.equal(count, r_count)
    assert torch.equal(sim.isnan(), r_sim.isnan())
    finite = ~sim.isnan()
    assert_within_baseline_error(sim[finite], r_sim[finite], r_sim[finite].double(), msg="edge similarity")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow inside the interpreter is the point
def test_fp32_norm_overflow_is_salient():
    ctx, cache = _pair((5, 30), torch.float32, seed=4)
    ctx[2] *= 1e30  # finite values whose squared norm overflows fp32
    cache[2] = ctx[2]
    index, count, sim = cosine_saliency(ctx, cache, -2.0)
    r_index, r_count, r_sim = cosine_saliency_reference(ctx, cache, -2.0)
    assert index[: int(count)].tolist() == [2] and math.isnan(float(sim[2]))
    assert torch.equal(index, r_index) and torch.equal(count, r_count) and math.isnan(float(r_sim[2]))


def test_both_zero_rows_salient_only_above_one():
    z = torch.zeros(3, 20)
    _, count, sim = cosine_saliency(z, z, 1.0)
    assert int(count) == 0 and torch.equal(sim, torch.ones(3))
    index, count, _ = cosine_saliency(z, z, 1.0 + 1e-3)
    assert int(count) == 3 and index.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "tau, expect_all", [(1.01, True), (math.inf, True), (-1.5, False), (-math.inf, False)]
)
def test_extreme_tau(tau, expect_all):
    ctx, cache = _pair((2 * BM + 3, 40), torch.float32, seed=5)
    cache[4] = ctx[4]
    ctx[6, 1] = float("nan")
    index, count, _ = cosine_saliency(ctx, cache, tau)
    r_index, r_count, _ = cosine_saliency_reference(ctx, cache, tau)
    N = ctx.shape[0]
    expected = list(range(N)) if expect_all else [6]  # a NaN row is salient whatever tau
    assert index[: int(count)].tolist() == expected
    assert torch.equal(index, r_index) and torch.equal(count, r_count)


@pytest.mark.parametrize("n_rows_kind", ["int", "tensor"])
@pytest.mark.parametrize("n_rows", [0, 1, BM, BM + 1, 21])
def test_n_rows_limits_rows(n_rows_kind, n_rows):
    N = 21
    ctx, cache = _pair((N, 33), torch.float32, seed=7)
    ctx[n_rows:] = float("nan")  # rows past n_rows must not be read (they would be salient)
    sim64 = _sim64(ctx[:n_rows], cache[:n_rows])
    tau = _tau_with_margin(sim64) if n_rows > 4 else 0.999999
    arg = n_rows if n_rows_kind == "int" else torch.tensor([n_rows], dtype=torch.int32)
    index, count, sim = cosine_saliency(ctx, cache, tau, n_rows=arg)
    r_index, r_count, r_sim = cosine_saliency_reference(ctx, cache, tau, n_rows=arg)
    exp_index, exp_count = _expected_index(
        torch.cat([sim64, torch.ones(N - n_rows, dtype=torch.float64)]), tau, N
    )
    assert int(count) == exp_count and torch.equal(index, exp_index)
    assert torch.equal(index, r_index) and torch.equal(count, r_count)
    assert torch.equal(sim[n_rows:], torch.ones(N - n_rows))
    assert not sim.isnan().any()
    torch.testing.assert_close(sim, r_sim, rtol=0, atol=1e-6)


@pytest.mark.parametrize("device_value, acts_as", [(-3, 0), (99, 21)])
def test_device_n_rows_out_of_range_acts_as_nearest_end(device_value, acts_as):
    ctx, cache = _pair((21, 16), torch.float32, seed=8)
    index, count, _ = cosine_saliency(ctx, cache, 2.0, n_rows=torch.tensor([device_value], dtype=torch.int32))
    r_index, r_count, _ = cosine_saliency_reference(
        ctx, cache, 2.0, n_rows=torch.tensor([device_value], dtype=torch.int32)
    )
    assert int(count) == acts_as and index[:acts_as].tolist() == list(range(acts_as))
    assert torch.equal(index, r_index) and torch.equal(count, r_count)


def test_empty_input():
    ctx = torch.empty(0, 8)
    index, count, sim = cosine_saliency(ctx, ctx, 0.9)
    assert index.shape == (0,) and sim.shape == (0,) and count.tolist() == [0]
    out_index = torch.full((5,), 42, dtype=torch.int32)
    index, count, _ = cosine_saliency(ctx, ctx, 0.9, out_index=out_index)
    assert index.data_ptr() == out_index.data_ptr() and index.tolist() == [INDEX_PAD] * 5 and int(count) == 0


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_out_buffers_are_filled_and_stale_contents_cleared(backend):
    N = 2 * BM + 5
    ctx, cache = _pair((N, 24), torch.float32, seed=11)
    sim64 = _sim64(ctx, cache)
    tau = _tau_with_margin(sim64)
    out_index = torch.full((N + 7,), 1234, dtype=torch.int32)
    out_count = torch.full((1,), 99, dtype=torch.int32)
    out_sim = torch.full((N,), -5.0)
    with kernel_backend(backend):
        index, count, sim = cosine_saliency(
            ctx, cache, tau, out_index=out_index, out_count=out_count, out_similarity=out_sim
        )
    assert index.data_ptr() == out_index.data_ptr()
    assert count.data_ptr() == out_count.data_ptr()
    assert sim.data_ptr() == out_sim.data_ptr()
    exp_index, exp_count = _expected_index(sim64, tau, N + 7)
    assert int(out_count) == exp_count and torch.equal(out_index, exp_index)
    torch.testing.assert_close(out_sim, sim64.float(), rtol=0, atol=1e-5)


def test_capacity_may_be_only_n_rows():
    ctx, cache = _pair((12, 16), torch.float32, seed=12)
    out_index = torch.empty(5, dtype=torch.int32)
    index, count, _ = cosine_saliency(ctx, cache, 2.0, n_rows=5, out_index=out_index)
    assert int(count) == 5 and index.tolist() == [0, 1, 2, 3, 4]


def test_noncontiguous_rows():
    big = torch.randn(2 * 17, 50)
    ctx = big[::2]  # row stride 100
    cache = (big[1::2] * 0.1 + big[::2]).t().contiguous().t()  # column-major
    sim64 = _sim64(ctx, cache)
    tau = _tau_with_margin(sim64, margin=1e-6)
    index, count, sim = cosine_saliency(ctx, cache, tau)
    exp_index, exp_count = _expected_index(sim64, tau, 17)
    assert int(count) == exp_count and torch.equal(index, exp_index)
    torch.testing.assert_close(sim, sim64.float(), rtol=0, atol=1e-5)


def test_bitwise_repeatable():
    ctx, cache = _pair((3 * BM + 2, 2 * BD + 9), torch.float16, seed=13)
    ctx[3, 3] = float("nan")
    tau = 0.95
    first = cosine_saliency(ctx, cache, tau)
    for _ in range(3):
        again = cosine_saliency(ctx, cache, tau)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))  # NaN-safe bitwise equality


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n=st.integers(0, 3 * BM + 1),
    d=st.integers(1, BD + 5),
    tau=st.floats(-0.5, 1.2),
    seed=st.integers(0, 2**16),
    n_rows=st.one_of(st.none(), st.integers(0, 3 * BM + 1)),
)
def test_property_matches_reference(n, d, tau, seed, n_rows):
    if n_rows is not None:
        n_rows = min(n_rows, n)
    ctx, cache = _pair((n, d), torch.float32, seed=seed)
    sim64 = _sim64(ctx, cache)
    assume(n == 0 or float((sim64 - tau).abs().min()) > 1e-5)
    index, count, sim = cosine_saliency(ctx, cache, tau, n_rows=n_rows)
    r_index, r_count, r_sim = cosine_saliency_reference(ctx, cache, tau, n_rows=n_rows)
    assert torch.equal(index, r_index) and torch.equal(count, r_count)
    live = n if n_rows is None else n_rows
    exp_index, exp_count = _expected_index(
        torch.cat([sim64[:live], torch.ones(n - live, dtype=torch.float64)]), tau, n
    )
    assert torch.equal(index, exp_index) and int(count) == exp_count
    torch.testing.assert_close(sim, r_sim, rtol=0, atol=2e-6)


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("index_pad", [0, 7, -(2**31)])
def test_index_pad_fills_the_slots_past_the_count(backend, index_pad):
    """The slots at or past the count hold ``index_pad`` (stale buffer contents overwritten); the
    live slots, count and similarity are the default call's."""
    ctx, cache = _pair((2 * BM + 3, BD + 7), torch.float32, seed=23)
    cache[::3] = ctx[::3]  # a third of the rows unchanged: not salient
    with kernel_backend(backend):
        index, count, sim = cosine_saliency(ctx, cache, 0.9)
        out_index = torch.full((ctx.shape[0] + 4,), 99, dtype=torch.int32)
        padded, padded_count, padded_sim = cosine_saliency(ctx, cache, 0.9, out_index=out_index, index_pad=index_pad)
    n = int(count)
    assert 0 < n < ctx.shape[0] and torch.equal(padded_count, count) and torch.equal(padded_sim, sim)
    assert torch.equal(padded[:n], index[:n]) and padded[n:].tolist() == [index_pad] * (padded.shape[0] - n)


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("n_rows", [None, 0, 1, BM + 1, "tensor"])
def test_out_salient_flags_exactly_the_indexed_rows(backend, n_rows):
    """``out_salient`` (stale contents overwritten) is True for the rows ``index[:count]`` names and
    nowhere else, rows past ``n_rows`` included; NaN rows are flagged; the other outputs are unchanged."""
    ctx, cache = _pair((2 * BM + 3, BD + 7), torch.float32, seed=24)
    cache[::3] = ctx[::3]
    ctx[1, 2] = float("nan")
    n_rows = torch.tensor([BM + 4], dtype=torch.int32) if n_rows == "tensor" else n_rows
    salient = torch.ones(ctx.shape[0], dtype=torch.bool)
    with kernel_backend(backend):
        want = cosine_saliency(ctx, cache, 0.9, n_rows=n_rows)
        got = cosine_saliency(ctx, cache, 0.9, n_rows=n_rows, out_salient=salient)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))
    index, count, _ = got
    assert torch.equal(salient.nonzero().flatten(), index[: int(count)].long())
    if n_rows is None:
        assert bool(salient[1]) and int(count) > 1


@pytest.mark.parametrize("n_rows", [None, 5])
def test_unchecked_call_gives_the_checked_result(n_rows):
    """``check=False`` (DyLLM's sparse layers, which build the arguments) skips the checks only."""
    ctx, cache = _pair((2 * BM + 3, BD + 7), torch.float32, seed=22)
    count = None if n_rows is None else torch.tensor([n_rows], dtype=torch.int32)
    checked = cosine_saliency(ctx, cache, 0.9, n_rows=count)
    unchecked = cosine_saliency(ctx, cache, 0.9, n_rows=count, check=False)
    for a, b in zip(checked, unchecked, strict=True):
        assert torch.equal(a, b)


def _bad(**over):
    ctx = torch.randn(4, 8)
    kwargs = dict(ctx=ctx, ctx_cache=ctx.clone(), tau=0.9)
    kwargs.update(over)
    ctx, cache, tau = kwargs.pop("ctx"), kwargs.pop("ctx_cache"), kwargs.pop("tau")
    return lambda: cosine_saliency(ctx, cache, tau, **kwargs)


@pytest.mark.parametrize(
    "over, exc, name",
    [
        (dict(ctx=[[1.0]]), TypeError, "ctx"),
        (dict(ctx=torch.ones(4, 8, dtype=torch.int32)), TypeError, "ctx"),
        (dict(ctx=torch.randn(8)), ValueError, "ctx"),
        (dict(ctx_cache=torch.randn(4, 9)), ValueError, "ctx_cache"),
        (dict(ctx_cache=torch.randn(4, 8, dtype=torch.float16)), TypeError, "ctx_cache"),
        (dict(ctx_cache=torch.randn(4, 8, dtype=torch.float64)), TypeError, "ctx_cache"),
        (dict(tau=float("nan")), ValueError, "tau"),
        (dict(tau="0.9"), TypeError, "tau"),
        (dict(tau=True), TypeError, "tau"),
        (dict(index_pad=False), TypeError, "index_pad"),
        (dict(n_rows=5), ValueError, "n_rows"),
        (dict(n_rows=-1), ValueError, "n_rows"),
        (dict(n_rows=2.0), TypeError, "n_rows"),
        (dict(n_rows=torch.tensor([2], dtype=torch.int64)), ValueError, "n_rows"),
        (dict(n_rows=torch.tensor([2, 3], dtype=torch.int32)), ValueError, "n_rows"),
        (dict(out_index=torch.empty(3, dtype=torch.int32)), ValueError, "out_index"),
        (dict(out_index=torch.empty(4, dtype=torch.int64)), TypeError, "out_index"),
        (dict(out_index=torch.empty(8, dtype=torch.int32)[::2]), ValueError, "out_index"),
        (dict(out_count=torch.empty(2, dtype=torch.int32)), ValueError, "out_count"),
        (dict(out_count=torch.empty(1, dtype=torch.int64)), TypeError, "out_count"),
        (dict(out_similarity=torch.empty(5)), ValueError, "out_similarity"),
        (dict(out_similarity=torch.empty(4, dtype=torch.float16)), TypeError, "out_similarity"),
        (
            dict(
                ctx=torch.randn(4, 8, device="meta"),
                ctx_cache=torch.randn(4, 8, device="meta"),
                out_count=torch.empty(1, dtype=torch.int32),
            ),
            ValueError,
            "device",
        ),
    ],
)
def test_bad_inputs_name_the_argument(over, exc, name):
    with pytest.raises(exc, match=name):
        _bad(**over)()


def test_bf16_is_upcast_before_arithmetic():
    """The kernel converts bf16 to fp32 before any arithmetic, so the interpreter is right too."""
    ctx, cache = _pair((2 * BM + 3, BD + 7), torch.bfloat16, seed=15)
    sim64 = _sim64(ctx, cache)
    tau = _tau_with_margin(sim64)
    index, count, sim = cosine_saliency(ctx, cache, tau)
    exp_index, exp_count = _expected_index(sim64, tau, ctx.shape[0])
    assert int(count) == exp_count and torch.equal(index, exp_index)
    torch.testing.assert_close(sim, sim64.float(), rtol=0, atol=1e-5)
