"""The run-time NaN/inf check (``GenerationConfig.check_finite``, issue 20): a fault in a hidden
state or the logits is an error naming the step and the layer, read once per call; off, the
same fault decodes silently (which is why it is on by default)."""

from __future__ import annotations

import pytest
import torch

from seer_runtime import DyLLMConfig, GenerationConfig, NonFiniteError, SeerConfig, generate
from seer_runtime.evaluate import pad_left

from ..tiny_models import tiny

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("reference_kernels")]

GEN = GenerationConfig(gen_length=8, steps=8, block_length=8, tie_break="stable")


def _poison(model, layer: int, *, after_calls: int, value=float("nan")):
    """Layer ``layer`` writes ``value`` into its output from its ``after_calls``-th call on."""
    inner = model.layer
    calls = {"n": 0}

    def layer_fn(i, hidden, *args, **kwargs):
        out = inner(i, hidden, *args, **kwargs)
        if i == layer:
            calls["n"] += 1
            if calls["n"] > after_calls:
                out = out.clone()
                out[..., 0, 0] = value
        return out

    model.layer = layer_fn
    return model


@pytest.mark.parametrize("kind", ["llada-8b-instruct", "dream-v0-instruct-7b"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_fault_is_named_by_step_and_layer(kind, value):
    model = _poison(tiny(kind), layer=1, after_calls=3, value=value)
    ids, mask = pad_left([[5, 6, 7], [8, 9]], model.token_ids.pad)
    gen = GEN.replace(block_length=None, alg="entropy") if model.family == "dream" else GEN
    with pytest.raises(NonFiniteError, match="first appeared at step 3 in the output of layer 1") as err:
        generate(model, ids, attention_mask=mask, gen=gen, graphs=None)
    assert err.value.step == 3 and err.value.layer == 1
    assert err.value.output is not None and err.value.output.responses.shape == (2, 8)  # nothing lost


@pytest.mark.parametrize("extra", [{"seer": SeerConfig(probe="eos_prob", probe_layer=1, eos_threshold=0.004)},
                                   {"dyllm": DyLLMConfig(tau=0.99, full_steps=2)}])
def test_the_check_composes_with_seer_and_dyllm(extra):
    model = _poison(tiny("llada-8b-instruct"), layer=0, after_calls=5)
    with pytest.raises(NonFiniteError, match="layer 0"):
        generate(model, torch.tensor([[5, 6, 7]]), gen=GEN, graphs=None, **extra)


def test_off_it_decodes_silently_and_on_it_costs_no_read_inside_steps():
    model = _poison(tiny("llada-8b-instruct"), layer=2, after_calls=0)
    out = generate(model, torch.tensor([[5, 6, 7]]), gen=GEN.replace(check_finite=False), graphs=None)
    assert out.responses.shape == (1, 8)  # a wrong answer, and nothing said: what the check is for
    clean = tiny("llada-8b-instruct")
    a = generate(clean, torch.tensor([[5, 6, 7]]), gen=GEN, graphs=None)
    b = generate(clean, torch.tensor([[5, 6, 7]]), gen=GEN.replace(check_finite=False), graphs=None)
    assert torch.equal(a.sequences, b.sequences)


def test_check_finite_must_be_a_bool():
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        GenerationConfig(check_finite=1)
