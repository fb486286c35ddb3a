"""Issue: the baseline decoding engine. Each family against an independent oracle, the prefix
cache against what it computes, batch invariance, bad input, schedules and statistics."""

from __future__ import annotations

import itertools

import pytest
import torch

import model_adapters as ma
from seer_runtime import GenerationConfig, generate
from seer_runtime.adapter import PaddedLayout
from seer_runtime.evaluate import pad_left
from seer_runtime.schedules import scheduled_counts, uniform_counts

from ..tiny_models import tiny
from .oracles import dream_reference, llada_reference

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("reference_kernels")]


def llada_logits_fn(model, mask):
    def fn(x):
        m = None if mask is None else torch.cat([mask, torch.ones(mask.shape[0], x.shape[1] - mask.shape[1],
                                                                    dtype=mask.dtype)], 1)
        if m is not None and x.shape[0] != m.shape[0]:
            m = torch.cat([m, m])
        return model(x, attention_mask=m).logits
    return fn


# ------------------------------------------------------------------------------------ LLaDA
@pytest.mark.parametrize("kind", ["llada-8b-instruct", "mmada-8b"])
@pytest.mark.parametrize("temperature,remasking,block,cfg", [
    (0.0, "low_confidence", 8, 0.0), (0.0, "low_confidence", 4, 0.0), (0.0, "random", 4, 0.0),
    (0.8, "low_confidence", 4, 0.0), (0.8, "random", 8, 0.0), (0.0, "low_confidence", 4, 1.5),
    (0.6, "low_confidence", 8, 2.0),
])
def test_llada_matches_reference_token_for_token(kind, temperature, remasking, block, cfg):
    model = tiny(kind)
    ids, mask = pad_left([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]], model.token_ids.pad)
    torch.manual_seed(1234)
    want = llada_reference(llada_logits_fn(model, mask), ids, mask_id=model.token_ids.mask, gen_length=8, steps=8,
                           block_length=block, temperature=temperature, cfg_scale=cfg, remasking=remasking)
    torch.manual_seed(1234)
    out = generate(model, ids, attention_mask=mask, gen=GenerationConfig(
        gen_length=8, steps=8, block_length=block, temperature=temperature, cfg_scale=cfg, remasking=remasking))
    assert torch.equal(out.sequences, want)
    assert out.stats.nfe == 8 and out.stats.steps == [8, 8, 8]


def test_llada_eos_knobs_match_reference():
    model = tiny("llada-8b-instruct")
    eos, eot = model.token_ids.eos, model.token_ids.eot
    with torch.no_grad():  # make the end tokens likely, so that the knobs change the outcome
        model.model.transformer.ff_out.weight[eos] *= 40
        model.model.transformer.ff_out.weight[eot] *= 30
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    outputs = {}
    for knobs in itertools.product([False, True], [False, True]):
        want = llada_reference(llada_logits_fn(model, None), ids, mask_id=model.token_ids.mask, gen_length=6,
                               steps=6, block_length=6, eos_id=eos, eot_id=eot, logits_eos_inf=knobs[0],
                               confidence_eos_eot_inf=knobs[1])
        out = generate(model, ids, gen=GenerationConfig(gen_length=6, steps=6, logits_eos_inf=knobs[0],
                                                         confidence_eos_eot_inf=knobs[1]))
        assert torch.equal(out.sequences, want), knobs
        outputs[knobs] = out.sequences
    ends = (outputs[(False, False)][:, 3:] == eos) | (outputs[(False, False)][:, 3:] == eot)
    assert ends.any(), "the end tokens must be produced without the knobs"
    assert not (outputs[(True, False)][:, 3:] == eos).any()


# ------------------------------------------------------------------------------------ Dream
@pytest.mark.parametrize("alg,temperature,alg_temp,top_p,top_k", [
    ("maskgit_plus", 0.0, None, None, None), ("topk_margin", 0.0, None, None, None),
    ("entropy", 0.0, None, None, None), ("entropy", 0.7, 0.3, 0.9, None), ("maskgit_plus", 0.9, None, None, 20),
    ("origin", 0.0, None, None, None), ("origin", 0.8, None, 0.95, None),
])
def test_dream_matches_reference_token_for_token(alg, temperature, alg_temp, top_p, top_k):
    model = tiny("dream-v0-instruct-7b")
    ids, mask = pad_left([[5, 6, 7, 8, 9], [10, 11, 12]], model.token_ids.pad)

    def logits_fn(x):
        full = torch.cat([mask, torch.ones(2, x.shape[1] - mask.shape[1], dtype=torch.long)], 1)
        pos = full.cumsum(-1) - 1
        pos.masked_fill_(full == 0, 1)
        return model(x, full, pos).logits

    torch.manual_seed(99)
    want = dream_reference(logits_fn, ids, mask_id=model.token_ids.mask, gen_length=10, steps=6, alg=alg,
                           alg_temp=alg_temp, temperature=temperature, top_p=top_p, top_k=top_k)
    torch.manual_seed(99)
    out = generate(model, ids, attention_mask=mask, gen=GenerationConfig(
        gen_length=10, steps=6, alg=alg, alg_temp=alg_temp, temperature=temperature, top_p=top_p, top_k=top_k))
    assert torch.equal(out.sequences, want)


# ------------------------------------------------------------------------------------ LaViDa
def _prefix_lm_logits_fn(model, embeds_prompt):
    """Full forward of [prompt; window] with the prefix-LM mask: what the cache computes."""
    lp = embeds_prompt.shape[1]

    def fn(x):
        window = x[:, lp:] if x.shape[1] > lp else x
        emb = torch.cat([embeds_prompt.expand(window.shape[0], -1, -1), model.embed(window)], 1)
        n = emb.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool)
        allowed[:lp, lp:] = False
        layout = PaddedLayout(torch.arange(n)[None], attn_mask=allowed[None, None])
        return model.forward_embeds(emb, layout)[:, lp:]
    return fn


@pytest.mark.parametrize("remasking,schedule,ratio", [("low_confidence", None, None), ("margin", "shift", 0.5),
                                                      ("entropy", "cosine", None), ("random", None, 0.5)])
def test_lavida_llada_cache_on_equals_prefix_lm_and_off_equals_full_recompute(remasking, schedule, ratio):
    model = tiny("lavida-llada")
    image = ma.ImageInput(torch.randn(1, 3, 32, 32), (32, 32))
    ids = torch.tensor([[5, ma.IMAGE_TOKEN_INDEX, 6, 7]])
    gen = GenerationConfig(gen_length=8, block_length=4, remasking=remasking, schedule=schedule, step_ratio=ratio,
                           schedule_shift=0.33 if schedule == "shift" else 3.0)
    embeds, _ = model.embed_prompt(ids, None, [image])
    lp = embeds.shape[1]
    spb = int(4 * ratio) if ratio else 4
    kw = dict(mask_id=model.token_ids.mask, gen_length=8, steps=spb * 2, block_length=4, remasking=remasking,
              softmax_fp64=True, skip_empty_blocks=True)
    if schedule is None:  # the oracle implements the uniform split; schedules are checked in test_schedules
        torch.manual_seed(3)
        want_cached = llada_reference(_prefix_lm_logits_fn(model, embeds), torch.zeros(1, 0, dtype=torch.long), **kw)
        torch.manual_seed(3)
        got = generate(model, ids, images=[image], gen=gen.replace(prefix_cache=True))
        assert torch.equal(got.responses, want_cached)
        assert got.stats.nfe == 1 + got.stats.steps[0]  # prefill + one forward per step

        def full(x):
            return model.forward_embeds(torch.cat([embeds, model.embed(x[:, lp:])], 1),
                                        PaddedLayout(torch.arange(x.shape[1])[None]))
        torch.manual_seed(3)
        want_full = llada_reference(full, torch.zeros(1, lp, dtype=torch.long), **kw)
        torch.manual_seed(3)
        got = generate(model, ids, images=[image], gen=gen.replace(prefix_cache=False))
        assert torch.equal(got.responses, want_full[:, lp:])
    else:
        on = generate(model, ids, images=[image], gen=gen.replace(prefix_cache=True))
        assert (on.responses != model.token_ids.mask).all()


def test_lavida_dream_first_token_from_prefill_and_cache_semantics():
    model = tiny("lavida-dream")
    image = ma.ImageInput(torch.randn(1, 3, 32, 32), (32, 32))
    ids = torch.tensor([[5, ma.IMAGE_TOKEN_INDEX, 6]])
    embeds, _ = model.embed_prompt(ids, None, [image])
    out = generate(model, ids, images=[image], gen=GenerationConfig(gen_length=6, alg="entropy"))
    cache, hidden = model.prefill(embeds, None, torch.arange(embeds.shape[1])[None])
    assert out.responses[0, 0] == model.head(hidden[:, -1]).argmax(-1)[0]
    assert out.stats.nfe == 1 + out.stats.steps[0]
    off = generate(model, ids, images=[image], gen=GenerationConfig(gen_length=6, alg="entropy", prefix_cache=False))

    def full(x):
        return model.forward_embeds(torch.cat([embeds, model.embed(x[:, embeds.shape[1]:])], 1),
                                    PaddedLayout(torch.arange(x.shape[1])[None]))
    want = dream_reference(full, torch.zeros(1, embeds.shape[1], dtype=torch.long), mask_id=model.token_ids.mask,
                           gen_length=6, steps=6, alg="entropy")
    assert torch.equal(off.responses, want[:, embeds.shape[1]:])


# ------------------------------------------------------------------------------------ batches
ALL = sorted(ma.PUBLISHED)


def _requests(model):
    images = None
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    if getattr(model, "is_multimodal", False):
        prompts = [[5, ma.IMAGE_TOKEN_INDEX, 6, 7], [8, 9], [ma.IMAGE_TOKEN_INDEX, 10]]
        torch.manual_seed(4)
        images = [ma.ImageInput(torch.randn(1, 3, 32, 32), (32, 32)), None,
                  ma.ImageInput(torch.randn(5, 3, 32, 32), (64, 48), (2, 2))]
    return prompts, images


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_each_request_in_a_batch_gets_what_it_gets_alone(kind, temperature):
    model = tiny(kind)
    prompts, images = _requests(model)
    gen = GenerationConfig(gen_length=8, block_length=4 if model.family == "llada" else None,
                           temperature=temperature, rng="per_request", seed=7, tie_break="stable",
                           alg="entropy" if model.family == "dream" else "origin")
    ids, mask = pad_left(prompts, model.token_ids.pad)
    batch = generate(model, ids, attention_mask=mask, images=images, gen=gen)
    for r, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), images=None if images is None else [images[r]],
                         gen=gen.replace(seed=7 + r))
        assert batch.responses[r].tolist() == alone.responses[0].tolist(), f"request {r}"
        assert batch.answer_ids(r) == alone.answer_ids(0)


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("make,match", [
    (lambda: GenerationConfig(gen_length=10, block_length=4), r"gen_length \(10\) must be divisible by block_length"),
    (lambda: GenerationConfig(gen_length=8, block_length=4, steps=5), r"steps \(5\) must be divisible"),
    (lambda: GenerationConfig(steps=0), "steps must be an int >= 1"),
    (lambda: GenerationConfig(gen_length=0), "gen_length must be an int >= 1"),
    (lambda: GenerationConfig(remasking="best"), "remasking must be one of"),
    (lambda: GenerationConfig(temperature=-1.0), "temperature must be >= 0"),
    (lambda: GenerationConfig(cfg_scale=1.0, prefix_cache=True), "cannot be combined with prefix_cache"),
])
def test_bad_generation_config(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_requests_name_the_argument():
    llada = tiny("llada-8b-instruct")
    gen = GenerationConfig(gen_length=4)
    ok = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match="empty batch"):
        generate(llada, torch.zeros(0, 3, dtype=torch.long), gen=gen)
    with pytest.raises(ValueError, match="mask id 250 inside a prompt"):
        generate(llada, torch.tensor([[5, 250]]), gen=gen)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 256\): \[999\]"):
        generate(llada, torch.tensor([[5, 999]]), gen=gen)
    with pytest.raises(ValueError, match="images were given"):
        generate(llada, ok, images=[None], gen=gen)
    with pytest.raises(TypeError, match="input_ids must be int64"):
        generate(llada, ok.float(), gen=gen)
    with pytest.raises(ValueError, match="input_ids must be 2-D"):
        generate(llada, ok[0], gen=gen)
    with pytest.raises(ValueError, match="left padding"):
        generate(llada, torch.tensor([[5, 6, 7]]), attention_mask=torch.tensor([[1, 0, 1]]), gen=gen)
    with pytest.raises(TypeError, match="gen must be a GenerationConfig"):
        generate(llada, ok, gen={"gen_length": 4})
    with pytest.raises(ValueError, match="Dream options"):
        generate(llada, ok, gen=GenerationConfig(gen_length=4, top_p=0.9))
    dream = tiny("dream-v0-instruct-7b")
    with pytest.raises(ValueError, match="block_length: Dream"):
        generate(dream, ok, gen=GenerationConfig(gen_length=4, block_length=2))
    with pytest.raises(ValueError, match="cfg_scale: Dream"):
        generate(dream, ok, gen=GenerationConfig(gen_length=4, cfg_scale=1.0))
    lavida = tiny("lavida-llada")
    with pytest.raises(ValueError, match="1 <image> placeholders but 0 images"):
        generate(lavida, torch.tensor([[5, ma.IMAGE_TOKEN_INDEX]]), images=[None], gen=gen)


# ------------------------------------------------------------------------------------ schedules, stats
def test_schedules():
    assert uniform_counts(10, 4) == [3, 3, 2, 2]
    assert sum(uniform_counts(7, 7)) == 7 and uniform_counts(3, 5) == [1, 1, 1, 0, 0]
    # 32 tokens over 16 steps. These are the values LaViDa's get_num_transfer_tokens_sch returns
    # (checked against the upstream function; MODELS.md §4.6 quotes a hand computation,
    # [5, 4, 4, 3, 2, 2, 2, 2, 1, ...], that is off by one in two places).
    assert scheduled_counts(32, 16, "shift", shift=0.33) == [6, 4, 4, 3, 2, 2, 2] + [1] * 9
    assert scheduled_counts(32, 16, "shift", shift=3.0) == [1] * 8 + [2, 2, 2, 2, 3, 4, 4, 5]
    for name in ("cosine", "logit_normal", "uniform"):
        counts = scheduled_counts(20, 8, name)
        assert sum(counts) == 20 and min(counts) >= 1 and len(counts) == 8
    assert scheduled_counts(3, 8, "shift") == [1, 1, 1]


def test_statistics_and_outputs():
    model = tiny("llada-8b-instruct")
    ids, mask = pad_left([[5, 6, 7, 8], [9, 10]], model.token_ids.pad)
    out = generate(model, ids, attention_mask=mask, gen=GenerationConfig(gen_length=8, steps=4, block_length=4))
    st = out.stats
    assert st.nfe == 4 and st.steps == [4, 4]
    assert st.positions_computed == 4 * 2 * (4 + 8) * model.num_layers  # padding included
    assert st.positions_computed_per_request == [4 * (4 + 8) * 3, 4 * (2 + 8) * 3]
    assert set(st.time_s) >= {"embed", "forward", "sample", "total"} and st.engine_overhead_s >= 0
    assert out.sequences.shape == (2, 12) and torch.equal(out.sequences[:, :4], ids)
    assert (out.responses != model.token_ids.mask).all()
    window = torch.tensor([[1, 251, 2], [3, 4, 5], [252, 1, 1]])
    from seer_runtime.batch import first_end_positions
    assert first_end_positions(window, (251, 252)).tolist() == [1, -1, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dream_count_is_dreams_float32_product(dtype):
    """``dream_count`` takes Dream's ``int(masks * (1 - s / t))`` (masks a float32 tensor) in numpy
    scalars: the same count as the torch expression for every mask count and step of several
    schedules (float32 timesteps as Dream's linspace, and float64 ones)."""
    from seer_runtime.schedules import dream_count, dream_timesteps

    for steps, eps in [(1, 1e-3), (7, 1e-3), (32, 1e-3), (128, 1e-2), (256, 0.1)]:
        ts = dream_timesteps(steps, eps).to(dtype)
        for i in range(steps):
            t, s = ts[i], ts[i + 1]
            for masks in range(0, 260, 3):
                expected = int(torch.tensor(float(masks), dtype=torch.float32) * (1 - s / t))
                assert dream_count(masks, t, s, False) == expected, (steps, eps, i, masks)
            assert dream_count(17, t, s, True) == 17
