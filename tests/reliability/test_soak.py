"""Soak (issue 20): 2000+ requests through Seer, the PWR router and the graph cache (the fake
graph backend, CPU) on a tiny model with tiny windows. Held memory stays flat (live tensors,
Python allocations, resident set), graph entries stay within the configured bound once the
collector has run, and no answer is lost (every window decoded; every 8th batch equal bit for
bit to the unrouted run).

What the soak found: a ``generate`` call's graphs outlived it until Python's cyclic collector
ran; since ``Scheduler.release`` breaks the cycle when a call returns, they are freed at once
(``test_graphs_are_released_when_generate_returns``, with the collector off)."""

from __future__ import annotations

import gc
import os
import sys
import weakref

import pytest
import torch

import seer_kernels
from seer_runtime import GenerationConfig, SeerConfig, generate
from seer_runtime.evaluate import pad_left
from seer_runtime.graphs import FakeGraphBackend
from seer_runtime.serving.router import PATH_STATIC, Router, RouterConfig

from ..tiny_models import tiny

pytestmark = [pytest.mark.reliability, pytest.mark.router, pytest.mark.usefixtures("reference_kernels")]

REQUESTS = 2048
W = 8
ROUTER = RouterConfig.for_window(W, max_batch=32, tau_pad=0.25)
GEN = GenerationConfig(gen_length=W, block_length=8, prefix_cache=True, tie_break="stable")
SEER = SeerConfig(probe_layer=1, guard=False)  # its cuts are planted: the soak chooses the routes


@pytest.fixture
def planted(monkeypatch):
    """``planted[:] = lengths`` sets the window each request keeps at step 0 (Seer's scan replaced)."""
    lengths = torch.full((64,), W, dtype=torch.int32)
    monkeypatch.setattr(seer_kernels, "snr_boundary", lambda s, v, **kw: lengths[: s.shape[0]].clone())
    return lengths


def static_keys() -> int:
    """A bound: the static buckets a run may serve (each a graph of its own)."""
    return sum(1 for k in Router(ROUTER).valid_keys(PATH_STATIC) if k.length <= W)


class SoakBackend(FakeGraphBackend):
    """The fake backend with counters instead of per-replay lists (they would be the test's own
    growth), and weak references to every graph handle: a handle alive after its ``generate``
    call returned is a graph the runtime still holds."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[weakref.ref] = []
        self.captures = self.replays = self.releases = 0

    def held(self) -> int:
        """Graph handles still alive (the dead references are dropped)."""
        self.refs = [r for r in self.refs if r() is not None]
        return len(self.refs)

    def capture(self, fn, pool, key):
        handle, outputs = super().capture(fn, pool, key)
        self.captured.clear()
        self.captures += 1
        self.refs.append(weakref.ref(handle))
        return handle, outputs

    def replay(self, handle) -> None:
        super().replay(handle)
        self.replayed.clear()
        self.replays += 1

    def release(self, handle) -> None:
        self.releases += 1


def live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is torch.Tensor or type(o) is torch.nn.Parameter)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def batch(g: torch.Generator, size: int, planted: torch.Tensor, pad: int):
    """``size`` random prompts of 1-11 tokens; every other batch plants short windows (VARLEN) or
    long ones (STATIC)."""
    lengths = torch.randint(1, 12, (size,), generator=g)
    prompts = [torch.randint(0, 240, (int(n),), generator=g).tolist() for n in lengths]
    low = 1 if int(torch.randint(0, 2, (1,), generator=g)) else W - 1
    planted[:] = torch.randint(low, W + 1, (planted.shape[0],), generator=g, dtype=torch.int32)
    return pad_left(prompts, pad)


@pytest.mark.slow
def test_memory_and_graph_entries_stay_flat_over_2000_requests(planted):
    model = tiny("llada-8b-instruct")
    bound = static_keys()
    backend = SoakBackend()
    g = torch.Generator().manual_seed(0)
    sizes = [32, 27, 19, 32, 1, 23, 32, 3]  # batch compositions change the routes and the graph keys
    samples, done, batches, most_held, paths = [], 0, 0, 0, set()
    while done < REQUESTS:
        size = sizes[batches % len(sizes)]
        ids, mask = batch(g, size, planted, model.token_ids.pad)
        out = generate(model, ids, attention_mask=mask, gen=GEN, seer=SEER, router=ROUTER, graphs=backend)
        final = out.stats.extra["seer"]["final_window"]
        for r, n in enumerate(final):  # nothing left undecoded; the cut tail reported as EOS
            assert not bool((out.responses[r, :n] == model.token_ids.mask).any()), (batches, r)
            assert bool((out.responses[r, n:] == model.token_ids.eos).all()), (batches, r)
        paths |= set(out.stats.extra["router"])
        if batches % 8 == 0:
            naive = generate(model, ids, attention_mask=mask, gen=GEN, seer=SEER)
            assert torch.equal(out.responses, naive.responses), f"batch {batches}: the routed answers differ"
        del out
        done += size
        batches += 1
        if batches % 12 == 0:  # finished calls' graphs are freed when they return (the test below)
            samples.append((done, live_tensors(), sys.getallocatedblocks(), resident_bytes()))
            most_held = max(most_held, backend.held())
            assert backend.held() <= bound, f"{backend.held()} graphs held after batch {batches}, bound {bound}"

    assert done >= 2000 and backend.captures > 0 and backend.replays > backend.captures
    assert {"STATIC", "VARLEN", "EAGER"} <= paths, paths
    (n0, tensors0, blocks0, rss0), (n1, tensors1, blocks1, rss1) = samples[1], samples[-1]  # [0]: warm-up
    grown = n1 - n0
    print(f"\nsoak: {done} requests in {batches} batches, {backend.captures} captures, {backend.replays} replays, "
          f"at most {most_held} graphs held after a collection (bound {bound}); over the last {grown} requests: "
          f"live tensors {tensors0} -> {tensors1}, Python blocks {blocks0} -> {blocks1}, resident "
          f"{rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB")
    assert tensors1 <= tensors0, f"live tensors grew from {tensors0} to {tensors1} over {grown} requests"
    # one leaked object per request would be >= 1 block each; the caches keyed by shapes (torch's, the
    # runtime's) still fill slowly here (about 4 blocks per batch at first, fewer later)
    assert blocks1 - blocks0 < grown // 2, f"Python blocks grew by {blocks1 - blocks0} over {grown} requests"
    assert rss1 - rss0 < 64 * 2**20, f"resident set grew {(rss1 - rss0) / 2**20:.1f} MiB"


def test_graphs_are_released_when_generate_returns(planted):
    model = tiny("llada-8b-instruct")
    backend = SoakBackend()
    g = torch.Generator().manual_seed(1)
    gc.collect()
    gc.disable()  # a server's collector runs when it runs: here not between the calls
    try:
        for _ in range(4):
            ids, mask = batch(g, 16, planted, model.token_ids.pad)
            generate(model, ids, attention_mask=mask, gen=GEN, seer=SEER, router=ROUTER, graphs=backend)
        held = backend.held()
    finally:
        gc.enable()
    assert backend.captures > 0
    assert held == 0, f"{held} graphs of finished calls still held ({backend.captures} captured)"
