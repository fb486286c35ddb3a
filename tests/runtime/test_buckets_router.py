"""Buckets and the PWR router: tables, the route (paths, keys, token counts) against the
kernel's ``slice_repack_decision``, the float64 boundary, and the set of valid graph keys."""

from __future__ import annotations

import dataclasses
import math
import random
from bisect import bisect_left
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_kernels.slice_repack_control import (
    PATH_EAGER,
    PATH_EMPTY,
    PATH_STATIC,
    PATH_VARLEN,
    slice_repack_decision,
)
from seer_runtime.serving.buckets import batch_buckets, check_buckets, micro_buckets, packed_buckets
from seer_runtime.serving.router import GraphKey, Route, Router, RouterConfig, RouterStats

pytestmark = [pytest.mark.router]


def kernel_rule(cfg: RouterConfig, lens):
    return slice_repack_decision(
        lens,
        micro_buckets=cfg.micro_buckets,
        packed_buckets=cfg.packed_buckets,
        batch_buckets=cfg.batch_buckets,
        tau_pad=cfg.tau_pad,
        eager_max_bucket=cfg.eager_max_bucket,
    )


def assert_matches_kernel(router: Router, route: Route, lens_of_group):
    """The route's path, key and token counts follow the kernel's decision for its rows."""
    cfg = router.config
    d = kernel_rule(cfg, lens_of_group)
    assert route.path == d.path, (lens_of_group, route, d)
    assert route.stats.path == d.path
    assert route.stats.rows == len(lens_of_group)
    assert route.stats.useful_tokens == d.total == sum(lens_of_group)
    if d.path == PATH_STATIC:
        assert route.key == GraphKey(PATH_STATIC, d.batch_rows, d.bucket)
        assert route.stats.computed_tokens == d.batch_rows * d.bucket
    elif d.path == PATH_VARLEN:
        assert route.key == GraphKey(PATH_VARLEN, cfg.batch_buckets[-1], d.bucket)
        assert route.stats.computed_tokens == d.bucket
    else:
        assert route.key is None
        assert route.stats.computed_tokens == (d.total if d.path == PATH_EAGER else 0)


# ------------------------------------------------------------------------------------ buckets
def test_micro_buckets():
    assert micro_buckets(128) == (8, 16, 32, 64, 128)
    assert micro_buckets(100) == (8, 16, 32, 64, 100)
    assert micro_buckets(8) == (8,)
    assert micro_buckets(4) == (4,)
    assert micro_buckets(64, smallest=16) == (16, 32, 64)
    with pytest.raises(ValueError, match="n_max"):
        micro_buckets(0)
    with pytest.raises(TypeError, match="n_max"):
        micro_buckets(64.0)


def test_batch_buckets():
    b = batch_buckets(256)
    assert b[:6] == (1, 2, 4, 8, 16, 24) and b[-1] == 256 and len(b) == 35
    assert batch_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert batch_buckets(3) == (1, 2, 3)
    assert batch_buckets(1) == (1,)
    with pytest.raises(ValueError, match="align"):
        batch_buckets(16, align=0)


def test_packed_buckets_exact_and_waste_bound():
    assert packed_buckets(300, smallest=64, per_octave=2, align=16) == (64, 96, 128, 192, 256, 300)
    assert packed_buckets(50, smallest=64) == (50,)
    for per_octave in (1, 4, 8):
        table = packed_buckets(40000, per_octave=per_octave, align=16)
        assert table[-1] == 40000
        assert all(b % 16 == 0 for b in table[:-1])
        # rounding a total up never costs more than one step of the geometric ladder plus alignment
        for t in range(64, 40001, 97):
            p = table[bisect_left(table, t)]
            assert p >= t
            assert p <= math.ceil(t * 2 ** (1 / per_octave) / 16) * 16, (per_octave, t, p)


@pytest.mark.parametrize(
    "values, exc, text",
    [
        ([], ValueError, "micro_buckets must not be empty"),
        ([8, 8], ValueError, "micro_buckets must be sorted strictly ascending"),
        ([16, 8], ValueError, "micro_buckets must be sorted"),
        ([0, 8], ValueError, "micro_buckets entries must be >= 1"),
        ([8, 2**31], ValueError, "micro_buckets entries must fit int32"),
        ([8, 16.0], TypeError, "micro_buckets must hold ints"),
        ([True, 8], TypeError, "micro_buckets must hold ints"),
        ("816", TypeError, "micro_buckets must be a sequence"),
        (8, TypeError, "micro_buckets must be a sequence"),
    ],
)
def test_check_buckets_errors_name_the_argument(values, exc, text):
    with pytest.raises(exc, match=text):
        check_buckets("micro_buckets", values)
    with pytest.raises(exc, match=text):
        RouterConfig(micro_buckets=values)


# ------------------------------------------------------------------------------------ config
def test_config_defaults_and_frozen():
    cfg = RouterConfig(micro_buckets=[8, 16], packed_buckets=[32], batch_buckets=[1, 2, 4])
    assert cfg.micro_buckets == (8, 16) and isinstance(cfg.batch_buckets, tuple)
    assert cfg.tau_pad == 0.2 and cfg.eager_max_bucket == 4 and cfg.n_max == 16 and cfg.max_batch == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tau_pad = 0.5
    w = RouterConfig.for_window(100, max_batch=64, tau_pad=0.3)
    assert w.micro_buckets == (8, 16, 32, 64, 100)
    assert w.packed_buckets[-1] == 6400 and w.batch_buckets[-1] == 64 and w.tau_pad == 0.3
    assert RouterConfig.from_dict(w.to_dict()) == w


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        ({"tau_pad": -0.1}, ValueError, "tau_pad must lie in"),
        ({"tau_pad": 1.5}, ValueError, "tau_pad must lie in"),
        ({"tau_pad": float("nan")}, ValueError, "tau_pad must lie in"),
        ({"tau_pad": "0.2"}, TypeError, "tau_pad must be a float"),
        ({"tau_pad": True}, TypeError, "tau_pad must be a float"),
        ({"eager_max_bucket": -1}, ValueError, "eager_max_bucket must be >= 0"),
        ({"eager_max_bucket": 4.0}, TypeError, "eager_max_bucket must be an int"),
        ({"packed_buckets": [64, 32]}, ValueError, "packed_buckets must be sorted"),
        ({"batch_buckets": [0, 2]}, ValueError, "batch_buckets entries must be >= 1"),
    ],
)
def test_config_validation(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        RouterConfig(**kwargs)
    with pytest.raises(TypeError, match="config must be a RouterConfig"):
        Router({"tau_pad": 0.2})
    with pytest.raises(ValueError, match=r"unknown RouterConfig fields: \['grouping'\]"):
        RouterConfig.from_dict({"tau_pad": 0.2, "grouping": "length"})


# -------------------------------------------------------------------------- one group = the kernel's rule
def random_config(rng: random.Random, **options) -> RouterConfig:
    pool = [2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64, 100, 128]
    micro = sorted(rng.sample(pool, rng.randint(1, 6)))
    packed = sorted(rng.sample(range(1, 2000), rng.randint(1, 8)))
    batch = sorted(rng.sample(range(1, 70), rng.randint(1, 6)))
    tau = rng.choice([0.0, 0.1, 0.2, 0.2, 0.4, 0.6, 1.0, rng.random()])
    return RouterConfig(
        micro_buckets=micro,
        packed_buckets=packed,
        batch_buckets=batch,
        tau_pad=tau,
        eager_max_bucket=rng.choice([0, 2, 4, 4, 8, 16]),
        **options,
    )


def random_lengths(rng: random.Random, n: int, top: int) -> list[int]:
    kind = rng.random()
    if kind < 0.2:
        return [rng.randint(0, top)] * n  # all equal
    if kind < 0.3:
        return [rng.choice([0, 1, top, top + 1]) for _ in range(n)]  # edges
    return [rng.choice([rng.randint(0, 6), rng.randint(0, top), rng.randint(0, top + 20)]) for _ in range(n)]


def test_route_equals_slice_repack_decision_random():
    rng = random.Random(1234)
    paths = set()
    for _ in range(3000):
        cfg = random_config(rng)
        router = Router(cfg)
        lens = random_lengths(rng, rng.randint(1, min(40, cfg.batch_buckets[-1])), 140)
        route = router.route(lens)
        assert route.rows == tuple(range(len(lens)))
        assert_matches_kernel(router, route, lens)
        paths.add(route.path)
    assert paths == {PATH_EMPTY, PATH_STATIC, PATH_VARLEN, PATH_EAGER}  # every branch exercised


@settings(max_examples=300, deadline=None)
@given(
    lens=st.lists(st.integers(0, 300), min_size=1, max_size=64),
    tau=st.floats(0.0, 1.0),
    n_max=st.sampled_from([8, 16, 64, 100, 256]),
    eager_max=st.integers(0, 20),
)
def test_single_route_equals_slice_repack_decision(lens, tau, n_max, eager_max):
    cfg = RouterConfig.for_window(n_max, max_batch=64, tau_pad=tau, eager_max_bucket=eager_max)
    router = Router(cfg)
    route = router.route(lens)
    assert route.rows == tuple(range(len(lens)))
    assert_matches_kernel(router, route, lens)
    if route.key is not None:
        assert route.key in router.valid_keys()


def test_tau_pad_boundary_exactly():
    cfg = dict(micro_buckets=[8, 16], packed_buckets=[64, 128], batch_buckets=[1, 2, 4, 8])
    # PWR = 1 - 32/40 = 0.19999999999999996 in float64: STATIC at tau_pad = 0.2
    router = Router(RouterConfig(tau_pad=0.2, **cfg))
    route = router.route([8, 8, 8, 4, 4])
    assert route.path == PATH_STATIC and route.key == GraphKey(PATH_STATIC, 8, 8)
    route = router.route([8, 8, 8, 4, 3])  # PWR 0.225
    assert route.path == PATH_VARLEN and route.key == GraphKey(PATH_VARLEN, 8, 64)
    # just above / at the float64 PWR itself
    for lens in ([8, 8, 8, 4, 4], [16, 10, 9], [7, 7, 1, 1, 1, 1, 1]):
        g, t, b = len(lens), sum(lens), 8 if max(lens) <= 8 else 16
        pwr = 1.0 - t / (g * b)
        assert Router(RouterConfig(tau_pad=pwr, **cfg)).route(lens).path == PATH_STATIC
        below = math.nextafter(pwr, -math.inf)
        assert Router(RouterConfig(tau_pad=below, **cfg)).route(lens).path == PATH_VARLEN
    # where float64 and exact rational arithmetic disagree, the router follows float64 (the kernel):
    # e.g. G=3, B=8, T=19: exact PWR 5/24 <= tau_pad = float(5/24), but 1 - 19/24 rounds above it
    r = Router(
        RouterConfig(
            micro_buckets=[8], packed_buckets=[4096], batch_buckets=[64], tau_pad=float(Fraction(5, 24))
        )
    )
    route = r.route([8, 8, 3])
    assert route.path == PATH_VARLEN
    found = 0
    for g in range(2, 40, 3):
        for b in (8, 32):
            for t in range(g, g * b, 7):
                exact = 1 - Fraction(t, g * b)
                tau = float(exact)
                float_static = (1.0 - t / (g * b)) <= tau
                if (Fraction(tau) >= exact) == float_static:
                    continue
                lens = [b] + [0] * (g - 1)
                rest, i = t - b, 1
                while rest > 0:
                    lens[i] = min(b, rest)
                    rest -= lens[i]
                    i += 1
                r = Router(
                    RouterConfig(micro_buckets=[b], packed_buckets=[4096], batch_buckets=[64], tau_pad=tau)
                )
                route = r.route(lens)
                assert (route.path == PATH_STATIC) == float_static, (g, b, t)
                assert_matches_kernel(r, route, lens)
                found += 1
    assert found > 20


# ------------------------------------------------------------------------------------ edges
def test_edges():
    cfg = RouterConfig.for_window(128, max_batch=64)
    router = Router(cfg)
    # all L* equal at a bucket size: one static group, no padding
    r = router.route([32] * 40)
    assert r.path == PATH_STATIC and r.key == GraphKey(PATH_STATIC, 40, 32) and r.stats.padded_tokens == 0
    # all L* equal between buckets: PWR = 1 - 20/32 > 0.2 -> packed
    r = router.route([20] * 40)
    assert r.path == PATH_VARLEN and r.stats.useful_tokens == 800
    assert r.key.length == cfg.packed_buckets[bisect_left(cfg.packed_buckets, 800)]
    # L* = 1 everywhere: bucket 8, PWR 0.875 -> packed into the smallest packed bucket
    r = router.route([1] * 10)
    assert r.path == PATH_VARLEN and r.key == GraphKey(PATH_VARLEN, 64, cfg.packed_buckets[0])
    # L* = N_max everywhere
    r = router.route([128] * 7)
    assert r.path == PATH_STATIC and r.key == GraphKey(PATH_STATIC, 8, 128)
    # a single row is a lone straggler
    r = router.route([50])
    assert r.path == PATH_EAGER and r.key is None and r.stats.computed_tokens == 50
    # all zero: nothing to run
    r = router.route([0, 0, 0])
    assert r.path == PATH_EMPTY and r.rows == (0, 1, 2) and r.stats.computed_tokens == 0


def test_one_long_row_and_rows_longer_than_n_max():
    lens = [16] * 31 + [120]
    r = Router(RouterConfig.for_window(128, max_batch=64)).route(lens)
    assert r.path == PATH_VARLEN  # one long row forces bucket 128 on everyone: PWR 0.85
    lens = [10, 200, 12, 129, 14, 16]
    r = Router(RouterConfig.for_window(128, max_batch=64)).route(lens)
    assert r.path == PATH_EAGER and r.stats.computed_tokens == sum(lens)  # no micro-bucket holds 200


def test_route_input_errors_and_forms():
    router = Router(RouterConfig.for_window(64, max_batch=16))
    with pytest.raises(ValueError, match="lengths is empty"):
        router.route([])
    with pytest.raises(ValueError, match=r"lengths\[1\] must be >= 0"):
        router.route([3, -1])
    with pytest.raises(TypeError, match=r"lengths\[0\] must be an int"):
        router.route([3.0])
    with pytest.raises(TypeError, match=r"lengths\[1\] must be an int"):
        router.route([3, True])
    with pytest.raises(TypeError, match="lengths must be a sequence"):
        router.route(5)
    with pytest.raises(ValueError, match="exceeds the largest batch bucket 16"):
        router.route([3] * 17)
    with pytest.raises(ValueError, match="must be 1-D"):
        router.route(torch.ones(2, 2, dtype=torch.int64))
    assert router.route(torch.tensor([8, 8, 8], dtype=torch.int32)) == router.route([8, 8, 8])
    assert router.route((8, 8, 8)) == router.route([8, 8, 8])


# ------------------------------------------------------------------------------------ keys
def test_valid_keys_enumeration():
    cfg = RouterConfig(
        micro_buckets=(4, 8, 16),
        packed_buckets=(16, 64, 256, 1024),
        batch_buckets=(1, 2, 4, 8),
        tau_pad=0.2,
        eager_max_bucket=4,
    )
    router = Router(cfg)
    static = router.valid_keys(PATH_STATIC)
    # micro 4 <= eager_max_bucket never runs static; batch bucket 1 is never the bucket of >= 2 rows
    assert set(static) == {GraphKey(PATH_STATIC, b, m) for b in (2, 4, 8) for m in (8, 16)}
    # the largest varlen total: 8 rows at bucket 16 with PWR > 0.2 -> T <= 102 -> buckets 16, 64, 256
    assert router.valid_keys(PATH_VARLEN) == tuple(GraphKey(PATH_VARLEN, 8, p) for p in (256, 64, 16))
    keys = router.valid_keys()
    assert [k.tokens for k in keys] == sorted((k.tokens for k in keys), reverse=True)
    assert set(keys) == set(static) | set(router.valid_keys(PATH_VARLEN))
    with pytest.raises(ValueError, match="path must be"):
        router.valid_keys(PATH_EAGER)
    # tight at the top: a batch with the largest varlen total reaches the largest varlen key
    r = router.route([16] * 6 + [6, 0])
    assert r.path == PATH_VARLEN and r.key == GraphKey(PATH_VARLEN, 8, 256)
    r = router.route([16] * 6 + [7, 0])  # one more token: PWR 0.1953 -> static
    assert r.path == PATH_STATIC
    # the largest varlen total (102) sits exactly on a bucket: the next bucket is unreachable
    edge = Router(dataclasses.replace(cfg, packed_buckets=(16, 64, 101, 102, 256)))
    assert edge.valid_keys(PATH_VARLEN) == tuple(GraphKey(PATH_VARLEN, 8, p) for p in (102, 101, 64, 16))
    assert edge.route([16] * 6 + [6, 0]).key == GraphKey(PATH_VARLEN, 8, 102)
    # nothing can run a graph
    assert (
        Router(RouterConfig(micro_buckets=(4,), packed_buckets=(64,), batch_buckets=(8,))).valid_keys() == ()
    )
    assert (
        Router(RouterConfig(micro_buckets=(8,), packed_buckets=(64,), batch_buckets=(1,))).valid_keys() == ()
    )


def test_every_routed_key_is_valid():
    rng = random.Random(7)
    for _ in range(300):
        cfg = random_config(rng)
        router = Router(cfg)
        n = rng.randint(1, cfg.batch_buckets[-1])
        route = router.route(random_lengths(rng, n, 140))
        assert route.key is None or route.key in router.valid_keys(), (cfg, route)


# ------------------------------------------------------------------------------------ statistics
def test_router_stats():
    router = Router(RouterConfig(micro_buckets=(8, 16), packed_buckets=(64,), batch_buckets=(1, 2, 4)))
    stats = RouterStats()
    stats.add(router.route([16, 16, 16]))  # static: 4 x 16 = 64 computed, 48 useful
    stats.add(router.route([3, 0]))  # bucket 8, PWR 0.81: packed into 64
    stats.add(router.route([0, 0]))  # nothing to run
    stats.add(router.route([5]))  # a lone row: eager
    d = stats.as_dict()
    assert stats.calls == 4
    assert d["STATIC"] == {
        "groups": 1,
        "rows": 3,
        "useful_tokens": 48,
        "computed_tokens": 64,
        "padded_tokens": 16,
        "waste": 0.25,
    }
    assert d["EMPTY"]["rows"] == 2 and d["EMPTY"]["computed_tokens"] == 0
    assert d["VARLEN"] == {
        "groups": 1,
        "rows": 2,
        "useful_tokens": 3,
        "computed_tokens": 64,
        "padded_tokens": 61,
        "waste": 61 / 64,
    }
    assert d["EAGER"]["groups"] == 1 and d["EAGER"]["useful_tokens"] == 5 and d["EAGER"]["padded_tokens"] == 0
    assert stats.padded_tokens() == 77 and stats.waste() == pytest.approx(77 / (64 + 64 + 5))
    assert stats.waste(PATH_EMPTY) == 0.0
    table = stats.table()
    assert "STATIC" in table and "VARLEN" in table and table.splitlines()[-1].startswith("total")
    assert RouterStats().waste() == 0.0


def test_route_remembers_a_bounded_number_of_length_tuples(monkeypatch):
    """A decode re-routes the same lengths every step: the route is remembered, equal to a fresh
    router's, and the memo keeps at most ``ROUTE_MEMO`` length tuples (the oldest goes first)."""
    import seer_runtime.serving.router as router_module

    monkeypatch.setattr(router_module, "ROUTE_MEMO", 3)
    router = Router(RouterConfig.for_window(64, max_batch=8))
    first = router.route([5, 60, 17])
    assert router.route((5, 60, 17)) is first
    assert first == Router(RouterConfig.for_window(64, max_batch=8)).route([5, 60, 17])
    for n in range(1, 6):
        router.route([n, 64])
    assert len(router._routes) == 3 and (5, 60, 17) not in router._routes
    assert router.route([5, 60, 17]) == first


def test_unchecked_route_looks_up_the_memo_first_and_validates_what_is_new():
    """``check=False`` (the engine's window lengths, every step): a remembered tuple is served from
    the memo without validating it again; a new one is validated as ever, and its route is the
    checked call's."""
    router = Router(RouterConfig.for_window(64, max_batch=8))
    first = router.route((5, 60, 17), check=False)
    assert first == router.route([5, 60, 17]) and router.route((5, 60, 17), check=False) is first
    with pytest.raises(ValueError, match=r"lengths\[1\] must be >= 0"):
        router.route((3, -1), check=False)
    with pytest.raises(ValueError, match="lengths is empty"):
        router.route((), check=False)
    with pytest.raises(TypeError, match=r"lengths\[0\] must be an int"):
        router.route((3.0,), check=False)
