"""seer_runtime.memory: the analytic memory plan of a generate call (issue 33).

At LaViDa-LLaDA 8B shapes (built on the meta device) a 1000-position prefix and a 64-position
window fit 120 GB from batch 32 to 256 in every layout, in micro-batches where the whole batch
does not; and the plan is held to the code: on tiny models the resident parts equal, byte for
byte, the tensors ``generate`` holds (the prefix cache, DyLLM's caches, the block cache, the
router's graph buffers), and the peak is an upper bound of the CPU allocator's own within a
factor of two.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import model_adapters as ma
from model_adapters.configs import PUBLISHED
from seer_runtime import DyLLMConfig, GenerationConfig, generate, generation
from seer_runtime.dyllm import DyLLMPolicy
from seer_runtime.memory import (
    GB,
    LAYOUTS,
    DoesNotFitError,
    ModelDims,
    RequestShape,
    largest_batch_that_fits,
    memory_plan,
    micro_batch_sizes,
    plan_micro_batches,
)
from seer_runtime.policy import Policy
from seer_runtime.serving.router import RouterConfig

pytestmark = [pytest.mark.engine]

LIMIT = 120 * GB


@pytest.fixture(scope="module")
def lavida_llada_8b() -> ModelDims:
    model = ma.build_model(PUBLISHED["lavida-llada"], device="meta", dtype=torch.bfloat16)
    return ModelDims.from_model(model)


def test_dims_of_the_8b_model(lavida_llada_8b):
    d = lavida_llada_8b
    assert (d.hidden, d.layers, d.heads, d.kv_heads, d.head_dim, d.intermediate, d.vocab) == (
        4096, 32, 32, 32, 128, 12288, 126464)
    assert 16.0e9 < d.weight_bytes < 17.5e9  # LLaDA-8B in bf16 plus the SigLIP tower and projector


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch", [32, 64, 128, 256])
def test_lavida_llada_8b_fits_120_gb(lavida_llada_8b, layout, batch):
    """1000-position prefix, window 64: the call's peak (its largest micro-batch) stays under 120 GB;
    the micro-batches hold every request; batch 32 needs no split in any layout."""
    dims = lavida_llada_8b
    kept = None if layout == "vanilla" else 40
    shape = RequestShape(batch, 1000, 64, layout=layout, kept_window=kept)
    sizes, plan = plan_micro_batches(LIMIT - dims.weight_bytes, dims, shape)
    assert sum(sizes) == batch and max(sizes) - min(sizes) <= 1
    assert plan.peak <= LIMIT, plan.describe(GB)
    assert plan.shape.batch == sizes[0]
    if batch == 32:
        assert sizes == [32]
    whole = memory_plan(dims, shape)
    assert (len(sizes) == 1) == (whole.peak <= LIMIT)
    # the prefix cache alone: 32 layers x keys and values x 1000 positions x 4096 x 2 bytes per request
    assert plan.resident["prefix_kv"] == sizes[0] * 32 * 2 * 1000 * 4096 * 2


def test_router_buffers_follow_the_bucket_served(lavida_llada_8b):
    """Sized up front to a max_batch of 256 (the code before issue 33) the router's buffers alone
    pass 120 GB at batch 32; sized to the bucket served they hold the batch's rows only."""
    dims = lavida_llada_8b
    served = memory_plan(dims, RequestShape(32, 1000, 64, layout="router", kept_window=40))
    up_front = memory_plan(dims, RequestShape(32, 1000, 64, layout="router", kept_window=40,
                                              router_batch_buckets=(256,)))
    assert up_front.resident["router_buffers"] > 130 * GB > LIMIT
    assert served.resident["router_buffers"] == pytest.approx(up_front.resident["router_buffers"] / 8, rel=1e-3)
    # the length bucket is the kept window's (64 after a cut to 40), never more than the window
    narrow = memory_plan(dims, RequestShape(32, 1000, 64, layout="router", kept_window=8))
    assert narrow.resident["router_buffers"] < served.resident["router_buffers"]


def test_largest_batch_and_micro_batches(lavida_llada_8b):
    dims = lavida_llada_8b
    shape = RequestShape(256, 1000, 64)
    free = LIMIT - dims.weight_bytes
    b = largest_batch_that_fits(free, dims, shape)
    assert memory_plan(dims, shape.replace(batch=b)).peak <= LIMIT < memory_plan(dims, shape.replace(batch=b + 1)).peak
    assert largest_batch_that_fits(free, dims, shape, reserve=0.2) < b
    assert micro_batch_sizes(256, 100) == [86, 85, 85]
    assert micro_batch_sizes(5, 5) == [5]
    with pytest.raises(DoesNotFitError, match=r"one request \(prompt 1000 positions, window 64.*GiB is free"):
        largest_batch_that_fits(10**8, dims, shape)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="layout"):
        RequestShape(4, 10, 8, layout="padded")
    with pytest.raises(ValueError, match="kept_window"):
        RequestShape(4, 10, 8, layout="router", kept_window=9)
    with pytest.raises(ValueError, match="batch"):
        RequestShape(0, 10, 8)
    with pytest.raises(ValueError, match="block_cache"):
        RequestShape(4, 10, 8, block_cache="dual", dyllm=True)
    with pytest.raises(ValueError, match="kv_heads"):
        ModelDims(64, 2, 4, 3, 16, 128, 256, 0)


# --------------------------------------------------------------------- the plan against the code
def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class HeldTensors(Policy):
    """After every step: the bytes of what the call holds, per part of the plan (largest seen).
    It finds the other parts through the objects it is handed or given: the batch state, DyLLM's
    policy and the runner's layouts (``layouts``, set after the call is composed)."""

    name = "held_tensors"

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.dyllm = self.layouts = None

    def after_step(self, state, step: int, values) -> list:
        now = {"prefix_kv": _nbytes(state.prefix.keys + state.prefix.values) if state.prefix is not None else 0,
               "prompt_embeds": _nbytes([state.prompt_embeds])}
        if self.dyllm is not None:
            c = self.dyllm.caches
            now["dyllm_caches"] = _nbytes(c.keys + c.values + c.contexts + c.ffn_outputs + [self.dyllm.snapshot])
        layouts = self.layouts
        if layouts is not None and layouts.name == "block_cache":
            kept = [t for layout in layouts._layouts.values() if layout.prefix is not None
                    for t in layout.prefix.keys + layout.prefix.values]
            now["block_cache"] = _nbytes(layouts.keys + layouts.values + kept)
        elif layouts is not None and layouts.name == "router" and layouts._buckets:
            now["router_buffers"] = sum(b.nbytes for b in layouts._buckets.values())
        for k, v in now.items():
            self.held[k] = max(self.held.get(k, 0), v)
        return []


B, P, W = 8, 96, 32
GEN = GenerationConfig(gen_length=W, steps=W, block_length=16, tie_break="stable")
CASES = {
    # name: (gen changes, generate kwargs, plan shape options, whether the CPU peak is comparable)
    "prefix cache": ({"prefix_cache": True}, {}, {}, True),
    "dyllm": ({"prefix_cache": True}, {"dyllm": DyLLMConfig(tau=0.999, full_steps=2)}, {"dyllm": True}, False),
    "dyllm, no prefix cache": ({}, {"dyllm": DyLLMConfig(tau=0.999, full_steps=2)},
                               {"dyllm": True, "prefix_cache": False}, False),
    "dual block cache": ({"block_cache": "dual"}, {}, {"prefix_cache": False, "block_cache": "dual",
                                                       "block_length": 16}, True),
    "router": ({"prefix_cache": True}, {"router": RouterConfig.for_window(W, max_batch=B)},
               {"layout": "router"}, True),
}


@pytest.fixture(scope="module")
def tiny_llada():
    torch.manual_seed(0)
    config = ma.tiny_config("llada-8b-instruct", d_model=256, n_heads=4, n_kv_heads=4, n_layers=2,
                            mlp_hidden_size=512, vocab_size=1024, embedding_size=1024)
    return ma.build_model(config)


def _peak_allocated(fn) -> int:
    """The CPU allocator's peak of live bytes allocated while ``fn`` runs (the profiler's memory events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("case", list(CASES))
def test_plan_matches_what_generate_holds(tiny_llada, case, reference_kernels, recwarn, monkeypatch):
    """The resident parts equal the tensors generate holds; the planned peak (less the weights and,
    on a machine without graphs, the graph pool) bounds the allocator's peak within a factor of two.
    DyLLM's peak is not compared: on the CPU its sparse layers run the kernels' torch references,
    which hold intermediates (the attention probabilities) that the Triton kernels never write."""
    changes, kwargs, options, peak_comparable = CASES[case]
    ids = torch.randint(0, 200, (B, P), generator=torch.Generator().manual_seed(1))
    gen = GEN.replace(**changes)
    probe = HeldTensors()
    compose = generation.compose_layouts

    def composed(*args):  # the probe's window on the layouts the call composes
        probe.layouts = compose(*args)
        return probe.layouts

    monkeypatch.setattr(generation, "compose_layouts", composed)

    def call(probe):
        kw = dict(kwargs)
        policies = [probe]
        if "dyllm" in kw:  # DyLLM as a policy object, so that the probe can see its caches
            probe.dyllm = DyLLMPolicy(kw.pop("dyllm"))
            policies.insert(0, probe.dyllm)
        return generate(tiny_llada, ids, gen=gen, policies=policies, **kw)

    call(HeldTensors())  # lazy initialisation out of the way
    peak = _peak_allocated(lambda: call(probe))
    dims = ModelDims.from_model(tiny_llada)
    plan = memory_plan(dims, RequestShape(B, P, W, dtype=torch.float32, graphs=options.get("layout") == "router",
                                          materialized_scores=True, **options))
    for part, held in probe.held.items():
        assert plan.resident[part] == held, (part, plan.describe())
    assert plan.resident["prefix_kv"] == probe.held["prefix_kv"] > 0 or not gen.prefix_cache
    if peak_comparable:
        planned = plan.request_bytes - plan.resident["graph_pool"]
        assert peak <= planned <= 2 * peak, (peak, plan.describe())


def test_a_prefix_cache_that_would_not_fit_decodes_in_micro_batches(monkeypatch):
    """With less device memory free than the whole batch's plan needs, generate decodes parts that
    fit and returns what one call returns: the same tokens, per-request statistics in order; with
    less than one request needs, a clear error naming the sizes before anything runs."""
    from seer_runtime import GenerationConfig as Gen
    from seer_runtime.memory import DoesNotFitError

    from ..tiny_models import tiny

    model = tiny("lavida-llada")  # the prefix cache is on by default
    ids = torch.randint(0, 200, (5, 6), generator=torch.Generator().manual_seed(3))
    gen = Gen(gen_length=16, steps=16, block_length=8, tie_break="stable")
    whole = generate(model, ids, gen=gen, graphs=None)
    dims = ModelDims.from_model(model)
    need = memory_plan(dims, RequestShape(2, 6, 16, dtype=model.dtype, layout="vanilla")).request_bytes
    monkeypatch.setattr(generation, "device_free_bytes", lambda device: int(need / 0.9) + 1)
    parts = generate(model, ids, gen=gen, graphs=None)
    assert parts.stats.extra["micro_batches"] == [2, 2, 1]
    assert torch.equal(parts.sequences, whole.sequences)
    assert parts.stats.steps == whole.stats.steps and parts.stats.nfe == 3 * whole.stats.nfe  # each part: all steps
    assert parts.stats.positions_computed_per_request == whole.stats.positions_computed_per_request
    monkeypatch.setattr(generation, "device_free_bytes", lambda device: 1024)
    with pytest.raises(DoesNotFitError, match=r"one request \(prompt 6 positions, window 16"):
        generate(model, ids, gen=gen, graphs=None)
