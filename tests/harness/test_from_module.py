"""Bring your own model: ``model_adapters.from_module`` on module trees carrying the checkpoints' names.

No upstream code is installed, so the test double is a plain ``nn.Module`` tree built from a
checkpoint's dotted names (as LLaDA's / Dream's remote code, LaViDa's builder and MMaDA's
classes name their parameters), with a ``config`` object that has ``to_dict()`` (a Hugging Face
``PretrainedConfig``'s interface) and a non-persistent buffer (Dream's rotary ``inv_freq``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import model_adapters as ma
from seer_runtime import GenerationConfig, generate

pytestmark = [pytest.mark.models, pytest.mark.usefixtures("reference_kernels")]

KINDS = ["llada-8b-instruct", "mmada-8b", "dream-v0-instruct-7b", "lavida-llada", "lavida-dream"]


class UpstreamConfig:
    """What a Hugging Face config offers here: attributes and ``to_dict()``."""

    def __init__(self, config: dict):
        self._config = dict(config)

    def to_dict(self) -> dict:
        return dict(self._config)


def upstream_tree(state: dict[str, torch.Tensor], config: dict | None) -> nn.Module:
    """A module tree whose parameters carry ``state``'s names (not our classes), frozen as an
    eval-mode upstream model often is, with a non-persistent buffer beside them."""
    root = nn.Module()
    for name, tensor in state.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if part not in node._modules:
                node.add_module(part, nn.Module())
            node = node._modules[part]
        node.register_parameter(leaf, nn.Parameter(tensor.detach().clone(), requires_grad=False))
    rotary = nn.Module()
    rotary.register_buffer("inv_freq", torch.ones(4), persistent=False)
    root.add_module("rotary_emb", rotary)
    if config is not None:
        root.config = UpstreamConfig(config)
    return root


def reference_and_upstream(kind: str):
    torch.manual_seed(0)
    cfg = ma.tiny_config(kind)
    reference = ma.build_model(cfg)
    return cfg, reference, upstream_tree(reference.state_dict(), cfg)


def tiny_image(model) -> ma.ImageInput:
    from PIL import Image

    img = Image.new("RGB", (40, 30), (200, 40, 90))
    return ma.process_image(img, image_size=model.model.vision_tower.image_size, anyres=False)


@pytest.mark.parametrize("kind", KINDS)
def test_from_module_shares_every_parameter_and_computes_the_same(kind):
    cfg, reference, upstream = reference_and_upstream(kind)
    ours = ma.from_module(upstream)
    assert type(ours) is type(reference)
    theirs = upstream.state_dict(keep_vars=True)
    assert set(ours.state_dict()) == set(theirs)
    for name, param in ours.named_parameters():
        assert param is theirs[name] and param.data_ptr() == theirs[name].data_ptr(), name
        assert param.requires_grad is False  # the upstream flag is kept, not reset
    ids = torch.randint(0, 250, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    torch.testing.assert_close(ours(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits,
                               rtol=0, atol=0)
    prompt = ids.clone()
    images = None
    if reference.is_multimodal:
        prompt[:, 3] = ma.IMAGE_TOKEN_INDEX
        images = [tiny_image(reference), tiny_image(reference)]
    gen = GenerationConfig(gen_length=4, steps=4, seed=0)  # Dream's "origin" draws which positions to commit
    a = generate(ours, prompt, attention_mask=mask, images=images, gen=gen)
    b = generate(reference, prompt, attention_mask=mask, images=images, gen=gen)
    assert torch.equal(a.sequences, b.sequences)


def test_a_change_to_the_upstream_weights_is_a_change_to_ours():
    _, _, upstream = reference_and_upstream("llada-8b-instruct")
    ours = ma.from_module(upstream)
    ids = torch.randint(0, 250, (1, 5))
    before = ours(ids).logits.clone()
    with torch.no_grad():
        upstream.model.transformer.ff_out.weight.mul_(2.0)  # the LM head, in place
    torch.testing.assert_close(ours(ids).logits, 2.0 * before)


def test_from_module_takes_a_config_dict_and_rejects_what_does_not_match():
    cfg, reference, _ = reference_and_upstream("dream-v0-instruct-7b")
    state = reference.state_dict()
    ours = ma.from_module(upstream_tree(state, None), config=cfg)
    assert isinstance(ours, ma.DreamModel)
    with pytest.raises(TypeError, match="has no config .* pass config="):
        ma.from_module(upstream_tree(state, None))
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got dict"):
        ma.from_module(dict(state))
    partial = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=r'Missing key\(s\) in state_dict: "model.layers.1.mlp.up_proj.weight"'):
        ma.from_module(upstream_tree(partial, cfg))
    extra = {**state, "model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}
    with pytest.raises(ValueError, match=r'Unexpected key\(s\) in state_dict: "model.layers.0.self_attn.o_proj.bias"'):
        ma.from_module(upstream_tree(extra, cfg))
    wrong = {**state, "lm_head.weight": torch.zeros(255, 64)}
    with pytest.raises(ValueError, match=r"size mismatch for lm_head.weight: .*\[255, 64\].*\[256, 64\]"):
        ma.from_module(upstream_tree(wrong, cfg))
    # LLaDA's names under Dream's config: every key is reported, by architecture
    _, llada, _ = reference_and_upstream("llada-8b-instruct")
    with pytest.raises(ValueError, match="(?s)does not carry the names of DreamModel .*Missing key.*Unexpected key"):
        ma.from_module(upstream_tree(llada.state_dict(), cfg))
