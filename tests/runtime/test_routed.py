"""Routed execution after Seer's cut: the same requests give identical outputs on the static,
varlen and eager paths (and on the naive padded path), with the per-path token report."""

from __future__ import annotations

import pytest
import torch

import seer_kernels
from seer_runtime import GenerationConfig, generate
from seer_runtime.evaluate import pad_left
from seer_runtime.seer import SeerConfig
from seer_runtime.serving.router import RouterConfig

from ..tiny_models import tiny

pytestmark = [pytest.mark.router, pytest.mark.usefixtures("reference_kernels")]

W = 16


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"])
@pytest.mark.parametrize("cache", [False, True])
def test_same_outputs_on_every_path(kind, cache, monkeypatch):
    model = tiny(kind)
    planted = torch.tensor([3, 16, 9, 2, 12], dtype=torch.int32)
    monkeypatch.setattr(seer_kernels, "snr_boundary", lambda s, v, **kw: planted[: s.shape[0]].clone())
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15], [16, 17, 18, 19]]
    ids, mask = pad_left(prompts, model.token_ids.pad)
    gen = GenerationConfig(gen_length=W, tie_break="stable", prefix_cache=cache,
                           alg="entropy" if model.family == "dream" else "origin")
    seer = SeerConfig(probe_layer=1, guard=False)
    naive = generate(model, ids, attention_mask=mask, gen=gen, seer=seer)
    paths = {
        "STATIC": RouterConfig.for_window(W, max_batch=8, tau_pad=1.0),
        "VARLEN": RouterConfig.for_window(W, max_batch=8, tau_pad=0.0),
        "EAGER": RouterConfig.for_window(W, max_batch=8, eager_max_bucket=W),
    }
    for name, cfg in paths.items():
        out = generate(model, ids, attention_mask=mask, gen=gen, seer=seer, router=cfg)
        assert torch.equal(out.responses, naive.responses), name
        report = out.stats.extra["router"]
        assert name in report and report[name]["useful_tokens"] > 0, report
        assert all(v["computed_tokens"] >= v["useful_tokens"] for v in report.values())
        if name == "EAGER":
            assert set(report) == {"EAGER"} and report["EAGER"]["padded_tokens"] == 0


def test_routed_path_follows_guard_extensions(monkeypatch):
    """A window re-extended by the guard changes the group's layout; the routed run rebuilds it."""
    model = tiny("lavida-llada")
    monkeypatch.setattr(seer_kernels, "snr_boundary",
                        lambda s, v, **kw: torch.full((s.shape[0],), 3, dtype=torch.int32))
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    gen = GenerationConfig(gen_length=W, tie_break="stable")
    seer = SeerConfig(probe_layer=1)
    naive = generate(model, ids, gen=gen, seer=seer)
    routed = generate(model, ids, gen=gen, seer=seer, router=RouterConfig.for_window(W, max_batch=4, tau_pad=0.0))
    assert naive.stats.extra["seer"]["guard_events"] == routed.stats.extra["seer"]["guard_events"]
    assert sum(naive.stats.extra["seer"]["guard_events"]) > 0, "random answers never end: the guard must fire"
    assert torch.equal(routed.responses, naive.responses)


def test_router_argument_is_checked():
    with pytest.raises(TypeError, match="router must be a RouterConfig or True"):
        generate(tiny("llada-8b-instruct"), torch.tensor([[5]]), gen=GenerationConfig(gen_length=4), router="fast")


@pytest.mark.parametrize("kind", ["lavida-llada", "lavida-dream"])
def test_static_groups_replay_from_their_bucket(kind, monkeypatch):
    """With the prefix cache, static groups run from their bucket's persistent buffers: one graph
    per bucket, captured once (here by the fake backend), replayed every step, same outputs; the
    buffers are allocated for the bucket served, not for the largest one the router knows."""
    from seer_runtime.graphs import BucketInputs, FakeGraphBackend
    from seer_runtime.serving import routed

    allocated = []

    class Recorded(BucketInputs):
        def __init__(self, batch, length, *args, **kwargs):
            super().__init__(batch, length, *args, **kwargs)
            allocated.append((batch, length))

    monkeypatch.setattr(routed, "BucketInputs", Recorded)

    model = tiny(kind)
    planted = torch.tensor([9, 12, 11, 10], dtype=torch.int32)
    monkeypatch.setattr(seer_kernels, "snr_boundary", lambda s, v, **kw: planted[: s.shape[0]].clone())
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]])
    gen = GenerationConfig(gen_length=W, tie_break="stable", alg="entropy" if model.family == "dream" else "origin")
    seer = SeerConfig(probe_layer=1, guard=False)
    cfg = RouterConfig.for_window(W, max_batch=8, tau_pad=0.4)
    naive = generate(model, ids, gen=gen, seer=seer)
    backend = FakeGraphBackend()
    out = generate(model, ids, gen=gen, seer=seer, router=cfg, graphs=backend)
    assert torch.equal(out.responses, naive.responses)
    report = out.stats.extra["router"]
    assert "STATIC" in report and out.stats.extra["graphs"]["replays"] > 0
    assert len(set(backend.captured)) == len(backend.captured), "each key is captured once"
    buckets = [k for k in backend.captured if k[0] == "bucket"]
    assert buckets and len(backend.replayed) >= 5
    assert allocated and all(b <= 4 and n == 16 for b, n in allocated), (
        f"buckets sized to the groups served (at most 4 rows of 16 positions), not the router's 8: {allocated}")
    assert len(allocated) == len(set(allocated)), "a bucket's buffers are allocated once"
