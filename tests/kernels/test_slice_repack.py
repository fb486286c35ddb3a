"""slice_repack: the Triton kernel (in the interpreter) against the torch reference, bit for bit.

Every buffer starts from the same sentinel fill for both implementations and is compared whole,
so "writes exactly the chosen region and nothing else" is tested too. The routing decision is
checked against an independent few-line reading of the rule below.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seer_kernels import kernel_backend
from seer_kernels.slice_repack import _slice_repack_triton, slice_repack, slice_repack_reference
from seer_kernels.slice_repack_control import (
    BUFFER_FIELDS,
    CONTROL_SIZE,
    ERR_CAPACITY,
    ERR_KEEP_LEN,
    ERR_ROUTE,
    ERR_ROW_IDS,
    PATH_EAGER,
    PATH_EMPTY,
    PATH_ERROR,
    PATH_STATIC,
    PATH_VARLEN,
    ControlValues,
    SliceRepackOutput,
    decode_control,
    slice_repack_buffers,
    slice_repack_decision,
)

pytestmark = [pytest.mark.interpreter, pytest.mark.slice_repack]

N = 20
TABLES = dict(micro_buckets=[4, 8, 16, 32], packed_buckets=[16, 32, 64, 128], batch_buckets=[1, 2, 4, 8])


def rule(lens, micro, packed, batch, tau=0.2, eager_max=4):
    """The routing rule exactly as the brief states it: (path, bucket, T, Lmax, error, batch_rows)."""
    g, t, lmax = len(lens), sum(lens), max(lens, default=0)
    if t == 0:
        return (0, 0, 0, lmax, 0, g)
    i = bisect_left(micro, lmax)
    if i == len(micro):
        return (3, t, t, lmax, 0, g)
    b_g = micro[i]
    if g == 1 or b_g <= eager_max:
        return (3, t, t, lmax, 0, g)
    j = bisect_left(batch, g)
    if 1 - t / (g * b_g) <= tau and j < len(batch):
        return (1, b_g, t, lmax, 0, batch[j])
    k = bisect_left(packed, t)
    if k < len(packed):
        return (2, packed[k], t, lmax, 0, g)
    return (3, t, t, lmax, 0, g)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return (
        t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
        if t.is_floating_point()
        else t
    )


def _sentinel(values, *, batch_cap, bucket_cap, packed_cap, cu_len) -> SliceRepackOutput:
    out = slice_repack_buffers(
        batch_cap=batch_cap,
        bucket_cap=bucket_cap,
        packed_cap=packed_cap,
        cu_len=cu_len,
        dtype=values.dtype,
        device=values.device,
        hidden_dim=values.shape[2] if values.dim() == 3 else None,
    )
    out.control.fill_(99)
    for name in ("padded_values", "packed_values"):
        getattr(out, name).fill_(55)
    for name, fill in (
        ("padded_positions", -7),
        ("padded_src_index", -9),
        ("packed_positions", -7),
        ("packed_seq_index", -8),
        ("packed_src_index", -9),
        ("cu_seqlens", -3),
    ):
        getattr(out, name).fill_(fill)
    out.padded_mask.fill_(True)
    return out


def _caps(values, group, tables, **over):
    caps = dict(
        batch_cap=max(tables["batch_buckets"], default=0),
        bucket_cap=max(tables["micro_buckets"], default=0),
        packed_cap=max(max(tables["packed_buckets"], default=0), group * values.shape[1]),
        cu_len=group + 1,
    )
    caps.update(over)
    return caps


def _assert_same(a: SliceRepackOutput, b: SliceRepackOutput):
    for name in BUFFER_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(_bits(x), _bits(y)), f"{name} differs:\n{x}\n{y}"


def run_both(values, keep_len, *, tables=TABLES, caps=None, **kw):
    """slice_repack through the kernel and through the reference on sentinel buffers; assert equal."""
    group = kw["row_ids"].numel() if kw.get("row_ids") is not None else values.shape[0]
    caps = caps or _caps(values, group, tables)
    got = slice_repack(values, keep_len, **tables, out=_sentinel(values, **caps), **kw)
    with kernel_backend("reference"):
        ref = slice_repack(values, keep_len, **tables, out=_sentinel(values, **caps), **kw)
    _assert_same(got, ref)
    return got


def make_values(kind: str, batch: int, seq_len: int = N, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "ids64":
        return torch.randint(0, 50_000, (batch, seq_len), generator=g)
    if kind == "ids32":
        return torch.randint(0, 50_000, (batch, seq_len), generator=g, dtype=torch.int32)
    dtype, dim = {"fp32": (torch.float32, 5), "fp16": (torch.float16, 3), "bf16": (torch.bfloat16, 20)}[kind]
    return torch.randn(batch, seq_len, dim, generator=g).to(dtype)


# name -> (keep_len, extra kwargs, table overrides, expected path)
SCENARIOS = {
    "empty": ([0, 0, 0], {}, {}, PATH_EMPTY),
    "static_batch_padded": ([16, 15, 14], {}, {}, PATH_STATIC),  # G = 3 -> batch bucket 4, row 3 all padding
    "static_bucket_beyond_n": ([20, 20, 19, 20], {"tau_pad": 0.4}, {}, PATH_STATIC),  # B_G = 32 > N
    "static_odd_bucket": (
        [12, 11, 12],
        {},
        {"micro_buckets": [4, 12, 32]},
        PATH_STATIC,
    ),  # B_G not a tile multiple
    "varlen_mixed": ([20, 0, 1, 7, 3], {}, {}, PATH_VARLEN),
    "varlen_full_rows": ([20, 20, 20, 20], {}, {}, PATH_VARLEN),
    "varlen_no_batch_bucket": ([16, 15, 14], {}, {"batch_buckets": [1, 2]}, PATH_VARLEN),
    "eager_lone_row": ([0, 0, 13, 0], {"row_ids": [2]}, {}, PATH_EAGER),
    "eager_tiny_bucket": ([1, 2, 3, 4], {}, {}, PATH_EAGER),
    "eager_no_packed_bucket": ([20, 0, 1, 7, 3], {}, {"packed_buckets": [16]}, PATH_EAGER),
    "eager_no_micro_bucket": ([20, 5, 1], {}, {"micro_buckets": [8]}, PATH_EAGER),
}


def _scenario(name, kind, *, row_dtype=torch.int32):
    lens, extra, table_over, expected = SCENARIOS[name]
    values = make_values(kind, len(lens))
    extra = dict(extra)
    if "row_ids" in extra:
        extra["row_ids"] = torch.tensor(extra["row_ids"], dtype=row_dtype)
    tables = {**TABLES, **table_over}
    return values, torch.tensor(lens), extra, tables, expected


@pytest.mark.parametrize("kind", ["ids64", "ids32", "fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kernel_matches_reference_bitwise(name, kind):
    values, keep_len, extra, tables, expected = _scenario(name, kind)
    got = run_both(
        values,
        keep_len,
        tables=tables,
        pad_value=3 if values.dtype in (torch.int64, torch.int32) else 0.1,
        **extra,
    )
    control = got.read()
    assert control.path == expected, control
    rows = extra["row_ids"].tolist() if "row_ids" in extra else list(range(values.shape[0]))
    assert tuple(control) == rule(
        [keep_len[r].item() for r in rows],
        tables["micro_buckets"],
        tables["packed_buckets"],
        tables["batch_buckets"],
        tau=extra.get("tau_pad", 0.2),
    )


def test_every_path_is_reached():
    paths = set()
    for name in SCENARIOS:
        values, keep_len, extra, tables, _ = _scenario(name, "ids64")
        paths.add(slice_repack(values, keep_len, **tables, **extra).read().path)
    assert paths == {PATH_EMPTY, PATH_STATIC, PATH_VARLEN, PATH_EAGER}


def _scatter_back(out, control, values, positions):
    """Put every written slot back at its src_index; returns (values, positions) of shape [B*N, ...]."""
    tail = values.shape[2:]
    flat_vals = torch.full((values.shape[0] * values.shape[1], *tail), -1.0).to(values.dtype)
    flat_pos = torch.full((values.shape[0] * values.shape[1],), -1, dtype=torch.int64)
    if control.path == PATH_STATIC:
        region = (slice(0, control.batch_rows), slice(0, control.bucket))
        src, vals, pos = out.padded_src_index[region], out.padded_values[region], out.padded_positions[region]
        mask = out.padded_mask[region]
        assert torch.equal(mask, src >= 0)
        assert torch.equal(pos[~mask], torch.zeros_like(pos[~mask]))
    else:
        end = control.bucket
        src, vals, pos = out.packed_src_index[:end], out.packed_values[:end], out.packed_positions[:end]
        mask = src >= 0
        assert torch.equal(mask, out.packed_seq_index[:end] >= 0)
        assert int(mask.sum()) == control.total and bool(mask[: control.total].all())
    flat_vals[src[mask]] = vals[mask]
    flat_pos[src[mask]] = pos[mask]
    return flat_vals, flat_pos


@pytest.mark.parametrize("kind", ["ids64", "fp16"])
@pytest.mark.parametrize(
    "name",
    ["static_batch_padded", "static_odd_bucket", "varlen_mixed", "eager_lone_row", "eager_tiny_bucket"],
)
def test_round_trip_through_src_index(name, kind):
    values, keep_len, extra, tables, _ = _scenario(name, kind)
    batch = values.shape[0]
    positions = torch.arange(N).repeat(batch, 1) + 100 * torch.arange(batch)[:, None]
    out = run_both(values, keep_len, tables=tables, positions=positions, pad_value=0, **extra)
    control = out.read()
    flat_vals, flat_pos = _scatter_back(out, control, values, positions)
    rows = extra["row_ids"].tolist() if "row_ids" in extra else list(range(batch))
    keep = torch.zeros(batch, N, dtype=torch.bool)
    for r in rows:
        keep[r, : keep_len[r]] = True
    keep = keep.reshape(-1)
    assert torch.equal(_bits(flat_vals[keep]), _bits(values.reshape(batch * N, *values.shape[2:])[keep]))
    assert torch.equal(flat_pos[keep], positions.reshape(-1)[keep])
    assert bool((flat_pos[~keep] == -1).all()), "a slot beyond L* or outside the group was written"


def test_static_padding_rows_and_columns():
    values = make_values("ids64", 3)
    out = run_both(values, torch.tensor([16, 15, 14]), pad_value=-5)
    c = out.read()
    assert (c.path, c.bucket, c.batch_rows) == (PATH_STATIC, 16, 4)
    assert torch.equal(out.padded_values[3, :16], torch.full((16,), -5))
    assert not out.padded_mask[3, :16].any() and bool((out.padded_src_index[3, :16] == -1).all())
    assert torch.equal(out.padded_mask[:3, :16].sum(1), torch.tensor([16, 15, 14]))
    assert torch.equal(out.padded_positions[1, :16], torch.tensor([*range(15), 0]))
    assert bool(out.padded_mask[:, 16:].all()), "columns beyond B_G must be left untouched (sentinel True)"


def test_packed_layout_details():
    values = make_values("ids64", 5)
    out = run_both(values, torch.tensor([20, 0, 1, 7, 3]), pad_value=-5)
    c = out.read()
    assert (c.path, c.bucket, c.total, c.max_len) == (PATH_VARLEN, 32, 31, 20)
    assert out.cu_seqlens.tolist() == [0, 20, 20, 21, 28, 31]
    expected_seq = [0] * 20 + [2] + [3] * 7 + [4] * 3 + [-1]
    assert out.packed_seq_index[:32].tolist() == expected_seq
    assert out.packed_values[31].item() == -5 and out.packed_positions[31].item() == 0
    assert out.packed_positions[21:28].tolist() == list(range(7))
    assert out.packed_src_index[20].item() == 2 * N + 0
    assert bool((out.packed_seq_index[32:] == -8).all()), "slots beyond P must be left untouched"


def test_cu_seqlens_longer_than_group_repeats_total():
    values = make_values("ids64", 3)
    out = run_both(values, torch.tensor([5, 0, 9]), caps=_caps(values, 3, TABLES, cu_len=8))
    assert out.cu_seqlens.tolist() == [0, 5, 5, 14, 14, 14, 14, 14]


@pytest.mark.parametrize("row_dtype", [torch.int32, torch.int64])
def test_row_ids_subset_with_repeats(row_dtype):
    values = make_values("fp32", 6)
    keep_len = torch.tensor([3, 20, 0, 9, 1, 17], dtype=torch.int64)
    row_ids = torch.tensor([3, 0, 3, 5], dtype=row_dtype)
    out = run_both(values, keep_len, row_ids=row_ids)
    c = out.read()
    assert (c.total, c.max_len) == (9 + 3 + 9 + 17, 17)
    assert out.cu_seqlens.tolist() == [0, 9, 12, 21, 38]
    assert (c.path, c.bucket) == (PATH_VARLEN, 64)
    assert torch.equal(out.packed_values[12:21], values[3, :9])
    assert out.packed_seq_index[:38].tolist() == [0] * 9 + [1] * 3 + [2] * 9 + [3] * 17
    assert out.packed_src_index[9].item() == 0 * N + 0 and out.packed_src_index[21].item() == 5 * N + 0


@pytest.mark.parametrize("tables_as", ["cpu_int32", "cpu_int64"])
def test_tables_as_tensors(tables_as):
    dtype = torch.int32 if tables_as == "cpu_int32" else torch.int64
    values = make_values("ids64", 5)
    keep_len = torch.tensor([20, 0, 1, 7, 3])
    from_lists = slice_repack(values, keep_len, **TABLES)
    tensors = {k: torch.tensor(v, dtype=dtype) for k, v in TABLES.items()}
    from_tensors = slice_repack(values, keep_len, **tensors)
    assert from_lists.read() == from_tensors.read()
    assert torch.equal(from_lists.packed_values[:32], from_tensors.packed_values[:32])


def test_empty_tables_route_eager():
    values = make_values("ids64", 3)
    tables = dict(micro_buckets=[], packed_buckets=[], batch_buckets=[])
    out = run_both(values, torch.tensor([4, 9, 2]), tables=tables, caps=_caps(values, 3, tables))
    assert tuple(out.read()) == (PATH_EAGER, 15, 15, 9, 0, 3)


def test_empty_group_and_zero_width_rows():
    values = make_values("ids64", 3)
    out = run_both(values, torch.tensor([4, 9, 2]), row_ids=torch.zeros(0, dtype=torch.int32))
    assert out.read().path == PATH_EMPTY and out.cu_seqlens.tolist() == [0]
    narrow = torch.zeros(2, 0, dtype=torch.int64)
    out = run_both(narrow, torch.zeros(2, dtype=torch.int32))
    assert tuple(out.read()) == (PATH_EMPTY, 0, 0, 0, 0, 2)


@pytest.mark.parametrize("num_programs, block_n", [(1, 4), (3, 8), (7, 16), (64, 4)])
def test_grid_stride_and_tile_sizes(num_programs, block_n):
    for name in ("static_bucket_beyond_n", "static_odd_bucket", "varlen_mixed"):
        values, keep_len, extra, tables, _ = _scenario(name, "fp32")
        caps = _caps(values, values.shape[0], tables)
        ref = _sentinel(values, **caps)
        with kernel_backend("reference"):
            slice_repack(values, keep_len, **tables, out=ref, **extra)
        got = _sentinel(values, **caps)
        tensors = [
            torch.tensor(tables[k], dtype=torch.int32)
            for k in ("micro_buckets", "packed_buckets", "batch_buckets")
        ]
        _slice_repack_triton(
            values,
            keep_len,
            None,
            None,
            *tensors,
            tau_pad=extra.get("tau_pad", 0.2),
            eager_max_bucket=4,
            pad_value=0,
            out=got,
            block_n=block_n,
            num_programs=num_programs,
        )
        _assert_same(got, ref)


def test_bitwise_repeat():
    values, keep_len, extra, tables, _ = _scenario("static_batch_padded", "bf16")
    caps = _caps(values, 3, tables)
    first = slice_repack(values, keep_len, **tables, out=_sentinel(values, **caps))
    again = slice_repack(values, keep_len, **tables, out=_sentinel(values, **caps))
    _assert_same(first, again)


def test_pwr_tie_is_decided_in_float64():
    """G = 5, B_G = 8, T = 32: PWR = 1 - 32/40 is 0.19999999999999996 in float64 (not 0.2)."""
    values = make_values("ids64", 5)
    keep_len = torch.tensor([8, 8, 8, 4, 4])
    tie = 1 - 32 / 40
    for tau, expected in ((tie, PATH_STATIC), (math.nextafter(tie, 0.0), PATH_VARLEN)):
        c = run_both(values, keep_len, tau_pad=tau).read()
        assert c.path == expected, (tau, c)
        assert tuple(c) == rule(
            keep_len.tolist(),
            **{
                "micro": TABLES["micro_buckets"],
                "packed": TABLES["packed_buckets"],
                "batch": TABLES["batch_buckets"],
            },
            tau=tau,
        )


_tables = st.lists(st.integers(1, 48), max_size=5, unique=True).map(sorted)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(0, 12), min_size=1, max_size=9),
    micro=_tables,
    packed=_tables,
    batch=st.lists(st.integers(1, 10), max_size=4, unique=True).map(sorted),
    tau=st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 0.75, 1.0]),
    eager_max=st.integers(0, 8),
)
def test_kernel_decision_matches_independent_rule(lens, micro, packed, batch, tau, eager_max):
    values = torch.arange(len(lens) * 12, dtype=torch.int64).reshape(len(lens), 12)
    out = slice_repack(
        values,
        torch.tensor(lens),
        micro_buckets=micro,
        packed_buckets=packed,
        batch_buckets=batch,
        tau_pad=tau,
        eager_max_bucket=eager_max,
        out=_sentinel(
            values,
            batch_cap=max(batch, default=0),
            bucket_cap=max(micro, default=0),
            packed_cap=max(max(packed, default=0), len(lens) * 12),
            cu_len=len(lens) + 1,
        ),
    )
    assert tuple(out.read()) == rule(lens, micro, packed, batch, tau, eager_max)


@settings(max_examples=400, deadline=None)
@given(
    lens=st.lists(st.integers(0, 300), max_size=40),
    micro=st.lists(st.integers(1, 300), max_size=8, unique=True).map(sorted),
    packed=st.lists(st.integers(1, 4000), max_size=8, unique=True).map(sorted),
    batch=st.lists(st.integers(1, 64), max_size=8, unique=True).map(sorted),
    tau=st.floats(0.0, 1.0),
    eager_max=st.integers(0, 16),
)
def test_host_decision_matches_independent_rule(lens, micro, packed, batch, tau, eager_max):
    got = slice_repack_decision(
        lens,
        micro_buckets=micro,
        packed_buckets=packed,
        batch_buckets=batch,
        tau_pad=tau,
        eager_max_bucket=eager_max,
    )
    assert tuple(got) == rule(lens, micro, packed, batch, tau, eager_max)


@pytest.mark.parametrize(
    "over, error, match",
    [
        ({"keep_len": [1, -1]}, ValueError, "keep_len must be >= 0"),
        ({"keep_len": [1.5]}, TypeError, "keep_len must hold ints"),
        ({"keep_len": torch.tensor([1, 2])}, TypeError, "keep_len must be a sequence of host ints"),
        ({"micro_buckets": [8, 4]}, ValueError, "micro_buckets must be sorted"),
        ({"packed_buckets": [0, 4]}, ValueError, "packed_buckets entries must be positive"),
        ({"batch_buckets": [True]}, TypeError, "batch_buckets must hold ints"),
        ({"tau_pad": float("inf")}, TypeError, "tau_pad"),
        ({"eager_max_bucket": -1}, ValueError, "eager_max_bucket"),
    ],
)
def test_host_decision_rejects_bad_input(over, error, match):
    kw = dict(keep_len=[3, 1], **TABLES)
    kw.update(over)
    with pytest.raises(error, match=match):
        slice_repack_decision(kw.pop("keep_len"), **kw)


# ---- errors: raised on the host when checked, flagged in the control word when not ----


@pytest.mark.parametrize(
    "keep_len, row_ids, match",
    [
        ([3, 21, 0], None, "keep_len must lie in"),
        ([3, -1, 0], None, "keep_len must lie in"),
        ([3, 2, 0], [0, 3], "row_ids must lie in"),
        ([3, 2, 0], [-1], "row_ids must lie in"),
    ],
)
def test_host_check_raises(keep_len, row_ids, match):
    values = make_values("ids64", 3)
    rid = None if row_ids is None else torch.tensor(row_ids, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        slice_repack(values, torch.tensor(keep_len), row_ids=rid, **TABLES)


@pytest.mark.parametrize(
    "keep_len, row_ids, error",
    [
        ([3, 21, 0], None, ERR_KEEP_LEN),
        ([3, -4, 0], None, ERR_KEEP_LEN),
        ([3, 2, 0], [0, 3], ERR_ROW_IDS),
        ([3, 25, 0], [1, -1], ERR_ROW_IDS | ERR_KEEP_LEN),
    ],
)
def test_unchecked_bad_input_is_flagged_not_clamped(keep_len, row_ids, error):
    values = make_values("fp16", 3)
    rid = None if row_ids is None else torch.tensor(row_ids, dtype=torch.int64)
    out = run_both(values, torch.tensor(keep_len, dtype=torch.int32), row_ids=rid, check=False)
    c = out.read(raise_on_error=False)
    assert (c.path, c.bucket, c.error, c.batch_rows) == (PATH_ERROR, 0, error, 0)
    with pytest.raises(ValueError, match="slice_repack flagged an error"):
        out.read()
    assert bool((out.cu_seqlens == -3).all()) and bool((out.packed_src_index == -9).all()), (
        "nothing else is written"
    )
    assert bool(out.padded_mask.all())


def test_buffers_too_small_for_the_tables_are_flagged():
    values = make_values("ids64", 3)
    caps = _caps(values, 3, TABLES, bucket_cap=8)  # the STATIC bucket is 16
    out = run_both(values, torch.tensor([16, 15, 14]), caps=caps)
    c = out.read(raise_on_error=False)
    assert (c.path, c.error) == (PATH_ERROR, ERR_CAPACITY)
    with pytest.raises(ValueError, match="does not fit the output buffers"):
        out.read()


def test_control_host_and_handle_on_cpu():
    values = make_values("ids64", 5)
    host = torch.zeros(CONTROL_SIZE, dtype=torch.int32)
    out = slice_repack(values, torch.tensor([20, 0, 1, 7, 3]), **TABLES, control_host=host)
    assert out.ready()
    assert tuple(host.tolist()) == tuple(out.read()) == (PATH_VARLEN, 32, 31, 20, 0, 5)
    assert decode_control(out.control) == out.read()
    bare = slice_repack_buffers(
        batch_cap=1, bucket_cap=1, packed_cap=1, cu_len=1, dtype=torch.int64, device="cpu"
    )
    with pytest.raises(ValueError, match="no control handle"):
        bare.read()


def test_reference_called_directly_returns_control():
    values = make_values("ids64", 3)
    out = _sentinel(values, **_caps(values, 3, TABLES))
    c = slice_repack_reference(values, torch.tensor([16, 15, 14]), **TABLES, out=out)
    assert tuple(c) == tuple(out.control.tolist()) == (PATH_STATIC, 16, 45, 16, 0, 4)


def _bad_call(**over):
    values = make_values("ids64", 3)
    kw = dict(values=values, keep_len=torch.tensor([1, 2, 3]), **TABLES)
    kw.update(over)
    return slice_repack(kw.pop("values"), kw.pop("keep_len"), **kw)


@pytest.mark.parametrize(
    "over, error, match",
    [
        ({"values": torch.zeros(3, N, dtype=torch.float64)}, TypeError, "values must have dtype"),
        ({"values": torch.zeros(3, N, 2, dtype=torch.int64)}, TypeError, "values must have dtype"),
        ({"values": torch.zeros(3)}, ValueError, "values must be"),
        ({"keep_len": torch.tensor([1.0, 2.0, 3.0])}, TypeError, "keep_len must have dtype"),
        ({"keep_len": torch.tensor([1, 2])}, ValueError, r"keep_len must be \[B\]"),
        ({"positions": torch.zeros(3, N + 1, dtype=torch.int64)}, ValueError, "positions must be"),
        ({"positions": torch.zeros(3, N, dtype=torch.int32)}, TypeError, "positions must have dtype"),
        ({"row_ids": torch.zeros(2, 2, dtype=torch.int32)}, ValueError, "row_ids must be 1-D"),
        ({"row_ids": torch.zeros(1025, dtype=torch.int32)}, ValueError, "at most 1024 rows"),
        ({"micro_buckets": [8, 4]}, ValueError, "micro_buckets must be sorted"),
        ({"packed_buckets": [0, 4]}, ValueError, "packed_buckets entries must be positive"),
        ({"batch_buckets": [1.5]}, TypeError, "batch_buckets must hold ints"),
        ({"batch_buckets": torch.tensor([1.0])}, TypeError, "batch_buckets must have dtype"),
        ({"micro_buckets": "8"}, TypeError, "micro_buckets must be"),
        ({"tau_pad": float("nan")}, TypeError, "tau_pad"),
        ({"eager_max_bucket": -1}, ValueError, "eager_max_bucket"),
        ({"pad_value": 0.5}, TypeError, "pad_value must be an int"),
        ({"pad_value": 2**63}, ValueError, "pad_value"),
        ({"control_host": torch.zeros(4, dtype=torch.int32)}, ValueError, "control_host must be"),
        ({"out": "buffers"}, TypeError, "out must be a SliceRepackOutput"),
        (
            {
                "out": slice_repack_buffers(
                    batch_cap=8, bucket_cap=32, packed_cap=59, cu_len=4, dtype=torch.int64, device="cpu"
                )
            },
            ValueError,
            "may pack up to G \\* N",
        ),
        (
            {
                "out": slice_repack_buffers(
                    batch_cap=8, bucket_cap=32, packed_cap=128, cu_len=3, dtype=torch.int64, device="cpu"
                )
            },
            ValueError,
            "G \\+ 1",
        ),
        (
            {
                "out": slice_repack_buffers(
                    batch_cap=8, bucket_cap=32, packed_cap=128, cu_len=4, dtype=torch.int32, device="cpu"
                )
            },
            ValueError,
            "out.padded_values must be",
        ),
    ],
)
def test_errors_name_the_argument(over, error, match):
    with pytest.raises(error, match=match):
        _bad_call(**over)


# ---- a forced route (route=): the layout decided on the host, written as given ----


def _group_lens(keep_len, row_ids):
    rows = row_ids.tolist() if row_ids is not None else list(range(keep_len.numel()))
    return [int(keep_len[r]) for r in rows]


def _random_case(rng: random.Random, kind: str):
    """Random values, lengths (0, short, full rows), tables and sometimes a row subset with repeats."""
    batch = rng.randint(1, 7)
    values = make_values(kind, batch, seed=rng.randint(0, 10**6))
    keep_len = torch.tensor([rng.choice([0, rng.randint(1, 4), rng.randint(0, N), N]) for _ in range(batch)])
    row_ids = None
    if rng.random() < 0.4:
        row_ids = torch.tensor([rng.randrange(batch) for _ in range(rng.randint(1, 6))], dtype=torch.int32)
    tables = dict(
        micro_buckets=sorted(rng.sample(range(1, 40), rng.randint(1, 4))),
        packed_buckets=sorted(rng.sample(range(1, 160), rng.randint(1, 4))),
        batch_buckets=sorted(rng.sample(range(1, 10), rng.randint(1, 4))),
    )
    extra = dict(tau_pad=rng.choice([0.0, 0.2, 0.5, 1.0]), eager_max_bucket=rng.choice([0, 4]))
    return values, keep_len, row_ids, tables, extra


@pytest.mark.parametrize("kind", ["ids64", "fp16", "fp32"])
def test_forcing_the_rules_route_is_bitwise_the_unforced_output(kind):
    rng = random.Random(f"forced-{kind}")
    paths = set()
    for _ in range(10):
        values, keep_len, row_ids, tables, extra = _random_case(rng, kind)
        group = row_ids.numel() if row_ids is not None else values.shape[0]
        decision = slice_repack_decision(_group_lens(keep_len, row_ids), **tables, **extra)
        paths.add(decision.path)
        caps = _caps(values, group, tables)
        unforced = run_both(values, keep_len, tables=tables, caps=caps, row_ids=row_ids, pad_value=1, **extra)
        forced = run_both(
            values, keep_len, tables=tables, caps=caps, row_ids=row_ids, pad_value=1, route=decision, **extra
        )
        _assert_same(forced, unforced)
        assert forced.read() == decision
    assert len(paths) >= 3, paths  # the seeds reach most paths


def _valid_layouts(lens, tables):
    """Every layout that holds the group: EMPTY (T = 0), STATIC x (B_G, batch), VARLEN x P, EAGER."""
    g, t, lmax = len(lens), sum(lens), max(lens, default=0)
    routes = [ControlValues(PATH_EAGER, t, t, lmax, 0, g)]
    if t == 0:
        routes.append(ControlValues(PATH_EMPTY, 0, 0, lmax, 0, g))
    for b_g in tables["micro_buckets"]:
        for rows in tables["batch_buckets"]:
            if b_g >= lmax and rows >= g:
                routes.append(ControlValues(PATH_STATIC, b_g, t, lmax, 0, rows))
    routes += [ControlValues(PATH_VARLEN, p, t, lmax, 0, g) for p in tables["packed_buckets"] if p >= t]
    return routes


@pytest.mark.parametrize("kind", ["ids32", "fp16"])
@pytest.mark.parametrize("lens", [[20, 0, 1, 7, 3], [16, 15, 14], [0, 0]], ids=["mixed", "near_full", "zeros"])
def test_forcing_each_valid_layout_writes_that_layout(lens, kind):
    values = make_values(kind, len(lens))
    keep_len = torch.tensor(lens)
    batch = len(lens)
    positions = torch.arange(N).repeat(batch, 1) + 100 * torch.arange(batch)[:, None]
    layouts = _valid_layouts(lens, TABLES)
    assert {r.path for r in layouts} >= {PATH_STATIC, PATH_EAGER}
    for route in layouts:
        out = run_both(values, keep_len, positions=positions, pad_value=0, route=route)
        assert out.read() == route
        assert out.cu_seqlens.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
        if route.path == PATH_EMPTY:
            assert bool((out.packed_src_index == -9).all()) and bool(out.padded_mask.all())
            continue
        flat_vals, flat_pos = _scatter_back(out, route, values, positions)
        keep = (torch.arange(N)[None, :] < keep_len[:, None]).reshape(-1)
        assert torch.equal(_bits(flat_vals[keep]), _bits(values.reshape(batch * N, *values.shape[2:])[keep]))
        assert torch.equal(flat_pos[keep], positions.reshape(-1)[keep])
        if route.path == PATH_STATIC:  # the region [:batch_rows, :B_G] and nothing else
            assert bool((out.padded_src_index[: route.batch_rows, : route.bucket] >= -1).all())
            assert bool((out.padded_src_index[route.batch_rows :] == -9).all())
            assert bool((out.padded_src_index[:, route.bucket :] == -9).all())
            assert bool((out.packed_src_index == -9).all()), "the packed layout must be left alone"
        else:  # the packed slots [:bucket] and nothing else
            assert bool((out.packed_seq_index[: route.bucket] >= -1).all())
            assert bool((out.packed_seq_index[route.bucket :] == -8).all())
            assert bool(out.padded_mask.all()), "the padded layout must be left alone"


# the group [20, 0, 1, 7, 3] under TABLES: G = 5, T = 31, Lmax = 20
_GROUP = [20, 0, 1, 7, 3]
_DEVICE_BAD_ROUTES = {
    "varlen_bucket_below_total": (PATH_VARLEN, 16, 31, 20, 0, 5),
    "varlen_bucket_not_in_table": (PATH_VARLEN, 40, 31, 20, 0, 5),
    "varlen_batch_rows_not_g": (PATH_VARLEN, 32, 31, 20, 0, 8),
    "static_bucket_below_lmax": (PATH_STATIC, 16, 31, 20, 0, 8),
    "static_bucket_not_in_table": (PATH_STATIC, 24, 31, 20, 0, 8),
    "static_batch_rows_below_g": (PATH_STATIC, 32, 31, 20, 0, 4),
    "static_batch_rows_not_in_table": (PATH_STATIC, 32, 31, 20, 0, 6),
    "eager_bucket_not_total": (PATH_EAGER, 32, 31, 20, 0, 5),
    "empty_with_tokens": (PATH_EMPTY, 0, 31, 20, 0, 5),
    "stale_total": (PATH_VARLEN, 32, 30, 20, 0, 5),
    "stale_max_len": (PATH_STATIC, 32, 31, 19, 0, 8),
    "bad_path_code": (5, 32, 31, 20, 0, 5),
}


@pytest.mark.parametrize("name", list(_DEVICE_BAD_ROUTES))
def test_invalid_forced_route_is_flagged_by_kernel_and_reference(name):
    """The kernel's own checks (host validation bypassed, as for tables or lengths on a GPU)."""
    values = make_values("fp32", len(_GROUP))
    keep_len = torch.tensor(_GROUP)
    route = ControlValues(*_DEVICE_BAD_ROUTES[name])
    caps = _caps(values, len(_GROUP), TABLES)
    tensors = [torch.tensor(TABLES[k], dtype=torch.int32) for k in ("micro_buckets", "packed_buckets", "batch_buckets")]
    common = dict(tau_pad=0.2, eager_max_bucket=4, pad_value=0, route=route)
    got = _sentinel(values, **caps)
    _slice_repack_triton(values, keep_len, None, None, *tensors, out=got, **common)
    ref = _sentinel(values, **caps)
    control = slice_repack_reference(values, keep_len, **TABLES, out=ref, **common)
    _assert_same(got, ref)
    assert tuple(control) == (PATH_ERROR, 0, 31, 20, ERR_ROUTE, 0)
    assert bool((got.cu_seqlens == -3).all()) and bool((got.packed_src_index == -9).all())
    assert bool(got.padded_mask.all()), "nothing but the control word is written"


def test_route_decided_for_other_lengths_is_flagged_when_unchecked():
    """The realistic device-side case: keep_len moved after the host decided (check=False)."""
    values = make_values("ids64", len(_GROUP))
    stale = slice_repack_decision([20, 0, 1, 7, 2], **TABLES)
    out = run_both(values, torch.tensor(_GROUP), route=stale, check=False)
    c = out.read(raise_on_error=False)
    assert (c.path, c.error, c.total) == (PATH_ERROR, ERR_ROUTE, 31)
    with pytest.raises(ValueError, match="forced route does not hold the group"):
        out.read()
    with pytest.raises(ValueError, match="route was decided for T = 30"):
        slice_repack(values, torch.tensor(_GROUP), **TABLES, route=stale)


@pytest.mark.parametrize(
    "route, error, match",
    [
        ((PATH_VARLEN, 32, 31, 20, 0, 5), TypeError, "route must be a ControlValues"),
        (ControlValues(PATH_VARLEN, 32.0, 31, 20, 0, 5), TypeError, "route must hold ints"),
        (ControlValues(PATH_ERROR, 0, 31, 20, 0, 0), ValueError, "route .* path must be one of"),
        (ControlValues(7, 32, 31, 20, 0, 5), ValueError, "route .* path must be one of"),
        (ControlValues(PATH_VARLEN, 32, 31, 20, ERR_CAPACITY, 5), ValueError, "route must have error = 0"),
        (ControlValues(PATH_VARLEN, 32, 31, 21, 0, 5), ValueError, "route's T = 31 and Lmax = 21"),
        (ControlValues(PATH_VARLEN, 32, 120, 20, 0, 5), ValueError, "route's T = 120"),
        (ControlValues(PATH_VARLEN, 16, 31, 20, 0, 5), ValueError, "route .* P = 16 is below T = 31"),
        (ControlValues(PATH_VARLEN, 40, 31, 20, 0, 5), ValueError, "route .* P = 40 is not in packed_buckets"),
        (ControlValues(PATH_VARLEN, 32, 31, 20, 0, 8), ValueError, "route .* VARLEN needs batch_rows = G = 5"),
        (ControlValues(PATH_STATIC, 16, 31, 20, 0, 8), ValueError, "route .* B_G = 16 is below Lmax = 20"),
        (ControlValues(PATH_STATIC, 24, 31, 20, 0, 8), ValueError, "route .* B_G = 24 is not in micro_buckets"),
        (ControlValues(PATH_STATIC, 32, 31, 20, 0, 4), ValueError, "route .* batch_rows = 4 are fewer"),
        (ControlValues(PATH_STATIC, 32, 31, 20, 0, 6), ValueError, "route .* batch_rows = 6 is not in batch"),
        (ControlValues(PATH_EAGER, 32, 31, 20, 0, 5), ValueError, "route .* EAGER bucket must be T = 31"),
        (ControlValues(PATH_EMPTY, 0, 31, 20, 0, 5), ValueError, "route .* EMPTY needs T = 0"),
    ],
)
def test_invalid_forced_route_raises_on_the_host(route, error, match):
    values = make_values("ids64", len(_GROUP))
    with pytest.raises(error, match=match):
        slice_repack(values, torch.tensor(_GROUP), **TABLES, route=route, check=False)


def test_forced_route_beyond_out_capacity_raises():
    values = make_values("ids64", len(_GROUP))
    route = ControlValues(PATH_STATIC, 32, 31, 20, 0, 8)
    small = _sentinel(values, **_caps(values, len(_GROUP), TABLES, batch_cap=4))
    with pytest.raises(ValueError, match="route STATIC \\[8, 32\\] does not fit out"):
        slice_repack(values, torch.tensor(_GROUP), **TABLES, route=route, out=small)
    # allocated by slice_repack itself, the buffers fit the forced route
    assert slice_repack(values, torch.tensor(_GROUP), **TABLES, route=route).read() == route
    varlen = ControlValues(PATH_VARLEN, 128, 31, 20, 0, 5)
    assert slice_repack(values, torch.tensor(_GROUP), **TABLES, route=varlen).read() == varlen
