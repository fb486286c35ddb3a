"""The one graph mechanism (``seer_runtime.graphs``): a key runs eagerly, is captured, then
replays; capture failures (said once, or raised when CUDA graphs were asked for); the LRU bound;
capture ids; profiling ranges outside the captured region; the router's bucket inputs and their
padding; one real capture on CUDA."""

from __future__ import annotations

import contextlib
import logging
import warnings

import pytest
import torch

from seer_runtime import graphs as graphs_module
from seer_runtime.graphs import (
    BucketInputs,
    FakeGraphBackend,
    GraphCaptureError,
    Graphs,
    RecordingGraphBackend,
    resolve_backend,
)

pytestmark = [pytest.mark.router]


def test_a_failed_capture_runs_eagerly_said_once_or_raises_when_graphs_were_asked_for(monkeypatch):
    monkeypatch.setattr(graphs_module, "_announced", set())
    backend = FakeGraphBackend()
    backend.fail_capture = lambda key: key == "bad"
    graphs = Graphs(backend)
    x = torch.ones(2)
    graphs.run("bad", lambda: x + 1)  # first sight: eager
    with pytest.warns(RuntimeWarning, match="could not be captured"), pytest.raises(RuntimeError, match="fake"):
        graphs.run("bad", lambda: x + 1)  # the fake capture ran the unit: its effects cannot be undone
    assert graphs.counters.failures == 1
    assert torch.equal(graphs.run("bad", lambda: x + 2), x + 2) and graphs.counters.failures == 1  # eager from now on
    strict = FakeGraphBackend()
    strict.strict, strict.fail_capture = True, lambda key: True
    graphs = Graphs(strict)
    graphs.run("k", lambda: x + 1)
    with pytest.raises(GraphCaptureError, match="capturing the unit 'k' failed"):
        graphs.run("k", lambda: x + 1)


def test_capture_ids_name_the_capture_whose_outputs_a_unit_reads():
    graphs = Graphs(RecordingGraphBackend(), max_graphs=1)
    x = torch.ones(3)
    assert graphs.capture_id("a") is None
    graphs.run("a", lambda: x * 2)
    assert graphs.capture_id("a") is None  # first sight: eager, nothing captured
    graphs.run("a", lambda: x * 2)
    assert graphs.capture_id("a") == 1
    for _ in range(2):
        graphs.run("b", lambda: x * 3)  # the bound evicts "a"
    assert graphs.capture_id("a") is None and graphs.capture_id("b") == 2


def test_ranges_outside_the_captured_region(monkeypatch):
    events = []

    @contextlib.contextmanager
    def fake_range(name):
        events.append(("enter", name))
        yield
        events.append(("exit", name))

    monkeypatch.setattr(graphs_module, "prange", fake_range)
    fake = FakeGraphBackend()
    original = fake.capture

    def capture(fn, pool, key):
        events.append(("capture", key))
        return original(fn, pool, key)

    fake.capture = capture
    graphs = Graphs(fake)
    for _ in range(3):
        graphs.run("k", lambda: torch.ones(1))
    assert events == [
        ("enter", "graph/eager"), ("exit", "graph/eager"),
        ("enter", "graph/capture"), ("capture", "k"), ("exit", "graph/capture"),  # around the capture
        ("enter", "graph/replay"), ("exit", "graph/replay"),
    ]


def test_the_say_once_notice_names_the_device(monkeypatch, caplog):
    """Steps run eagerly where CUDA graphs cannot be: said once, as an INFO log of ``seer_runtime``
    (``seer --verbose`` shows it), not a warning every CPU run would print."""
    monkeypatch.setattr(graphs_module, "_announced", set())
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO, logger="seer_runtime"):
        warnings.simplefilter("always")
        for _ in range(3):
            assert resolve_backend("auto", torch.device("cpu")) is None
    notices = [r for r in caplog.records if r.name == "seer_runtime"]
    assert len(notices) == 1 and "eagerly on cpu" in notices[0].getMessage()
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)]


def test_bucket_inputs_pad_the_rows_a_group_leaves_empty():
    inputs = BucketInputs(4, 6, 3, layers=2, kv_heads=2, head_dim=5, kv_dtype=torch.float32, pad_id=99,
                          device=torch.device("cpu"))
    assert inputs.key_mask.shape == (4, 9) and bool(inputs.key_mask[:, 0].all())
    g = torch.Generator().manual_seed(0)
    ids, positions = torch.randint(0, 50, (3, 6), generator=g), torch.arange(6).expand(3, 6)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, 1] = False
    keys = [torch.randn(5, 2, 3, 5, generator=g) for _ in range(2)]  # the whole prompt cache: 5 requests
    values = [torch.randn(5, 2, 3, 5, generator=g) for _ in range(2)]
    inputs.write(ids, positions, mask, keys, values, torch.tensor([4, 0, 2]))
    inputs.ids[3] = 7  # a stale row from an earlier group
    inputs.write(ids[:2], positions[:2], mask[:2], keys, values, torch.tensor([1, 3]))
    assert torch.equal(inputs.ids[:2], ids[:2]) and bool((inputs.ids[2:] == 99).all())
    assert bool((inputs.positions[2:] == 0).all()) and torch.equal(inputs.key_mask[:2], mask[:2])
    assert torch.equal(inputs.key_mask[2:], torch.tensor([[True] + [False] * 8] * 2))  # one real key per padded row
    assert torch.equal(inputs.keys[1][:2], keys[1][[1, 3]]) and not bool(inputs.values[0][2:].any())
    assert inputs.nbytes == sum(t.numel() * t.element_size() for t in (
        inputs.ids, inputs.positions, inputs.key_mask, *inputs.keys, *inputs.values))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture_and_replay():
    """A real CUDA graph: eager, captured, replayed with new inputs written in place, equal to eager."""
    graphs = Graphs(resolve_backend("cuda", torch.device("cuda")))
    x = torch.zeros(3, 10, device="cuda")
    mask = torch.ones(3, 10, dtype=torch.bool, device="cuda")

    def fn():
        return torch.softmax(x.masked_fill(~mask, float("-inf")), dim=-1) * 2 + 1

    for seed in range(4):
        x.copy_(torch.randn(3, 10, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        out = graphs.run("k", fn)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, torch.softmax(x, dim=-1) * 2 + 1)
    assert graphs.counters.as_dict() == {"eager_runs": 1, "captures": 1, "replays": 3, "failures": 0,
                                         "evictions": 0}


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
