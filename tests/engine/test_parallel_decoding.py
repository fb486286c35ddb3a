"""Confidence-threshold parallel decoding and Fast-dLLM's block caches (``GenerationConfig``'s
``threshold`` and ``block_cache``): token for token what Fast-dLLM's rules decode (restated in
``oracles.py``; the engine was also checked against NVlabs/Fast-dLLM's own llada/generate.py,
bench/RESULTS.md), batched requests that finish blocks at different steps, and the compositions
with Seer, DyLLM, graphs and the checks on bad combinations."""

from __future__ import annotations

import warnings

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig, generate
from seer_runtime.evaluate import pad_left

from ..tiny_models import tiny
from .oracles import dream_threshold_reference, fast_dllm_reference

pytestmark = [pytest.mark.engine]

LLADA_KINDS = ["llada-8b-instruct", "mmada-8b"]


def _prompts(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 240, (int(k),), generator=g).tolist() for k in torch.randint(4, 9, (n,), generator=g)]


def _gen(**kw):
    base = dict(gen_length=16, block_length=8, tie_break="reference")
    base.update(kw)
    return GenerationConfig(**base)


@pytest.mark.parametrize("kind", LLADA_KINDS)
@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("threshold,block", [(None, 8), (0.5, 8), (0.1, 4), (0.1, 16)])
def test_llada_family_equals_fast_dllm_rules(kind, cache, threshold, block):
    model = tiny(kind, scale=0.3)  # confident enough that a threshold commits several tokens at once
    for prompt in _prompts():
        ids = torch.tensor([prompt])
        want, forwards = fast_dllm_reference(model, ids, mask_id=model.token_ids.mask, gen_length=16, steps=16,
                                             block_length=block, threshold=threshold, cache=cache)
        gen = _gen(block_length=block, threshold=threshold, block_cache=cache, steps=None if threshold else 16)
        out = generate(model, ids, gen=gen, graphs=None)
        assert torch.equal(out.sequences, want), (prompt, out.sequences, want)
        assert out.stats.nfe == forwards


def test_a_threshold_commits_several_tokens_per_step_and_stops_early():
    model = tiny("llada-8b-instruct", scale=0.3)
    ids, mask = pad_left(_prompts(4, seed=1), model.token_ids.pad)
    fixed = generate(model, ids, attention_mask=mask, gen=_gen(steps=16), graphs=None)
    fast = generate(model, ids, attention_mask=mask, gen=_gen(threshold=0.1), graphs=None)
    assert fast.stats.nfe < fixed.stats.nfe
    assert len(set(fast.stats.steps)) > 1, "requests finish their blocks at different steps"
    assert fast.stats.positions_computed < fixed.stats.positions_computed  # a finished request stops costing
    assert not bool((fast.responses == model.token_ids.mask).any())


@pytest.mark.parametrize("kind", LLADA_KINDS + ["dream-v0-instruct-7b", "lavida-llada", "lavida-dream"])
@pytest.mark.parametrize("cache", [None, "prefix"])
def test_each_request_in_a_batch_gets_what_it_gets_alone(kind, cache):
    model = tiny(kind, scale=0.3)
    if cache is not None and model.family == "dream":
        pytest.skip("block caches: LLaDA family")
    prompts = _prompts(3, seed=2)
    images = None
    if model.is_multimodal:
        import model_adapters as ma

        prompts = [[p[0], ma.IMAGE_TOKEN_INDEX, *p[1:]] for p in prompts]
        g = torch.Generator().manual_seed(0)
        images = [ma.ImageInput(torch.randn(1, 3, 32, 32, generator=g), (32, 32)) for _ in prompts]
    gen = _gen(threshold=0.2, block_cache=cache, tie_break="stable", block_length=None if model.family == "dream"
               else 8, alg="maskgit_plus" if model.family == "dream" else "origin")
    ids, mask = pad_left(prompts, model.token_ids.pad)
    both = generate(model, ids, attention_mask=mask, images=images, gen=gen, graphs=None)
    for i, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), images=None if images is None else [images[i]], gen=gen,
                         graphs=None)
        assert both.answer_ids(i) == alone.answer_ids(0), (kind, i)


def test_dream_threshold_equals_the_rule():
    model = tiny("dream-v0-instruct-7b", scale=0.3)

    def logits_fn(x):
        return model(x).logits

    for prompt in _prompts():
        ids = torch.tensor([prompt])
        want, forwards = dream_threshold_reference(logits_fn, ids, mask_id=model.token_ids.mask, gen_length=16,
                                                   threshold=0.3)
        out = generate(model, ids, gen=GenerationConfig(gen_length=16, alg="maskgit_plus", threshold=0.3,
                                                        tie_break="reference"), graphs=None)
        assert torch.equal(out.sequences, want)
        assert out.stats.nfe == forwards


def test_a_block_whose_model_chooses_its_mask_token_ends_with_a_warning():
    """Where a threshold step commits only the mask token itself, the same tokens would give the
    same choice forever (Fast-dLLM loops): the block ends, its masks stay, a warning says so."""
    model = tiny("llada-8b-instruct", scale=0.3)  # this random model often ranks its mask token first
    stalled = 0
    for prompt in _prompts(6, seed=4):
        ids = torch.tensor([prompt])
        want, forwards = fast_dllm_reference(model, ids, mask_id=model.token_ids.mask, gen_length=16, steps=16,
                                             block_length=8, threshold=0.5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = generate(model, ids, gen=_gen(threshold=0.5), graphs=None)
        said = [w for w in caught if "committed only its mask token" in str(w.message)]
        left = bool((out.responses == model.token_ids.mask).any())
        assert bool(said) == left, "masks are left in an answer exactly when a warning says so"
        stalled += left
        assert torch.equal(out.sequences, want) and out.stats.nfe == forwards
    assert stalled, "the case is exercised"


def test_threshold_composes_with_dyllm_and_seer(reference_kernels):
    model = tiny("llada-8b-instruct", scale=0.3)
    ids, mask = pad_left(_prompts(4, seed=3), model.token_ids.pad)
    gen = _gen(threshold=0.2, tie_break="stable")
    alone = generate(model, ids, attention_mask=mask, gen=gen, graphs=None)
    every_row = generate(model, ids, attention_mask=mask, gen=gen, graphs=None,
                         dyllm=DyLLMConfig(tau=2.0, full_steps=1, prompt_period=1))
    assert torch.equal(alone.sequences, every_row.sequences), "tau > 1: DyLLM computes what the baseline does"
    sparse = generate(model, ids, attention_mask=mask, gen=gen, graphs=None, dyllm=DyLLMConfig(tau=0.99, full_steps=2))
    assert sparse.stats.extra["dyllm"]["forwards"]["response"] + sparse.stats.extra["dyllm"]["forwards"]["prompt"] > 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cut = generate(model, ids, attention_mask=mask, gen=gen, graphs=None,
                       seer=SeerConfig(probe="eos_prob", probe_layer=1, eos_threshold=0.004))
    stalled = {int(str(w.message).split()[3]) for w in caught if "committed only its mask token" in str(w.message)}
    keep = cut.stats.extra["seer"]["final_window"]
    for i, n in enumerate(keep):  # the cut window is what blocks and thresholds see
        assert bool((cut.responses[i, :n] == model.token_ids.mask).any()) == (i in stalled)
        assert bool((cut.responses[i, n:] == model.token_ids.eos).all())
    assert cut.stats.positions_computed <= alone.stats.positions_computed


@pytest.mark.parametrize("make,match", [
    (lambda: GenerationConfig(threshold=0.0), "threshold"),
    (lambda: GenerationConfig(threshold=1.5), "threshold"),
    (lambda: GenerationConfig(threshold=float("nan")), "threshold"),
    (lambda: GenerationConfig(block_cache="full"), "block_cache must be one of"),
    (lambda: GenerationConfig(threshold=0.9, schedule="cosine"), "cannot be combined with schedule"),
    (lambda: GenerationConfig(block_cache="dual", cfg_scale=1.0), "block_cache with cfg_scale"),
])
def test_bad_configs(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_combinations_name_what_is_wrong():
    llada, dream = tiny("llada-8b-instruct"), tiny("dream-v0-instruct-7b")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="alg='maskgit_plus'"):
        generate(dream, ids, gen=GenerationConfig(gen_length=8, threshold=0.9))
    with pytest.raises(ValueError, match="remasking='entropy'"):
        generate(llada, ids, gen=GenerationConfig(gen_length=8, threshold=0.9, remasking="entropy"))
    with pytest.raises(ValueError, match="LLaDA family"):
        generate(dream, ids, gen=GenerationConfig(gen_length=8, alg="maskgit_plus", block_cache="prefix"))
    with pytest.raises(ValueError, match="composes with neither DyLLM"):
        generate(llada, ids, gen=GenerationConfig(gen_length=8, block_cache="prefix"), dyllm=DyLLMConfig())
    with pytest.warns(UserWarning, match="steps=8 is not used with threshold"):
        generate(llada, ids, gen=GenerationConfig(gen_length=8, steps=8, threshold=0.9))
