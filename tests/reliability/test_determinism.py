"""Determinism in every mode (issue 20): the same inputs and seeds give bitwise-identical outputs
across runs and across batch compositions, for the baseline, Seer (its real probes, nothing
planted), DyLLM (sparse steps), the PWR router (static through the graph cache, varlen, eager)
and all of them composed. ``tie_break="stable"`` and ``rng="per_request"`` are the settings under
which a request's output may not depend on its batch (``GenerationConfig``)."""

from __future__ import annotations

import pytest
import torch

import model_adapters as ma
from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig, generate
from seer_runtime.evaluate import pad_left
from seer_runtime.graphs import FakeGraphBackend
from seer_runtime.serving.router import RouterConfig

from ..tiny_models import tiny

pytestmark = [pytest.mark.reliability, pytest.mark.usefixtures("reference_kernels")]

W = 16
SEER_SPARSITY = SeerConfig(probe_layer=1, eps=0.05, tau_jump=0.01, gamma=1.0)
SEER_EOS = SeerConfig(probe="eos_prob", probe_layer=1, eos_threshold=0.004)
DYLLM = DyLLMConfig(tau=0.999, full_steps=2, prompt_period=3)
STATIC = RouterConfig.for_window(W, max_batch=4, tau_pad=1.0)
VARLEN = RouterConfig.for_window(W, max_batch=4, tau_pad=0.0)

MODES = {
    "baseline": {},
    "seer:sparsity": {"seer": SEER_SPARSITY},
    "seer:eos_prob": {"seer": SEER_EOS},
    "dyllm": {"dyllm": DYLLM},
    "router:static-graphs": {"seer": SEER_EOS, "router": STATIC, "graphs": "fake"},
    "router:varlen": {"seer": SEER_EOS, "router": VARLEN},
    "seer+router+dyllm": {"seer": SEER_EOS, "router": STATIC, "dyllm": DYLLM},
    # confidence-threshold parallel decoding (Dream: alg maskgit_plus), alone and composed
    "threshold": {"gen": {"threshold": 0.3}},
    "seer+threshold+dyllm": {"seer": SEER_EOS, "dyllm": DYLLM, "gen": {"threshold": 0.3}},
    "seer+threshold+block_cache": {"seer": SEER_EOS, "gen": {"threshold": 0.3, "block_cache": "dual"}},
}
KINDS = ["llada-8b-instruct", "lavida-dream"]


def requests(model):
    """Four prompts of different lengths (LaViDa: with images), as lists and per-request images."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 240, (n,), generator=g).tolist() for n in (9, 5, 12, 7)]
    images = [None] * len(prompts)
    if model.is_multimodal:
        prompts = [[p[0], ma.IMAGE_TOKEN_INDEX, *p[1:]] for p in prompts]
        images = [ma.ImageInput(torch.randn(1, 3, 32, 32, generator=g), (32, 32)) for _ in prompts]
    return prompts, images


def run(model, prompts, images, mode: str, gen: GenerationConfig):
    kwargs = dict(MODES[mode])
    changes = dict(kwargs.pop("gen", {}))
    if "threshold" in changes:
        if model.family == "dream":
            if "block_cache" in changes:
                pytest.skip("block caches: the LLaDA family")
            changes["alg"] = "maskgit_plus"
        gen = gen.replace(steps=None, **changes)
    if kwargs.get("graphs") == "fake":
        kwargs["graphs"] = FakeGraphBackend()
    ids, mask = pad_left(prompts, model.token_ids.pad)
    return generate(model, ids, attention_mask=mask, images=images if model.is_multimodal else None, gen=gen,
                    **kwargs)


def gen_for(model, **changes) -> GenerationConfig:
    return GenerationConfig(gen_length=W, block_length=8 if model.family == "llada" else None, tie_break="stable",
                            alg="entropy" if model.family == "dream" else "origin", **changes)


def _stats(out):
    st = out.stats
    return st.nfe, st.positions_computed, st.steps, st.extra


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", KINDS)
def test_the_same_call_twice_is_bitwise_the_same(kind, mode):
    model = tiny(kind)
    prompts, images = requests(model)
    gen = gen_for(model, temperature=0.8, rng="per_request", seed=3)
    first = run(model, prompts, images, mode, gen)
    second = run(model, prompts, images, mode, gen)
    assert torch.equal(first.sequences, second.sequences)
    assert _stats(first) == _stats(second)
    if "seer" in MODES[mode]:  # the probe cut something: the mode is exercised, not a no-op
        assert min(first.stats.extra["seer"]["keep_len"]) < W, first.stats.extra["seer"]
    if "dyllm" in MODES[mode] and "gen" not in MODES[mode]:  # (a threshold may end before DyLLM's warm-up)
        assert first.stats.extra["dyllm"]["ideal_flop_ratio"] < 1, "no sparse step ran"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", KINDS)
def test_a_request_gets_the_same_answer_in_any_batch(kind, mode):
    """Greedy: the whole batch, the batch reversed, a pair and each request alone agree bitwise."""
    model = tiny(kind)
    prompts, images = requests(model)
    gen = gen_for(model)
    whole = run(model, prompts, images, mode, gen).responses
    order = [3, 2, 1, 0]
    reverse = run(model, [prompts[i] for i in order], [images[i] for i in order], mode, gen).responses
    pair = run(model, prompts[1:3], images[1:3], mode, gen).responses
    for r in range(len(prompts)):
        alone = run(model, prompts[r:r + 1], images[r:r + 1], mode, gen).responses[0]
        assert torch.equal(whole[r], alone), f"request {r}: batch {whole[r].tolist()} alone {alone.tolist()}"
        assert torch.equal(reverse[order.index(r)], alone), f"request {r} in the reversed batch"
    assert torch.equal(pair, whole[1:3])


# A request's logits are not bitwise batch-invariant: CPU GEMMs round differently for different
# row counts (LaViDa-Dream's layer-0 K projection of request 1 already differs by 5e-7 between the
# batch of 4 and alone; its logits by 8e-7). Greedy choices have margins far above that; a sampled
# token whose race is that close flips, and the rest of the answer follows.
GEMM_ROUNDING = ("lavida-dream", "baseline")
SAMPLED = [pytest.param(kind, mode, marks=[pytest.mark.xfail(
    strict=True, reason="request 1 samples another token at position 2 alone than in the batch of 4: its "
    "logits differ by ~8e-7 because CPU GEMMs (F.linear) round differently for 4 x 17 rows than for 10 rows "
    "(the model layer's numerics, not the engine)")] if (kind, mode) == GEMM_ROUNDING else [])
    for kind in KINDS for mode in ("baseline", "seer:eos_prob", "dyllm", "seer+router+dyllm")]


@pytest.mark.parametrize("kind,mode", SAMPLED)
def test_sampled_requests_keep_their_draws_in_any_batch(kind, mode):
    """Sampling with one generator per request (``seed + index``): a request keeps its answer in
    any contiguous sub-batch given the seed it had in the whole batch."""
    model = tiny(kind)
    prompts, images = requests(model)
    gen = gen_for(model, temperature=0.9, rng="per_request", seed=11)
    whole = run(model, prompts, images, mode, gen).responses
    tail = run(model, prompts[2:], images[2:], mode, gen.replace(seed=13)).responses
    assert torch.equal(tail, whole[2:])
    for r in range(len(prompts)):
        alone = run(model, prompts[r:r + 1], images[r:r + 1], mode, gen.replace(seed=11 + r)).responses[0]
        assert torch.equal(whole[r], alone), f"request {r}"
