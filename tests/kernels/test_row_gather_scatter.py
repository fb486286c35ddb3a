"""seer_kernels.gather_rows / scatter_rows / exchange_rows: Triton (interpreter) against the torch
reference."""

from __future__ import annotations

import pytest
import torch

from seer_kernels import kernel_backend
from seer_kernels.cosine_saliency import cosine_saliency
from seer_kernels.row_gather_scatter import (
    _CONFIGS,
    exchange_rows,
    exchange_rows_reference,
    gather_rows,
    gather_rows_reference,
    scatter_rows,
    scatter_rows_reference,
)

pytestmark = [pytest.mark.interpreter, pytest.mark.row_gather_scatter]

BM = _CONFIGS[0].kwargs["BLOCK_M"]
BD = _CONFIGS[0].kwargs["BLOCK_D"]
DTYPES = [torch.float32, torch.float16, torch.float64]


def _index(n_src, capacity, count, dtype=torch.int32, seed=0, unique=True):
    """``count`` live row ids (unique unless asked), then -1 padding up to ``capacity``."""
    g = torch.Generator().manual_seed(seed)
    live = (
        torch.randperm(n_src, generator=g)[:count]
        if unique
        else torch.randint(0, n_src, (count,), generator=g)
    )
    idx = torch.full((capacity,), -1, dtype=dtype)
    idx[:count] = live.to(dtype)
    return idx


# (N source rows, D, capacity, count)
CASES = [
    (1, 1, 1, 1),
    (1, 1, 1, 0),
    (5, 3, 6, 0),
    (10, BD - 1, 7, 5),
    (9, BD, BM, BM),
    (9, BD + 1, BM + 1, BM + 1),
    (20, 2 * BD + 3, 20, 13),
    (33, 70, 2 * BM + 3, 2 * BM + 1),
]
case_ids = ["N{}-D{}-cap{}-n{}".format(*c) for c in CASES]


def with_counts(kinds):
    """Each case with one form of the count, in turn (the forms are a host-side conversion,
    tested whole in test_row_linear.py): every form is still met, without the cross product."""
    return pytest.mark.parametrize("case,count_kind", [(c, kinds[i % len(kinds)]) for i, c in enumerate(CASES)],
                                   ids=[f"{i}-{kinds[j % len(kinds)]}" for j, i in enumerate(case_ids)])


def _count(kind, n):
    return {
        "int": n,
        "i32": torch.tensor([n], dtype=torch.int32),
        "i64": torch.tensor([n], dtype=torch.int64),
    }[kind]


@with_counts(["int", "i32", "i64"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_matches_reference(case, dtype, count_kind):
    N, D, cap, n = case
    src = torch.randn(N, D).to(dtype)
    index = _index(N, cap, n, seed=N + D)
    count = _count(count_kind, n)
    out = gather_rows(src, index, count)
    ref = gather_rows_reference(src, index, count)
    assert out.shape == (cap, D) and out.dtype == dtype
    assert torch.equal(out, ref)
    assert torch.equal(out[:n], src[index[:n].long()])
    assert torch.equal(out[n:], torch.zeros(cap - n, D, dtype=dtype))


@with_counts(["int", "i32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_matches_reference(case, dtype, count_kind):
    N, D, cap, n = case
    dst = torch.randn(N, D).to(dtype)
    src = torch.randn(cap, D).to(dtype)
    src[n:] = float("nan")  # rows past count must never be written
    index = _index(N, cap, n, dtype=torch.int64, seed=N + 2 * D)
    count = _count(count_kind, n)
    expected = dst.clone()
    expected[index[:n]] = src[:n]
    ref = scatter_rows_reference(dst.clone(), index, count, src)
    out = scatter_rows(dst, index, count, src)
    assert out.data_ptr() == dst.data_ptr()
    assert torch.equal(dst, expected) and torch.equal(ref, expected)


@with_counts(["int", "i32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_exchange_returns_the_overwritten_rows_and_writes_the_new(case, dtype, count_kind):
    N, D, cap, n = case
    table = torch.randn(N, D).to(dtype)
    rows = torch.randn(cap, D).to(dtype)
    rows[n:] = float("nan")  # rows past count must never be written
    index = _index(N, cap, n, seed=N + 3 * D)
    count = _count(count_kind, n)
    expected_table = table.clone()
    expected_table[index[:n].long()] = rows[:n]
    expected_previous = torch.zeros(cap, D, dtype=dtype)
    expected_previous[:n] = table[index[:n].long()]
    ref_table = table.clone()
    ref = exchange_rows_reference(ref_table, index, count, rows)
    previous = exchange_rows(table, index, count, rows)
    assert previous.shape == (cap, D) and previous.is_contiguous()
    assert torch.equal(previous, expected_previous) and torch.equal(ref, expected_previous)
    assert torch.equal(table, expected_table) and torch.equal(ref_table, expected_table)


@with_counts(["int", "i32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_exchange_delta_returns_the_change_of_each_live_row(case, dtype, count_kind):
    """``delta=True``: ``rows - old`` on the live slots (torch's subtraction, bit for bit), zero
    past the count; the table is written as without it."""
    N, D, cap, n = case
    table = torch.randn(N, D).to(dtype)
    rows = torch.randn(cap, D).to(dtype)
    rows[n:] = float("nan")
    index = _index(N, cap, n, seed=N + 5 * D)
    count = _count(count_kind, n)
    expected = torch.zeros(cap, D, dtype=dtype)
    expected[:n] = rows[:n] - table[index[:n].long()]
    expected_table = table.clone()
    expected_table[index[:n].long()] = rows[:n]
    ref_table = table.clone()
    ref = exchange_rows_reference(ref_table, index, count, rows, delta=True)
    change = exchange_rows(table, index, count, rows, delta=True)
    assert change.shape == (cap, D) and change.is_contiguous()
    assert torch.equal(change, expected) and torch.equal(ref, expected)
    assert torch.equal(table, expected_table) and torch.equal(ref_table, expected_table)


def test_exchange_multidim_rows_and_device_counts_out_of_range():
    base = torch.randn(9, 2, 3, 4)
    table = base[:, 1]  # [N, H, d] with a row stride of 2*H*d
    index = torch.tensor([8, 0, 4, 2], dtype=torch.int32)
    rows = torch.randn(4, 3, 4)
    before = table.clone()
    previous = exchange_rows(table, index, torch.tensor([40], dtype=torch.int32), rows)  # acts as 4
    assert torch.equal(previous, before[index.long()]) and torch.equal(table[index.long()], rows)
    nothing = exchange_rows(table, index, torch.tensor([-2], dtype=torch.int32), before[index.long()])
    assert torch.equal(nothing, torch.zeros(4, 3, 4)) and torch.equal(table[index.long()], rows)


def test_gather_zero_tail_false_keeps_out_and_allows_repeats():
    src = torch.randn(6, 2 * BD + 1)
    index = torch.tensor([5, 5, 0, 3, 5, -1, -1], dtype=torch.int32)  # repeats are fine in a gather
    out = torch.full((7, src.shape[1]), 7.0)
    ref = gather_rows_reference(src, index, 5, out=out.clone(), zero_tail=False)
    res = gather_rows(src, index, torch.tensor([5], dtype=torch.int32), out=out, zero_tail=False)
    assert res.data_ptr() == out.data_ptr()
    assert torch.equal(out, ref)
    assert torch.equal(out[:5], src[[5, 5, 0, 3, 5]]) and torch.equal(
        out[5:], torch.full((2, src.shape[1]), 7.0)
    )
    # the default zero-fills a stale buffer's tail
    gather_rows(src, index, 5, out=out)
    assert torch.equal(out[5:], torch.zeros(2, src.shape[1]))


@pytest.mark.parametrize("device_count, acts_as", [(-4, 0), (100, 6)])
def test_device_count_out_of_range_acts_as_nearest_end(device_count, acts_as):
    src = torch.randn(8, 5)
    index = torch.tensor([7, 1, 2, 3, 4, 0], dtype=torch.int32)
    count = torch.tensor([device_count], dtype=torch.int32)
    out = gather_rows(src, index, count)
    assert torch.equal(out, gather_rows_reference(src, index, count))
    assert torch.equal(out[:acts_as], src[index[:acts_as].long()]) and not out[acts_as:].any()
    dst = torch.zeros(8, 5)
    scatter_rows(dst, index, count, torch.ones(6, 5))
    assert int(dst.sum()) == 5 * acts_as
    assert torch.equal(dst, scatter_rows_reference(torch.zeros(8, 5), index, count, torch.ones(6, 5)))


def test_strided_and_multidim_rows():
    N, H, d = 11, 3, 7
    base = torch.randn(N, 2, H, d)
    src = base[:, 1]  # [N, H, d], row stride 2*H*d: trailing dims still flatten to one
    index = _index(N, 9, 6, seed=3)
    out = gather_rows(src, index, 6)
    assert out.shape == (9, H, d)
    assert torch.equal(out, gather_rows_reference(src, index, 6))
    assert torch.equal(out[:6], src[index[:6].long()])

    col_major = torch.randn(40, N).t()  # [N, 40] with column stride N
    out2 = gather_rows(col_major, index, 6)
    assert torch.equal(out2[:6], col_major[index[:6].long()])

    dst_base = torch.zeros(N, 2, H, d)
    dst = dst_base[:, 0]
    new = torch.randn(9, H, d)
    scatter_rows(dst, index, 6, new)
    assert torch.equal(dst_base[index[:6].long(), 0], new[:6])
    assert not dst_base[:, 1].any()
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[index[:6].long()] = False
    assert not dst_base[untouched].any()


def test_empty_capacity_and_empty_source():
    src = torch.randn(0, 4)
    out = gather_rows(src, torch.full((3,), -1, dtype=torch.int32), 0)
    assert torch.equal(out, torch.zeros(3, 4))
    out = gather_rows(torch.randn(5, 4), torch.empty(0, dtype=torch.int32), 0)
    assert out.shape == (0, 4)
    dst = torch.randn(5, 4)
    before = dst.clone()
    scatter_rows(dst, torch.empty(0, dtype=torch.int32), 0, torch.empty(0, 4))
    assert torch.equal(dst, before)


def test_scatter_bitwise_repeatable():
    N, D, cap, n = 40, 3 * BD + 5, 4 * BM + 3, 4 * BM
    dst0 = torch.randn(N, D, dtype=torch.float16)
    src = torch.randn(cap, D, dtype=torch.float16)
    index = _index(N, cap, n, seed=9)
    count = torch.tensor([n], dtype=torch.int32)
    results = [scatter_rows(dst0.clone(), index, count, src) for _ in range(3)]
    for r in results[1:]:
        assert torch.equal(r.view(torch.int16), results[0].view(torch.int16))
    gathered = [gather_rows(results[0], index, count) for _ in range(2)]
    assert torch.equal(gathered[0].view(torch.int16), gathered[1].view(torch.int16))


def test_round_trip_with_cosine_saliency():
    """The DyLLM FFN pattern: salient rows -> gather -> f -> scatter into the cached output."""
    N, D = 2 * BM + 7, BD + 9
    ctx = torch.randn(N, D)
    cache = ctx.clone()
    changed = torch.tensor([1, 4, 5, N - 1])
    cache[changed] = torch.randn(len(changed), D)
    index, count, _ = cosine_saliency(ctx, cache, 0.99)
    assert index[: int(count)].tolist() == changed.tolist()
    hidden = torch.randn(N, D)
    ffn_cache = torch.randn(N, D)
    expected = ffn_cache.clone()
    expected[changed] = torch.tanh(hidden[changed]) * 3
    rows = gather_rows(hidden, index, count)
    scatter_rows(ffn_cache, index, count, torch.tanh(rows) * 3)
    torch.testing.assert_close(ffn_cache, expected, rtol=0, atol=0)


def test_reference_backend_agrees():
    src = torch.randn(9, 13)
    index = _index(9, 6, 4, seed=2)
    with kernel_backend("reference"):
        ref = gather_rows(src, index, 4)
    assert torch.equal(ref, gather_rows(src, index, 4))


def _gather_call(src=None, index=None, count=2, **kw):
    src = torch.randn(5, 4) if src is None else src
    index = torch.tensor([0, 1, 2], dtype=torch.int32) if index is None else index
    return lambda: gather_rows(src, index, count, **kw)


def _scatter_call(dst=None, index=None, count=2, src=None):
    dst = torch.randn(5, 4) if dst is None else dst
    index = torch.tensor([0, 1, 2], dtype=torch.int32) if index is None else index
    src = torch.randn(3, 4) if src is None else src
    return lambda: scatter_rows(dst, index, count, src)


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (_gather_call(src=torch.ones(5, 4, dtype=torch.int32)), TypeError, "src"),
        (_gather_call(src=torch.randn(5)), ValueError, "src"),
        (_gather_call(index=torch.tensor([0.0, 1.0])), TypeError, "index"),
        (_gather_call(index=torch.zeros(2, 2, dtype=torch.int32)), ValueError, "index"),
        (_gather_call(index=torch.arange(6, dtype=torch.int32)[::2]), ValueError, "index"),
        (_gather_call(index=torch.tensor([0, 5, 1], dtype=torch.int32)), ValueError, "index"),
        (_gather_call(index=torch.tensor([-1, 0, 1], dtype=torch.int32)), ValueError, "index"),
        (_gather_call(count=4), ValueError, "count"),
        (_gather_call(count=-1), ValueError, "count"),
        (_gather_call(count=True), TypeError, "count"),
        (_gather_call(count=1.0), TypeError, "count"),
        (_gather_call(count=torch.tensor([1, 2], dtype=torch.int32)), ValueError, "count"),
        (_gather_call(count=torch.tensor([1.0])), ValueError, "count"),
        (_gather_call(out=torch.empty(2, 4)), ValueError, "out"),
        (_gather_call(out=torch.empty(3, 4, dtype=torch.float16)), TypeError, "out"),
        (_gather_call(src=torch.randn(5, 4, 3).transpose(1, 2)), ValueError, "src"),
        (_scatter_call(dst=torch.ones(5, 4, dtype=torch.int64)), TypeError, "dst"),
        (_scatter_call(src=torch.randn(3, 5)), ValueError, "src"),
        (_scatter_call(src=torch.randn(3, 4, dtype=torch.float64)), TypeError, "src"),
        (_scatter_call(index=torch.tensor([1, 1, 2], dtype=torch.int32)), ValueError, "unique"),
        (_scatter_call(index=torch.tensor([1, 7, 2], dtype=torch.int32)), ValueError, "index"),
        (
            _scatter_call(dst=torch.randn(5, 4, 3).transpose(1, 2), src=torch.randn(3, 3, 4)),
            ValueError,
            "dst",
        ),
        (
            _scatter_call(dst=torch.randn(5, 4, device="meta"), src=torch.randn(3, 4, device="meta")),
            ValueError,
            "device",
        ),
    ],
)
def test_bad_inputs_name_the_argument(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_duplicates_past_count_are_ignored():
    dst = torch.zeros(4, 3)
    scatter_rows(dst, torch.tensor([2, 2, 2], dtype=torch.int32), 1, torch.ones(3, 3))
    assert torch.equal(dst[2], torch.ones(3)) and dst.sum() == 3


def test_bf16_is_bitwise():
    """Pure loads and stores: bf16 is exact even in the interpreter."""
    src = torch.randn(13, BD + 5).to(torch.bfloat16)
    index = _index(13, 9, 7, seed=4)
    assert torch.equal(gather_rows(src, index, 7), gather_rows_reference(src, index, 7))
    dst, dst_ref = (
        torch.zeros(13, BD + 5, dtype=torch.bfloat16),
        torch.zeros(13, BD + 5, dtype=torch.bfloat16),
    )
    scatter_rows(dst, index, 7, src[:9])
    scatter_rows_reference(dst_ref, index, 7, src[:9])
    assert torch.equal(dst, dst_ref)
