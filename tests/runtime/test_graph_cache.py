"""GraphCache: capture order, replay, LRU eviction, padding fills, static outputs, the debug
pointer check and the eager fallback, with the fake backend on CPU; one real capture on CUDA."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from seer_runtime.serving import graph_cache
from seer_runtime.serving.graph_cache import (
    FILL_EDGE,
    FILL_FIRST_TRUE,
    BufferSpec,
    FakeGraphBackend,
    GraphCache,
)
from seer_runtime.serving.router import PATH_STATIC, PATH_VARLEN, GraphKey, Router, RouterConfig

pytestmark = [pytest.mark.router]

PAD_ID = 99
STATIC_KEYS = [GraphKey(PATH_STATIC, b, n) for b in (2, 4, 8) for n in (8, 16)]
STATIC_BUFFERS = {
    "ids": BufferSpec(("batch", "length"), torch.int64, fill=PAD_ID),
    "positions": BufferSpec(("batch", "length"), torch.int64, fill=0),
    "key_mask": BufferSpec(("batch", "length+2"), torch.bool, fill=FILL_FIRST_TRUE),  # 2 prefix keys
    "hidden": BufferSpec(("batch", "length", 3), torch.float32, fill=0.0),
}


def static_fn(key, b):
    """A stand-in forward: a masked softmax over the keys of each row, and some token arithmetic."""
    scores = torch.arange(b["key_mask"].shape[1], dtype=torch.float32).expand(b["key_mask"].shape)
    probs = torch.softmax(scores.masked_fill(~b["key_mask"], float("-inf")), dim=-1)
    return {"y": b["ids"] * 2 + b["positions"], "probs": probs, "h": b["hidden"].sum(-1)}


def make_static(**kwargs):
    backend = kwargs.pop("backend", None) or FakeGraphBackend()
    cache = GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=backend, **kwargs)
    return cache, backend


def inputs(rows, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (rows, length), generator=g)
    pos = torch.arange(length).expand(rows, length).contiguous()
    mask = torch.ones(rows, length + 2, dtype=torch.bool)
    mask[:, -1] = False  # a real row with one padded key
    return {
        "ids": ids,
        "positions": pos,
        "key_mask": mask,
        "hidden": torch.randn(rows, length, 3, generator=g),
    }


# ------------------------------------------------------------------------------------ buffers
def test_buffers_allocated_once_at_max_size_with_initial_fills():
    cache, _ = make_static()
    assert cache.buffers["ids"].shape == (8, 16) and cache.buffers["key_mask"].shape == (8, 18)
    assert cache.buffers["hidden"].shape == (8, 16, 3)
    assert bool((cache.buffers["ids"] == PAD_ID).all()) and bool((cache.buffers["positions"] == 0).all())
    mask = cache.buffers["key_mask"]
    assert bool(mask[:, 0].all()) and not bool(mask[:, 1:].any())  # one True per row, nothing else
    v = cache.views(GraphKey(PATH_STATIC, 4, 8))
    assert v["ids"].shape == (4, 8) and v["key_mask"].shape == (4, 10) and v["hidden"].shape == (4, 8, 3)
    assert v["ids"].data_ptr() == cache.buffers["ids"].data_ptr()  # views, not copies


def test_buffer_spec_validation():
    with pytest.raises(ValueError, match="dims entry 'rows'"):
        BufferSpec(("rows",))
    with pytest.raises(ValueError, match="non-empty tuple"):
        BufferSpec(())
    with pytest.raises(ValueError, match="non-empty tuple"):
        BufferSpec("batch")
    with pytest.raises(ValueError, match="fixed dim must be >= 1"):
        BufferSpec(("batch", 0))
    with pytest.raises(ValueError, match="needs a bool buffer"):
        BufferSpec(("batch", "length"), torch.int64, fill=FILL_FIRST_TRUE)
    with pytest.raises(ValueError, match="needs a 1-D integer buffer"):
        BufferSpec(("batch", "length"), torch.int32, fill=FILL_EDGE)
    with pytest.raises(ValueError, match="fill must be a number"):
        BufferSpec(("batch",), torch.int32, fill="zero")
    with pytest.raises(TypeError, match="is a float but the buffer is"):
        BufferSpec(("batch",), torch.int64, fill=0.5)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        BufferSpec(("batch",), "int64")
    spec = BufferSpec(["batch+1", " length + 64 ", 7])
    assert spec.shape(GraphKey(PATH_STATIC, 3, 5)) == (4, 69, 7)


def test_cache_argument_validation():
    with pytest.raises(ValueError, match="keys must list at least one key"):
        GraphCache(static_fn, STATIC_BUFFERS, [], device="cpu", backend=FakeGraphBackend())
    with pytest.raises(TypeError, match=r"buffers\['x'\] must be a BufferSpec"):
        GraphCache(static_fn, {"x": (8,)}, STATIC_KEYS, device="cpu", backend=FakeGraphBackend())
    with pytest.raises(ValueError, match="max_graphs"):
        make_static(max_graphs=0)
    with pytest.raises(ValueError, match="warmup"):
        make_static(warmup=-1)
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA device"):
        GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend="cuda")
    with pytest.raises(TypeError, match="lacks the method"):
        GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=object())
    with pytest.raises(ValueError, match="needs an int field 'batch'"):
        GraphCache(static_fn, STATIC_BUFFERS, [(1, 2)], device="cpu", backend=FakeGraphBackend())


# ------------------------------------------------------------------------------------ capture / replay
def test_capture_largest_first_shared_pool_and_warmups():
    cache, fake = make_static()
    calls = []
    cache.fn = lambda key, b: (calls.append(key), static_fn(key, b))[1]
    assert cache.capture() == len(STATIC_KEYS)
    sizes = [k.batch * k.length for k in fake.captured]
    assert sizes == sorted(sizes, reverse=True) and fake.captured[0] == GraphKey(PATH_STATIC, 8, 16)
    assert set(fake.captured) == set(STATIC_KEYS)
    assert len(fake.pools) == 1 and all(p is fake.pools[0] for p in fake.capture_pools)  # one shared pool
    assert fake.warmup_runs == 2 * len(STATIC_KEYS) == cache.counters.warmup_runs
    assert calls[:3] == [GraphKey(PATH_STATIC, 8, 16)] * 3  # 2 warm-ups, then the capture
    assert cache.counters.captures == len(STATIC_KEYS) and cache.counters.replays == 0
    assert cache.capture() == 0  # already captured
    small = [GraphKey(PATH_STATIC, 2, 8), GraphKey(PATH_STATIC, 4, 16)]
    cache2, fake2 = make_static(warmup=0)
    assert cache2.capture(small) == 2 and fake2.captured == small[::-1] and fake2.warmup_runs == 0


def test_run_replays_and_outputs_are_correct_static_slices():
    cache, fake = make_static()
    key = GraphKey(PATH_STATIC, 4, 8)
    x = inputs(3, 5, seed=1)
    out = cache.run(key, x)
    assert fake.captured == [key] and fake.replayed == [key]  # lazily captured, then replayed
    assert cache.counters.captures == 1 and cache.counters.replays == 1
    assert out["y"].shape == (4, 8)
    assert torch.equal(out["y"][:3, :5], x["ids"] * 2 + x["positions"])
    assert bool((out["y"][3:] == 2 * PAD_ID).all()) and bool((out["y"][:3, 5:] == 2 * PAD_ID).all())
    # static outputs: the next run overwrites the same tensors
    x2 = inputs(3, 5, seed=2)
    out2 = cache.run(key, x2, narrow=3)
    assert out2["y"].shape == (3, 8) and out2["y"].data_ptr() == out["y"].data_ptr()
    assert torch.equal(out["y"][:3, :5], x2["ids"] * 2 + x2["positions"])
    assert torch.equal(out2["h"][:, :5], x2["hidden"].sum(-1))
    assert fake.replayed == [key, key] and fake.captured == [key]
    # the narrowed views are made once per key and narrow, and see every later replay
    x3 = inputs(3, 5, seed=3)
    out3 = cache.run(key, x3, narrow=3)
    assert out3["y"] is out2["y"] and torch.equal(out3["y"][:, :5], x3["ids"] * 2 + x3["positions"])
    with pytest.raises(ValueError, match="narrow=5 exceeds"):
        cache.run(key, x2, narrow=5)
    with pytest.raises(ValueError, match="narrow=5 exceeds"):  # a failed narrow is not remembered
        cache.run(key, x2, narrow=5)
    with pytest.raises(ValueError, match="narrow must be"):
        cache.run(key, x2, narrow=-1)
    # a recaptured key's narrowed views are the new capture's
    cache.clear()
    out4 = cache.run(key, x3, narrow=3)
    assert fake.captured == [key, key]
    assert out4["y"] is not out3["y"] and out4["y"].data_ptr() == cache.run(key, x3)["y"].data_ptr()
    assert torch.equal(out4["y"][:, :5], x3["ids"] * 2 + x3["positions"])


def test_padding_gets_benign_values_every_replay():
    cache, _ = make_static()
    key = GraphKey(PATH_STATIC, 8, 16)
    full = inputs(8, 16, seed=3)
    full["ids"].fill_(7)
    full["positions"].fill_(5)
    full["key_mask"].fill_(True)
    cache.run(key, full)
    small = inputs(2, 3, seed=4)
    out = cache.run(key, small)  # the previous, larger inputs must not leak into the padding
    v = cache.views(key)
    assert torch.equal(v["ids"][:2, :3], small["ids"])
    assert bool((v["ids"][2:] == PAD_ID).all()) and bool((v["ids"][:2, 3:] == PAD_ID).all())
    assert bool((v["positions"][2:] == 0).all()) and bool((v["positions"][:2, 3:] == 0).all())
    assert bool((v["hidden"][2:] == 0).all()) and bool((v["hidden"][:2, 3:] == 0).all())
    mask = v["key_mask"]
    assert torch.equal(mask[:2, :5], small["key_mask"]) and not bool(mask[:2, 5:].any())
    assert bool(mask[2:, 0].all()) and not bool(mask[2:, 1:].any())  # one real key per padded row
    assert not bool(torch.isnan(out["probs"]).any())  # so softmax never sees an all-masked row
    assert bool((out["probs"][2:, 0] == 1).all())


def test_fill_edge_repeats_the_last_offset():
    keys = [GraphKey(PATH_VARLEN, 8, p) for p in (16, 32)]
    specs = {
        "tokens": BufferSpec(("length",), torch.int64, fill=PAD_ID),
        "cu_seqlens": BufferSpec(("batch+1",), torch.int32, fill=FILL_EDGE),
        "mask": BufferSpec(("length",), torch.bool, fill=FILL_FIRST_TRUE),
    }

    def fn(key, b):
        lens = b["cu_seqlens"][1:] - b["cu_seqlens"][:-1]
        return lens, b["tokens"] + 1

    fake = FakeGraphBackend()
    cache = GraphCache(fn, specs, keys, device="cpu", backend=fake)
    assert cache.buffers["cu_seqlens"].shape == (9,) and bool((cache.buffers["cu_seqlens"] == 0).all())
    assert cache.buffers["mask"][0] and not bool(cache.buffers["mask"][1:].any())
    cu = torch.tensor([0, 3, 7, 9], dtype=torch.int32)
    lens, toks = cache.run(
        keys[1], {"tokens": torch.arange(9), "cu_seqlens": cu, "mask": torch.ones(9, dtype=torch.bool)}
    )
    assert cache.views(keys[1])["cu_seqlens"].tolist() == [0, 3, 7, 9, 9, 9, 9, 9, 9]
    assert lens.tolist() == [3, 4, 2, 0, 0, 0, 0, 0]  # padding sequences have zero length
    assert toks[:9].tolist() == list(range(1, 10)) and bool((toks[9:] == PAD_ID + 1).all())
    assert not bool(cache.views(keys[1])["mask"][9:].any())
    # an empty real region: zeros, and a 1-D mask keeps one True
    cache.run(keys[0], {"cu_seqlens": cu[:0], "mask": torch.ones(0, dtype=torch.bool)})
    assert cache.views(keys[0])["cu_seqlens"].tolist() == [0] * 9
    assert cache.views(keys[0])["mask"].tolist() == [True] + [False] * 15


def test_fill_padding_for_callers_that_write_views():
    cache, _ = make_static()
    key = GraphKey(PATH_STATIC, 4, 16)
    v = cache.views(key)
    v["ids"].fill_(1)
    v["key_mask"].fill_(True)
    cache.fill_padding(key, {"ids": (2, 10), "key_mask": (2, 12)})
    assert bool((v["ids"][:2, :10] == 1).all()) and bool((v["ids"][2:] == PAD_ID).all())
    assert bool((v["ids"][:2, 10:] == PAD_ID).all())
    assert bool(v["key_mask"][:2, :12].all()) and not bool(v["key_mask"][:2, 12:].any())
    assert v["key_mask"][2:].sum(-1).tolist() == [1, 1]
    with pytest.raises(ValueError, match="does not fit the view"):
        cache.fill_padding(key, {"ids": (5, 1)})
    with pytest.raises(ValueError, match="unknown buffer"):
        cache.fill_padding(key, {"nope": (1, 1)})


def test_write_validation():
    cache, _ = make_static()
    key = GraphKey(PATH_STATIC, 2, 8)
    with pytest.raises(TypeError, match=r"inputs\['ids'\] must be torch.int64"):
        cache.run(key, {"ids": torch.zeros(2, 8, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"inputs\['ids'\] of shape \(3, 8\) does not fit"):
        cache.run(key, {"ids": torch.zeros(3, 8, dtype=torch.int64)})
    with pytest.raises(ValueError, match="unknown buffer 'tokens'"):
        cache.run(key, {"tokens": torch.zeros(2, 8, dtype=torch.int64)})
    with pytest.raises(ValueError, match="not one of this cache's keys"):
        cache.run(GraphKey(PATH_STATIC, 3, 8))
    with pytest.raises(ValueError, match="not one of this cache's keys"):
        cache.views(GraphKey(PATH_VARLEN, 2, 8))


# ------------------------------------------------------------------------------------ eviction
def test_lru_eviction():
    cache, fake = make_static(max_graphs=2)
    a, b, c = (GraphKey(PATH_STATIC, 2, 8), GraphKey(PATH_STATIC, 4, 8), GraphKey(PATH_STATIC, 8, 8))
    cache.run(a)
    cache.run(b)
    cache.run(a)  # b is now the least recently used
    cache.run(c)
    assert fake.released == [b] and cache.captured_keys() == [a, c]
    assert cache.counters.evictions == 1 and b not in cache and a in cache
    cache.run(b)  # recaptured, evicting a
    assert fake.released == [b, a] and cache.captured_keys() == [c, b]
    assert fake.captured == [a, b, c, b] and cache.counters.captures == 4
    assert cache.evict(c) and not cache.evict(a)
    assert fake.released == [b, a, c] and cache.counters.evictions == 3
    cache.clear()
    assert cache.captured_keys() == [] and fake.released[-1] == b
    with pytest.raises(ValueError, match="max_graphs=2"):
        cache.capture([a, b, c])


def test_output_shape_change_and_failed_capture():
    state = {"n": 3}
    fake = FakeGraphBackend()
    cache = GraphCache(
        lambda key, b: b["ids"][: state["n"]], STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=fake
    )
    key = GraphKey(PATH_STATIC, 4, 8)
    cache.run(key)
    state["n"] = 2
    with pytest.raises(RuntimeError, match="static"):
        cache.run(key)
    fake.fail_capture = lambda k: k.length == 16
    with pytest.raises(RuntimeError, match="Possible remedies") as info:
        cache.run(GraphKey(PATH_STATIC, 2, 16))
    assert "STATIC[batch=2,length=16]" in str(info.value)
    bad = GraphCache(lambda key, b: 3, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=FakeGraphBackend())
    with pytest.raises(TypeError, match="fn must return a tensor"):
        bad.run(key)


# ------------------------------------------------------------------------------------ debug
def test_debug_pointer_check_names_the_moved_buffer():
    cache, _ = make_static(debug=True)
    key = GraphKey(PATH_STATIC, 4, 8)
    cache.run(key, inputs(4, 8))
    cache.buffers["ids"] = cache.buffers["ids"].clone()  # rebinding: the graph still reads the old one
    with pytest.raises(RuntimeError, match=r"moved since capture: \['ids'\]"):
        cache.run(key, inputs(4, 8, seed=5))
    # without debug, inputs given to run() still reach the graph (views() keeps the views it made
    # first, over the captured buffers); what a rebound buffer receives, the replay never reads
    quiet, _ = make_static()
    quiet.run(key, inputs(4, 8))
    quiet.buffers["ids"] = quiet.buffers["ids"].clone()
    x = inputs(4, 8, seed=5)
    out = quiet.run(key, x)
    assert torch.equal(out["y"], x["ids"] * 2 + x["positions"])
    quiet.buffers["ids"][:4, :8] = 0
    assert torch.equal(quiet.run(key)["y"], out["y"])


# ------------------------------------------------------------------------------------ eager fallback
def test_eager_fallback_says_so_once(monkeypatch):
    monkeypatch.setattr(graph_cache, "_eager_announced", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cpu_auto = GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu")
        explicit = GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=None)
    eager = [w for w in seen if issubclass(w.category, RuntimeWarning) and "runs eagerly" in str(w.message)]
    assert len(eager) == 1 and "no CUDA device" in str(eager[0].message)
    assert cpu_auto.eager and explicit.eager
    key = GraphKey(PATH_STATIC, 4, 16)
    x = inputs(3, 10, seed=6)
    out = cpu_auto.run(key, x, narrow=3)
    assert torch.equal(out["y"][:, :10], x["ids"] * 2 + x["positions"])
    assert bool((out["y"][:, 10:] == 2 * PAD_ID).all())
    assert cpu_auto.capture() == 0 and cpu_auto.captured_keys() == []
    assert cpu_auto.counters.eager_runs == 1 and cpu_auto.counters.replays == 0


def test_eager_fallback_announcement_from_backend_none(monkeypatch):
    monkeypatch.setattr(graph_cache, "_eager_announced", False)
    with pytest.warns(RuntimeWarning, match="backend=None"):
        GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=None)


# ------------------------------------------------------------------------------------ profiling ranges
def test_ranges_outside_the_captured_region(monkeypatch):
    events = []

    @contextlib.contextmanager
    def fake_range(name):
        events.append(("enter", name))
        yield
        events.append(("exit", name))

    monkeypatch.setattr(graph_cache, "prange", fake_range)
    fake = FakeGraphBackend()
    original = fake.capture

    def capture(fn, pool, key):
        events.append(("capture", key))
        return original(fn, pool, key)

    fake.capture = capture
    cache = GraphCache(static_fn, STATIC_BUFFERS, STATIC_KEYS, device="cpu", backend=fake)
    key = GraphKey(PATH_STATIC, 2, 8)
    cache.run(key)
    name = "graph/capture[STATIC[batch=2,length=8]]"
    assert events == [
        ("enter", name),
        ("capture", key),  # the range opens before the capture and closes after it
        ("exit", name),
        ("enter", "graph/replay[STATIC[batch=2,length=8]]"),
        ("exit", "graph/replay[STATIC[batch=2,length=8]]"),
    ]


# ------------------------------------------------------------------------------------ with the router
def test_router_keys_drive_the_cache():
    router = Router(RouterConfig.for_window(32, max_batch=8))
    keys = router.valid_keys(PATH_STATIC)
    fake = FakeGraphBackend()
    cache = GraphCache(static_fn, STATIC_BUFFERS, keys, device="cpu", backend=fake)
    assert cache.buffers["ids"].shape == (8, 32)
    lens = [30, 29, 31, 32]
    route = router.route(lens)
    assert route.path == PATH_STATIC and route.rows == (0, 1, 2, 3)
    g, n = len(route.rows), max(lens)
    x = inputs(g, n, seed=7)
    out = cache.run(route.key, x, narrow=g)
    assert out["y"].shape == (g, route.key.length)
    assert torch.equal(out["y"][:, :n], x["ids"] * 2 + x["positions"])
    assert fake.captured == [GraphKey(PATH_STATIC, 4, 32)]


# ------------------------------------------------------------------------------------ CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture_and_replay():
    keys = [GraphKey(PATH_STATIC, b, n) for b in (2, 4) for n in (8, 16)]
    specs = {
        "x": BufferSpec(("batch", "length"), torch.float32, fill=0.0),
        "mask": BufferSpec(("batch", "length"), torch.bool, fill=FILL_FIRST_TRUE),
    }

    def fn(key, b):
        s = torch.softmax(b["x"].masked_fill(~b["mask"], float("-inf")), dim=-1)
        return s * 2 + 1

    cache = GraphCache(fn, specs, keys, device="cuda", backend="auto", debug=True)
    assert not cache.eager
    assert cache.capture() == 4 and cache.counters.captures == 4
    key = GraphKey(PATH_STATIC, 4, 16)
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(3, 10, device="cuda", generator=g)
        mask = torch.ones(3, 10, dtype=torch.bool, device="cuda")
        out = cache.run(key, {"x": x, "mask": mask}, narrow=3)
        torch.cuda.synchronize()
        assert out.shape == (3, 16)
        ref = torch.softmax(x, dim=-1) * 2 + 1
        torch.testing.assert_close(out[:, :10], ref)
        assert bool((out[:, 10:] == 1).all())
        full = cache.run(key)
        assert not bool(torch.isnan(full).any())
    assert cache.counters.replays == 6 and cache.counters.captures == 4


def test_observers_see_every_range_once_in_order_also_on_errors(monkeypatch):
    """profiling.observe: enter before the profiler's range, exit after it, also when the block or
    the profiler's own enter raises."""
    from seer_runtime import profiling

    events = []

    class Recorder:
        def enter(self, name):
            events.append(("enter", name))

        def exit(self, name):
            events.append(("exit", name))

    with profiling.observe(Recorder()):
        with profiling.prange("outer"):
            with pytest.raises(KeyError):
                with profiling.prange("inner"):
                    raise KeyError("in the range")
    assert events == [("enter", "outer"), ("enter", "inner"), ("exit", "inner"), ("exit", "outer")]

    class Failing:
        def __enter__(self):
            events.append(("profiler enter", None))
            raise RuntimeError("profiler down")

        def __exit__(self, *exc):
            raise AssertionError("not entered: no exit")

    monkeypatch.setattr(profiling, "_factory", lambda name: Failing())
    events.clear()
    with profiling.observe(Recorder()):
        with pytest.raises(RuntimeError, match="profiler down"):
            with profiling.prange("x"):
                pass
    assert events == [("enter", "x"), ("profiler enter", None), ("exit", "x")]
