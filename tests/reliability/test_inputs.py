"""Bad input to the public entries of seer_runtime and model_adapters: every config, generate()
and a model's forward() reject it with a TypeError/ValueError naming the argument and the
expected form; nothing is clamped, converted or dropped silently (issue 20).

Each enumerated case is one distinct bad input (``tests/reliability/count_cases.py`` counts
them for the README); the hypothesis tests then draw values and shapes at random.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import model_adapters as ma
from seer_runtime import DyLLMConfig, GenerationConfig, SeerConfig, generate
from seer_runtime.generation import validate_request
from seer_runtime.serving.router import RouterConfig

from ..tiny_models import tiny

pytestmark = [pytest.mark.reliability, pytest.mark.usefixtures("reference_kernels")]

NAN, INF = float("nan"), float("inf")
HYPOTHESIS = settings(max_examples=30, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass(frozen=True)
class Bad:
    id: str
    call: Callable[[], object]
    error: type[Exception]
    names: str  # regex the message must match: the argument and, where useful, the expected form


# ------------------------------------------------------------------------------------ configs
G, S, D, R = GenerationConfig, SeerConfig, DyLLMConfig, RouterConfig

BAD_CONFIGS = [
    Bad("gen-gen_length-bool", lambda: G(gen_length=True), TypeError, "gen_length must be an int"),
    Bad("gen-gen_length-float", lambda: G(gen_length=8.0), TypeError, "gen_length must be an int"),
    Bad("gen-gen_length-0", lambda: G(gen_length=0), ValueError, "gen_length must be an int >= 1"),
    Bad("gen-gen_length-negative", lambda: G(gen_length=-8), ValueError, "gen_length must be an int >= 1"),
    Bad("gen-steps-bool", lambda: G(steps=True), TypeError, "steps must be an int"),
    Bad("gen-steps-0", lambda: G(steps=0), ValueError, "steps must be an int >= 1"),
    Bad("gen-steps-indivisible", lambda: G(gen_length=8, block_length=4, steps=5), ValueError,
        r"steps \(5\) must be divisible by the number of blocks \(2\)"),
    Bad("gen-block_length-float", lambda: G(gen_length=8, block_length=4.0), TypeError, "block_length must be an int"),
    Bad("gen-block_length-indivisible", lambda: G(gen_length=10, block_length=4), ValueError,
        r"gen_length \(10\) must be divisible by block_length \(4\)"),
    Bad("gen-temperature-nan", lambda: G(temperature=NAN), ValueError, "temperature must be >= 0 .a finite number"),
    Bad("gen-temperature-inf", lambda: G(temperature=INF), ValueError, "temperature must be >= 0"),
    Bad("gen-temperature-negative", lambda: G(temperature=-0.5), ValueError, "temperature must be >= 0"),
    Bad("gen-temperature-str", lambda: G(temperature="0"), TypeError, "temperature must be a real number"),
    Bad("gen-cfg_scale-nan", lambda: G(cfg_scale=NAN), ValueError, "cfg_scale must be >= 0"),
    Bad("gen-remasking-unknown", lambda: G(remasking="best"), ValueError, "remasking must be one of"),
    Bad("gen-alg-unknown", lambda: G(alg="greedy"), ValueError, "alg must be one of"),
    Bad("gen-alg_temp-inf", lambda: G(alg_temp=INF), ValueError, "alg_temp must be >= 0"),
    Bad("gen-top_p-0", lambda: G(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    Bad("gen-top_p-above-1", lambda: G(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    Bad("gen-top_k-bool", lambda: G(top_k=True), TypeError, "top_k must be an int"),
    Bad("gen-top_k-0", lambda: G(top_k=0), ValueError, "top_k must be an int >= 1"),
    Bad("gen-eps-1", lambda: G(eps=1.0), ValueError, r"eps must be in \(0, 1\)"),
    Bad("gen-eps-nan", lambda: G(eps=NAN), ValueError, "eps must be in"),
    Bad("gen-logits_eos_inf-str", lambda: G(logits_eos_inf="yes"), TypeError, "logits_eos_inf must be a bool"),
    Bad("gen-confidence_eos_eot_inf-int", lambda: G(confidence_eos_eot_inf=1), TypeError,
        "confidence_eos_eot_inf must be a bool"),
    Bad("gen-prefix_cache-int", lambda: G(prefix_cache=1), TypeError, "prefix_cache must be a bool or None"),
    Bad("gen-schedule-unknown", lambda: G(schedule="linear"), ValueError, "schedule must be None or one of"),
    Bad("gen-schedule_shift-0", lambda: G(schedule_shift=0.0), ValueError, "schedule_shift must be > 0"),
    Bad("gen-schedule_shift-inf", lambda: G(schedule_shift=INF), ValueError, "schedule_shift must be > 0"),
    Bad("gen-step_ratio-0", lambda: G(step_ratio=0.0), ValueError, r"step_ratio must be in \(0, 1\]"),
    Bad("gen-step_ratio-bool", lambda: G(step_ratio=True), TypeError, "step_ratio must be a real number"),
    Bad("gen-tie_break-unknown", lambda: G(tie_break="left"), ValueError, "tie_break must be"),
    Bad("gen-rng-unknown", lambda: G(rng="numpy"), ValueError, "rng must be"),
    Bad("gen-seed-negative", lambda: G(seed=-1), ValueError, r"seed must be an int in \[0, "),
    Bad("gen-seed-huge", lambda: G(seed=2**70), ValueError, r"seed must be an int in \[0, "),
    Bad("gen-seed-float", lambda: G(seed=1.5), TypeError, "seed must be an int"),
    Bad("gen-cfg-with-prefix-cache", lambda: G(cfg_scale=1.0, prefix_cache=True), ValueError,
        "cannot be combined with prefix_cache"),
    Bad("gen-threshold-0", lambda: G(threshold=0.0), ValueError, r"threshold must be in \(0, 1\]"),
    Bad("gen-threshold-nan", lambda: G(threshold=NAN), ValueError, r"threshold must be in \(0, 1\]"),
    Bad("gen-threshold-above-1", lambda: G(threshold=1.5), ValueError, r"threshold must be in \(0, 1\]"),
    Bad("gen-threshold-str", lambda: G(threshold="0.9"), TypeError, "threshold must be a real number"),
    Bad("gen-threshold-with-schedule", lambda: G(threshold=0.9, schedule="cosine"), ValueError,
        "cannot be combined with schedule or step_ratio"),
    Bad("gen-check_finite-int", lambda: G(check_finite=1), TypeError, "check_finite must be a bool"),
    Bad("gen-early_stop-str", lambda: G(early_stop="yes"), TypeError, "early_stop must be a bool"),
    Bad("gen-block_cache-unknown", lambda: G(block_cache="full"), ValueError, "block_cache must be one of"),
    Bad("gen-block_cache-with-cfg", lambda: G(block_cache="dual", cfg_scale=1.0), ValueError,
        "block_cache with cfg_scale > 0"),
    Bad("gen-from_dict-unknown-key", lambda: G.from_dict({"gen_lenght": 8}), ValueError,
        r"unknown GenerationConfig fields: \['gen_lenght'\]"),
    Bad("gen-from_dict-list", lambda: G.from_dict([8]), TypeError, "must be read from a JSON object"),
    Bad("seer-slack-negative", lambda: S(slack=-1), ValueError, "slack must be an int >= 0"),
    Bad("seer-slack-float", lambda: S(slack=1.5), TypeError, "slack must be an int"),
    Bad("seer-gamma-0", lambda: S(gamma=0), ValueError, "gamma must be > 0"),
    Bad("seer-gamma-nan", lambda: S(gamma=NAN), ValueError, "gamma must be > 0"),
    Bad("seer-gamma-inf", lambda: S(gamma=INF), ValueError, "gamma must be > 0 .a finite number"),
    Bad("seer-tau_jump-0", lambda: S(tau_jump=0.0), ValueError, "tau_jump must be > 0"),
    Bad("seer-tau_jump-inf", lambda: S(tau_jump=INF), ValueError, "tau_jump must be > 0"),
    Bad("seer-tau_jump-str", lambda: S(tau_jump="0.03"), TypeError, "tau_jump must be a real number"),
    Bad("seer-probe_layer-negative", lambda: S(probe_layer=-1), ValueError, "probe_layer must be an int >= 0"),
    Bad("seer-probe_layer-bool", lambda: S(probe_layer=True), TypeError, "probe_layer must be an int"),
    Bad("seer-eps-negative", lambda: S(eps=-0.1), ValueError, "eps must be >= 0"),
    Bad("seer-eps-inf", lambda: S(eps=INF), ValueError, "eps must be >= 0"),
    Bad("seer-eps-bool", lambda: S(eps=True), TypeError, "eps must be a real number"),
    Bad("seer-eps-count", lambda: S(probe_layer=3, probe_layers=(2, 3), eps=(0.1,)), ValueError,
        "eps has 1 values for 2 probe layers"),
    Bad("seer-window-0", lambda: S(window=0), ValueError, "window must be an int >= 1"),
    Bad("seer-window-bool", lambda: S(window=True), TypeError, "window must be an int"),
    Bad("seer-probe-unknown", lambda: S(probe="entropy"), ValueError, "probe must be one of"),
    Bad("seer-probe_layers-str", lambda: S(probe_layers="13"), TypeError, "probe_layers must be a tuple"),
    Bad("seer-probe_layers-float", lambda: S(probe_layers=(1.5, 3)), TypeError, r"probe_layers\[0\] must be an int"),
    Bad("seer-probe_layers-empty", lambda: S(probe_layers=()), ValueError, "probe_layers must hold at least one"),
    Bad("seer-probe_layers-repeated", lambda: S(probe_layers=(3, 3)), ValueError, "probe_layers must not repeat"),
    Bad("seer-probe_layer-not-last", lambda: S(probe_layer=2, probe_layers=(1, 3)), ValueError,
        r"probe_layer \(2\) must be the last of probe_layers"),
    Bad("seer-baseline_window-float", lambda: S(baseline_window=2.5), TypeError, "baseline_window must be an int"),
    Bad("seer-min_position-0", lambda: S(min_position=0), ValueError, "min_position must be an int >= 1"),
    Bad("seer-eos_threshold-0", lambda: S(eos_threshold=0.0), ValueError, r"eos_threshold must be in \(0, 1\]"),
    Bad("seer-confirm_threshold-above-1", lambda: S(confirm_threshold=1.5), ValueError,
        r"confirm_threshold must be in \(0, 1\]"),
    Bad("seer-guard-str", lambda: S(guard="no"), TypeError, "guard must be a bool"),
    Bad("seer-guard_mode-unknown", lambda: S(guard_mode="retry"), ValueError, "guard_mode must be extend or redecode"),
    Bad("seer-from_dict-unknown-key", lambda: S.from_dict({"gama": 0.6}), ValueError,
        r"unknown SeerConfig fields: \['gama'\]"),
    Bad("dyllm-tau-0", lambda: D(tau=0.0), ValueError, "tau must be a finite number > 0"),
    Bad("dyllm-tau-nan", lambda: D(tau=NAN), ValueError, "tau must be a finite number"),
    Bad("dyllm-tau-inf", lambda: D(tau=INF), ValueError, "tau must be a finite number"),
    Bad("dyllm-tau-str", lambda: D(tau="0.99"), TypeError, "tau must be a real number"),
    Bad("dyllm-full_steps-0", lambda: D(full_steps=0), ValueError, "full_steps must be an int >= 1"),
    Bad("dyllm-full_steps-bool", lambda: D(full_steps=True), TypeError, "full_steps must be an int, got bool"),
    Bad("dyllm-prompt_period-float", lambda: D(prompt_period=1.5), TypeError,
        "prompt_period must be an int, got float"),
    Bad("dyllm-approx_attention-int", lambda: D(approx_attention=1), TypeError, "approx_attention must be a bool"),
    Bad("dyllm-from_dict-unknown-key", lambda: D.from_dict({"tau": 0.99, "threshold": 0.9}), ValueError,
        r"unknown DyLLMConfig fields: \['threshold'\]"),
    Bad("router-micro_buckets-repeated", lambda: R(micro_buckets=(8, 8)), ValueError, "micro_buckets must be sorted"),
    Bad("router-micro_buckets-0", lambda: R(micro_buckets=(0, 8)), ValueError, "micro_buckets entries must be >= 1"),
    Bad("router-micro_buckets-float", lambda: R(micro_buckets=(8.0,)), TypeError, "micro_buckets must hold ints"),
    Bad("router-micro_buckets-str", lambda: R(micro_buckets="816"), TypeError, "micro_buckets must be a sequence"),
    Bad("router-tau_pad-nan", lambda: R(tau_pad=NAN), ValueError, r"tau_pad must lie in \[0, 1\]"),
    Bad("router-tau_pad-negative", lambda: R(tau_pad=-0.1), ValueError, r"tau_pad must lie in \[0, 1\]"),
    Bad("router-tau_pad-str", lambda: R(tau_pad="0.2"), TypeError, "tau_pad must be a float"),
    Bad("router-eager_max_bucket-negative", lambda: R(eager_max_bucket=-1), ValueError,
        "eager_max_bucket must be >= 0"),
    Bad("router-from_dict-unknown-key", lambda: R.from_dict({"tau": 0.2}), ValueError,
        r"unknown RouterConfig fields: \['tau'\]"),
]


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=lambda c: c.id)
def test_bad_config_is_rejected_by_name(case: Bad):
    with pytest.raises(case.error, match=case.names):
        case.call()


def test_from_json_names_the_file(tmp_path):
    broken = tmp_path / "seer.json"
    broken.write_text('{"probe_layer": 3,')
    with pytest.raises(ValueError, match=rf"SeerConfig {re.escape(str(broken))} is not valid JSON"):
        SeerConfig.from_json(broken)
    broken.write_text('{"gamma": 0}')
    with pytest.raises(ValueError, match=rf"{re.escape(str(broken))}: gamma must be > 0"):
        SeerConfig.from_json(broken)


def test_dyllm_tau_above_one_is_said():
    """tau > 1 is kept (the exactness check uses it) but never silent: a warning says what it means."""
    with pytest.warns(UserWarning, match=r"tau=1.01.*every row is salient.*no saving"):
        cfg = DyLLMConfig(tau=1.01)
    assert cfg.tau == 1.01
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DyLLMConfig(tau=1.0)  # a row equal to its cache (cos == 1) stays non-salient: nothing to say
        DyLLMConfig(tau=0.99)


# hypothesis: any value for any numeric field is either kept exactly or rejected naming the field
NUMERIC_FIELDS = [(G, "gen_length"), (G, "steps"), (G, "block_length"), (G, "temperature"), (G, "cfg_scale"),
                  (G, "alg_temp"), (G, "top_p"), (G, "top_k"), (G, "eps"), (G, "schedule_shift"),
                  (G, "step_ratio"), (G, "seed"), (S, "probe_layer"), (S, "eps"), (S, "tau_jump"), (S, "gamma"),
                  (S, "window"), (S, "baseline_window"), (S, "min_position"), (S, "eos_threshold"),
                  (S, "confirm_threshold"), (D, "tau"), (D, "full_steps"), (D, "prompt_period"),
                  (R, "tau_pad"), (R, "eager_max_bucket")]
VALUES = st.one_of(st.sampled_from([NAN, INF, -INF, 0, 0.0, -1, -0.5, 10**30, 1e300, True, False, "1", None]),
                   st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))


@HYPOTHESIS
@given(target=st.sampled_from(NUMERIC_FIELDS), value=VALUES)
def test_config_values_are_kept_exactly_or_rejected_by_name(target, value):
    cls, name = target
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cfg = cls(**{name: value})
        except (TypeError, ValueError) as exc:
            assert re.search(rf"\b{name}\b", str(exc)), f"{cls.__name__}({name}={value!r}): {exc}"
            return
    kept = getattr(cfg, name)
    assert not isinstance(value, (bool, str)) or value is None or kept is value, f"{name}={value!r} -> {kept!r}"
    assert value is None or (isinstance(value, (int, float)) and math.isfinite(value)), \
        f"{cls.__name__}({name}={value!r}) accepted a non-finite value"
    assert kept == value, f"{cls.__name__}({name}={value!r}) stored {kept!r}: converted silently"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cls.from_dict(cfg.to_dict()) == cfg  # what is stored reads back the same


# ------------------------------------------------------------------------------------ generate()
def _llada(**over):
    torch.manual_seed(0)
    return ma.build_model(ma.tiny_config("llada-8b-instruct", **over))


LLADA = None


def llada():
    global LLADA
    if LLADA is None:
        LLADA = _llada(max_sequence_length=24)
    return LLADA


GEN = GenerationConfig(gen_length=4, steps=4)
OK = torch.tensor([[5, 6, 7]])


def gen_call(*args, **kwargs):
    return lambda: generate(llada(), *args, **{"gen": GEN, **kwargs})


BAD_REQUESTS = [
    Bad("input_ids-list", gen_call([[5, 6]]), TypeError, "input_ids must be a torch.Tensor"),
    Bad("input_ids-float", gen_call(OK.float()), TypeError, "input_ids must be int64"),
    Bad("input_ids-int32", gen_call(OK.int()), TypeError, "input_ids must be int64"),
    Bad("input_ids-1d", gen_call(OK[0]), ValueError, r"input_ids must be 2-D \[batch, prompt_len\]"),
    Bad("input_ids-3d", gen_call(OK[None]), ValueError, "input_ids must be 2-D"),
    Bad("input_ids-empty-batch", gen_call(torch.zeros(0, 3, dtype=torch.long)), ValueError, "empty batch"),
    Bad("input_ids-empty-prompt", gen_call(torch.zeros(1, 0, dtype=torch.long)), ValueError, "prompts of length 0"),
    Bad("input_ids-meta", gen_call(OK.to("meta")), ValueError, "input_ids is on meta but the model is on cpu"),
    Bad("input_ids-id-past-vocab", gen_call(torch.tensor([[5, 256]])), ValueError,
        r"token ids outside the vocabulary \[0, 256\): \[256\]"),
    Bad("input_ids-id-negative", gen_call(torch.tensor([[-3, 5]])), ValueError, r"outside the vocabulary.*\[-3\]"),
    Bad("input_ids-mask-id", gen_call(torch.tensor([[5, 250]])), ValueError, "mask id 250 inside a prompt"),
    Bad("input_ids-pad-past-vocab", gen_call(torch.tensor([[999, 5]]), attention_mask=torch.tensor([[0, 1]])),
        ValueError, "padding ids outside the vocabulary"),
    Bad("attention_mask-shape", gen_call(OK, attention_mask=torch.ones(1, 2, dtype=torch.long)), ValueError,
        "attention_mask must be a tensor shaped like input_ids"),
    Bad("attention_mask-list", gen_call(OK, attention_mask=[[1, 1, 1]]), ValueError, "attention_mask must be a tensor"),
    Bad("attention_mask-meta", gen_call(OK, attention_mask=torch.ones(1, 3, dtype=torch.long, device="meta")),
        ValueError, "attention_mask is on meta"),
    Bad("attention_mask-value-2", gen_call(OK, attention_mask=torch.tensor([[0, 2, 1]])), ValueError,
        "attention_mask must contain only 0 and 1"),
    Bad("attention_mask-right-padding", gen_call(OK, attention_mask=torch.tensor([[1, 1, 0]])), ValueError,
        "attention_mask must be left padding"),
    Bad("attention_mask-empty-row", gen_call(OK, attention_mask=torch.zeros(1, 3, dtype=torch.long)), ValueError,
        "a request with no real token"),
    Bad("images-text-model", gen_call(OK, images=[None]), ValueError, "images were given, but LLaDAModelLM is a"),
    Bad("gen-not-config", lambda: generate(llada(), OK, gen={"gen_length": 4}), TypeError,
        "gen must be a GenerationConfig"),
    Bad("seer-not-config", gen_call(OK, seer={"probe_layer": 1}), TypeError, "seer must be a SeerConfig"),
    Bad("seer-probe_layer-past-model", gen_call(OK, seer=SeerConfig(probe_layer=7)), ValueError,
        r"probe layer\(s\) \[7\] out of range: the model has 3 layers"),
    Bad("dyllm-not-config", gen_call(OK, dyllm=0.99), TypeError, "dyllm must be a DyLLMConfig"),
    Bad("router-not-config", gen_call(OK, router="fast"), TypeError, "router must be a RouterConfig or True"),
    Bad("router-batch-past-buckets", gen_call(torch.tensor([[5, 6]] * 4), seer=SeerConfig(probe_layer=1),
                                              router=RouterConfig.for_window(4, max_batch=2)),
        ValueError, "exceeds the largest batch bucket 2"),
    Bad("graphs-cuda-on-cpu", gen_call(OK, graphs="cuda"), ValueError, "graphs='cuda' needs a CUDA device"),
    Bad("graphs-unknown", gen_call(OK, graphs="fast"), ValueError, "graphs must be 'auto', 'cuda', None or a"),
    Bad("policies-not-sequence", gen_call(OK, policies=object()), TypeError, "policies must be a sequence"),
    Bad("progress-str", gen_call(OK, progress="yes"), TypeError, "progress must be a bool"),
    Bad("dream-option-on-llada", gen_call(OK, gen=GenerationConfig(gen_length=4, alg="entropy")), ValueError,
        "alg / alg_temp / top_p / top_k are Dream options"),
    Bad("max_sequence_length-exceeded", gen_call(OK, gen=GenerationConfig(gen_length=22)), ValueError,
        r"the prompt \(3 positions\) plus gen_length \(22\) is 25 positions, more than the model's "
        r"max_sequence_length \(24\)"),
    Bad("threshold-dream-needs-maskgit_plus",
        lambda: generate(tiny("dream-v0-instruct-7b"), OK, gen=GenerationConfig(gen_length=4, threshold=0.9)),
        ValueError, "alg='maskgit_plus'"),
    Bad("block_cache-with-dyllm", gen_call(OK, gen=GenerationConfig(gen_length=4, block_cache="prefix"),
                                           dyllm=DyLLMConfig()), ValueError, "composes with neither DyLLM"),
    Bad("model-not-an-adapter", lambda: generate(torch.nn.Linear(2, 2), OK, gen=GEN), TypeError,
        "model does not implement the adapter surface"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=lambda c: c.id)
def test_bad_request_is_rejected_by_name(case: Bad):
    with pytest.raises(case.error, match=case.names):
        case.call()


def test_max_sequence_length_counts_the_image_features():
    """LaViDa: before the images are embedded each placeholder is one position; once embedded
    the prompt's real length is checked, and both numbers are named."""
    torch.manual_seed(0)
    model = ma.build_model(ma.tiny_config("lavida-llada", max_sequence_length=10))
    ids = torch.tensor([[5, ma.IMAGE_TOKEN_INDEX, 6]])
    image = ma.ImageInput(torch.randn(1, 3, 32, 32), (32, 32))
    gen = GenerationConfig(gen_length=4)
    generate(model, torch.tensor([[5, 6, 7]]), gen=gen)  # 3 + 4 <= 10: fine without the image
    with pytest.raises(ValueError, match=r"the prompt \(7 positions\) plus gen_length \(4\) is 11 positions, more "
                                         r"than the model's max_sequence_length \(10\)"):
        generate(model, ids, images=[image], gen=gen)
    with pytest.raises(ValueError, match=r"prompt \(3 positions \(image features not yet counted\)\) plus gen_length "
                                         r"\(8\)"):
        generate(model, ids, images=[image], gen=GenerationConfig(gen_length=8))


def test_max_sequence_length_of_dream_is_max_position_embeddings():
    torch.manual_seed(0)
    model = ma.build_model(ma.tiny_config("dream-v0-instruct-7b", max_position_embeddings=8))
    assert model.max_sequence_length == 8
    generate(model, torch.tensor([[5, 6, 7, 8]]), gen=GenerationConfig(gen_length=4))  # 4 + 4 == 8: fine
    with pytest.raises(ValueError, match=r"plus gen_length \(5\) is 9 positions.*max_sequence_length \(8\)"):
        generate(model, torch.tensor([[5, 6, 7, 8]]), gen=GenerationConfig(gen_length=5))


@pytest.mark.parametrize("kind,gen,warned", [
    ("llada-8b-instruct", GenerationConfig(gen_length=4, steps=8), "steps \\(8\\) plans 8 denoising steps for 4"),
    ("llada-8b-instruct", GenerationConfig(gen_length=8, block_length=4, steps=16), "plans 16 denoising steps for 8"),
    ("llada-8b-instruct", GenerationConfig(gen_length=4, steps=16, step_ratio=0.5), "plans 8 denoising steps for 4"),
    ("dream-v0-instruct-7b", GenerationConfig(gen_length=4, steps=6), "plans 6 denoising steps for 4"),
    ("llada-8b-instruct", GenerationConfig(gen_length=4, steps=4), None),
    ("lavida-dream", GenerationConfig(gen_length=4, steps=8), None),  # LaViDa-Dream caps steps at gen_length
    ("dream-v0-instruct-7b", GenerationConfig(gen_length=4, steps=8, step_ratio=0.5), None),
])
def test_more_steps_than_positions_is_warned_not_rejected(kind, gen, warned):
    """The reference generators accept it (the extra forwards commit nothing): warn, decode anyway."""
    model = tiny(kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate(model, torch.tensor([[5, 6]]), gen=gen)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    if warned is None:
        assert not [m for m in messages if "denoising steps" in m], messages
    else:
        assert any(re.search(warned, m) and "commit no token" in m for m in messages), messages
        assert any(w.filename == __file__ for w in caught), "the warning must point at the caller's line"
    assert bool((out.responses != model.token_ids.mask).all()), "every position is still decoded"


# hypothesis: validate_request accepts a request exactly when it is well formed
@HYPOTHESIS
@given(batch=st.integers(0, 3), length=st.integers(0, 5),
       dtype=st.sampled_from([torch.long, torch.int32, torch.float32, torch.bool]),
       device=st.sampled_from(["cpu", "cpu", "cpu", "meta"]), lo=st.integers(-3, 255), hi=st.integers(0, 300),
       pads=st.lists(st.integers(0, 5), min_size=3, max_size=3), mask_kind=st.sampled_from(
           ["none", "left", "right", "value2", "meta", "short"]))
def test_validate_request_accepts_exactly_the_well_formed(batch, length, dtype, device, lo, hi, pads, mask_kind):
    model = llada()
    g = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(0, 256, (batch, length), generator=g)
    if batch and length:
        ids[0, -1] = lo
        ids[-1, 0] = min(hi, 10**4)
    ids = ids.to(dtype).to(device)
    mask = None
    pad = [min(p, max(length - 1, 0)) for p in pads[:batch]]
    if mask_kind != "none":
        mask = torch.ones(batch, length, dtype=torch.long)
        for r, p in enumerate(pad):
            if mask_kind in ("left", "meta"):
                mask[r, :p] = 0
            elif mask_kind == "right" and p:
                mask[r, -p:] = 0
            elif mask_kind == "value2" and length:
                mask[r, -1] = 2
        if mask_kind == "meta":
            mask = mask.to("meta")
        if mask_kind == "short":
            mask = mask[:, 1:]
    gen = GenerationConfig(gen_length=4)

    def well_formed():
        if dtype != torch.long or device != "cpu" or batch == 0 or length == 0:
            return False
        if mask is not None:
            if mask_kind in ("meta", "short") or (mask_kind == "value2"):
                return False
            if mask_kind == "right" and any(pad):
                return False
        real = torch.ones(batch, length, dtype=torch.bool) if mask is None else mask.bool()
        values = ids.cpu()[real]
        return bool(((values >= 0) & (values < 256) & (values != 250)).all()) and length + 4 <= 24

    if well_formed():
        validate_request(model, ids, mask, None, gen)
    else:
        with pytest.raises((TypeError, ValueError), match="input_ids|attention_mask|max_sequence_length"):
            validate_request(model, ids, mask, None, gen)


# ------------------------------------------------------------------------------------ forward()
def _fwd(kind, *args, **kwargs):
    return lambda: tiny(kind)(*args, **kwargs)


CAUSAL = torch.tril(torch.ones(3, 3, dtype=torch.bool))[None, None]
BAD_FORWARD = [
    Bad("llada-unknown-keyword", _fwd("llada-8b-instruct", OK, position_ids=torch.arange(3)[None]), TypeError,
        "LLaDAModelLM.forward.. got an unsupported keyword argument 'position_ids'"),
    Bad("dream-attention_bias", _fwd("dream-v0-instruct-7b", OK, attention_bias=torch.ones(1, 1, 3, 3)), TypeError,
        "DreamModel.forward.. got an unsupported keyword argument 'attention_bias'"),
    Bad("lavida-unknown-keyword", _fwd("lavida-llada", OK, images=None), TypeError,
        "LlavaLladaForMaskedDiffusion.forward.. got an unsupported keyword argument 'images'"),
    Bad("llada-use_cache", _fwd("llada-8b-instruct", OK, use_cache=True), ValueError,
        "use_cache=True is not supported.*model.prefill"),
    Bad("llada-past_key_values", _fwd("llada-8b-instruct", OK, past_key_values=[(1, 2)]), ValueError,
        "past_key_values=.* is not supported"),
    Bad("dream-output_hidden_states", _fwd("dream-v0-instruct-7b", OK, output_hidden_states=True), ValueError,
        "output_hidden_states=True is not supported by DreamModel.forward"),
    Bad("llada-return_dict-false", _fwd("llada-8b-instruct", OK, return_dict=False), ValueError,
        "return_dict=False is not supported"),
    Bad("llada-attention_bias-causal", _fwd("llada-8b-instruct", OK, attention_bias=CAUSAL), ValueError,
        "attention_bias is not a padding mask"),
    Bad("llada-attention_bias-shape", _fwd("llada-8b-instruct", OK, attention_bias=torch.ones(1, 3, 3)),
        ValueError, r"attention_bias must have shape \[1 or 1, 1, 3, 3\]"),
    Bad("llada-attention_bias-additive", _fwd("llada-8b-instruct", OK, attention_bias=torch.full((1, 1, 3, 3), 0.5)),
        ValueError, "attention_bias: a float bias must hold only 0"),
    Bad("llada-input_ids-and-embeddings", _fwd("llada-8b-instruct", OK, input_embeddings=torch.zeros(1, 3, 64)),
        ValueError, "pass exactly one of input_ids and input_embeddings"),
    Bad("llada-input_ids-float", _fwd("llada-8b-instruct", OK.float()), ValueError,
        r"input_ids must be an int64 tensor \[batch, length\]"),
    Bad("dream-attention_mask-shape", _fwd("dream-v0-instruct-7b", OK, torch.ones(1, 4, dtype=torch.long)),
        ValueError, r"attention_mask must have shape \(1, 3\)"),
]


@pytest.mark.parametrize("case", BAD_FORWARD, ids=lambda c: c.id)
def test_bad_forward_call_is_rejected_by_name(case: Bad):
    with pytest.raises(case.error, match=case.names):
        case.call()


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "mmada-8b", "lavida-llada"])
def test_mmada_attention_bias_is_the_padding_mask(kind):
    """MMaDA's mmu_generate passes ``attention_bias`` = outer product of its padding mask: the
    logits of the real tokens equal those of ``attention_mask`` bit for bit (bool, int, float)."""
    model = tiny(kind)
    ids = torch.tensor([[251, 251, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    want = model(ids, mask).logits
    outer = (mask[:, :, None] & mask[:, None, :]).bool()[:, None]
    additive = torch.zeros(outer.shape).masked_fill(~outer, torch.finfo(torch.float32).min)
    for bias in (outer, outer.to(torch.int8), additive):
        got = model(ids, attention_bias=bias).logits
        assert torch.equal(got[mask.bool()], want[mask.bool()])
        both = model(ids, mask, attention_bias=bias).logits
        assert torch.equal(both[mask.bool()], want[mask.bool()])
    full = model(ids, attention_bias=torch.ones(1, 1, 5, 5, dtype=torch.bool)).logits
    assert torch.equal(full, model(ids).logits)


def test_no_op_keywords_are_accepted():
    model = tiny("llada-8b-instruct")
    want = model(OK).logits
    got = model(OK, use_cache=False, past_key_values=None, output_attentions=False, output_hidden_states=None,
                return_dict=True, labels=None).logits
    assert torch.equal(got, want)


def test_every_config_field_has_a_bad_case():
    """The enumerated cases cover every field of every config (a new field needs its bad case)."""
    exempt = {D: {"key_correction"}, R: {"packed_buckets", "batch_buckets"}}  # same checks as a covered sibling
    for cls, prefix in ((G, "gen"), (S, "seer"), (D, "dyllm"), (R, "router")):
        covered = {c.id.split("-")[1] for c in BAD_CONFIGS if c.id.startswith(prefix + "-")}
        missing = {f.name for f in fields(cls)} - covered - exempt.get(cls, set())
        assert not missing, f"{cls.__name__}: no bad case for {sorted(missing)}"
