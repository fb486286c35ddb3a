"""Dream (``DreamModel``): our definition of Dream-v0-Instruct-7B (Qwen2 shapes and key names).

Keys (``reference/MODELS.md`` §2.2)::

    model.embed_tokens.weight                                   [vocab, hidden]
    model.layers.{i}.input_layernorm.weight                     [hidden]
    model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}       q: [heads*hd, hidden]; k/v: [kv_heads*hd, hidden]
    model.layers.{i}.self_attn.o_proj.weight                    [hidden, hidden]   (no bias)
    model.layers.{i}.post_attention_layernorm.weight            [hidden]
    model.layers.{i}.mlp.{gate,up}_proj.weight                  [intermediate, hidden]
    model.layers.{i}.mlp.down_proj.weight                       [hidden, intermediate]
    model.norm.weight                                           [hidden]
    lm_head.weight                                              [vocab, hidden]    (untied)

Numerics: RMSNorm in fp32 (eps 1e-6); rotate-half RoPE with cos/sin cast to the activation dtype
and explicit ``position_ids``; GQA (kv heads repeated to query heads); q/k/v biases; bidirectional
attention. Logits are returned unshifted: the state at position i predicts token i+1 and the
sampler applies the shift (``logits_shift = 1``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from seer_runtime.adapter import PaddedLayout, TokenIds

from .common import RMSNorm, linear, linear_pair
from .decoder import (
    DiffusionDecoder,
    ModelOutput,
    check_forward_inputs,
    check_forward_keywords,
    config_value,
    token_ids_from_config,
)

DREAM_TOKEN_IDS = TokenIds(mask=151666, eos=151643, eot=151645, pad=151643, bos=151643)


class DreamArgs:
    def __init__(self, config: dict):
        problems = []
        act = config_value(config, "hidden_act", "silu")
        if act != "silu":
            problems.append(f"hidden_act={act!r} (only 'silu')")
        if config_value(config, "use_sliding_window", False):
            problems.append("use_sliding_window=true")
        if config.get("rope_scaling"):
            problems.append(f"rope_scaling={config['rope_scaling']!r}")
        if problems:
            raise ValueError("unsupported Dream config options: " + "; ".join(problems))
        self.hidden = int(config["hidden_size"])
        self.intermediate = int(config["intermediate_size"])
        self.n_layers = int(config["num_hidden_layers"])
        self.n_heads = int(config["num_attention_heads"])
        self.n_kv_heads = int(config_value(config, "num_key_value_heads", self.n_heads))
        self.vocab = int(config["vocab_size"])
        self.rope_theta = float(config_value(config, "rope_theta", 10000.0))
        self.rms_norm_eps = float(config_value(config, "rms_norm_eps", 1e-6))
        self.tie = bool(config_value(config, "tie_word_embeddings", False))
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden_size={self.hidden} is not divisible by num_attention_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.n_heads} not divisible by num_key_value_heads={self.n_kv_heads}"
            )
        self.head_dim = self.hidden // self.n_heads
        self.token_ids = token_ids_from_config(config, DREAM_TOKEN_IDS)


class DreamAttention(nn.Module):
    """``self_attn``: q/k/v with biases (hard-coded upstream), o_proj without."""

    def __init__(self, a: DreamArgs):
        super().__init__()
        self.q_proj = nn.Linear(a.hidden, a.n_heads * a.head_dim, bias=True)
        self.k_proj = nn.Linear(a.hidden, a.n_kv_heads * a.head_dim, bias=True)
        self.v_proj = nn.Linear(a.hidden, a.n_kv_heads * a.head_dim, bias=True)
        self.o_proj = nn.Linear(a.n_heads * a.head_dim, a.hidden, bias=False)


class DreamMLP(nn.Module):
    def __init__(self, a: DreamArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden, a.intermediate, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.intermediate, bias=False)
        self.down_proj = nn.Linear(a.intermediate, a.hidden, bias=False)


class DreamDecoderLayer(nn.Module):
    def __init__(self, a: DreamArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.self_attn = DreamAttention(a)
        self.mlp = DreamMLP(a)
        self.input_layernorm = RMSNorm(a.hidden, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden, a.rms_norm_eps)

    # the sub-steps composed by common.block_forward
    def attn_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_layernorm(x)

    def project_qkv(self, x: torch.Tensor):
        lead = x.shape[:-1]
        at = self.self_attn
        return (
            at.q_proj(x).view(*lead, self.n_heads, self.head_dim),
            at.k_proj(x).view(*lead, self.n_kv_heads, self.head_dim),
            at.v_proj(x).view(*lead, self.n_kv_heads, self.head_dim),
        )

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        return self.self_attn.q_proj(x).view(*x.shape[:-1], self.n_heads, self.head_dim)

    def project_kv(self, x: torch.Tensor, *, count=None):
        lead = x.shape[:-1]
        at = self.self_attn
        k, v = linear_pair(at.k_proj, at.v_proj, x, count)
        return k.view(*lead, self.n_kv_heads, self.head_dim), v.view(*lead, self.n_kv_heads, self.head_dim)

    def project_out(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.self_attn.o_proj(ctx)

    def ffn_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.post_attention_layernorm(x)

    def row_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.input_layernorm, self.post_attention_layernorm

    def mlp_gate_up(self, h: torch.Tensor, *, count=None):
        mlp = self.mlp
        return linear_pair(mlp.gate_proj, mlp.up_proj, h, count)

    def mlp_down(self, act: torch.Tensor, *, count=None) -> torch.Tensor:
        return linear(self.mlp.down_proj, act, count)


class DreamBaseModel(nn.Module):
    def __init__(self, a: DreamArgs):
        super().__init__()
        pad = a.token_ids.pad if 0 <= a.token_ids.pad < a.vocab else None
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden, padding_idx=pad)
        self.layers = nn.ModuleList([DreamDecoderLayer(a) for _ in range(a.n_layers)])
        self.norm = RMSNorm(a.hidden, a.rms_norm_eps)


class DreamModel(DiffusionDecoder):
    """Dream-v0-Instruct-7B and any Dream-architecture config.

    Callable like the Hugging Face class, positionally ``model(input_ids, attention_mask,
    position_ids).logits`` (unshifted). ``attention_mask`` may be a 2-D 0/1 mask, the 4-D bool
    mask Dream's ``_sample`` builds, the string ``"full"`` or None.
    """

    family = "dream"
    logits_shift = 1

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        a = DreamArgs(self.config)
        self.args = a
        self.token_ids = a.token_ids
        self.rope_theta = a.rope_theta
        self.rope_full_precision = False
        self.num_heads, self.num_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.hidden_size, self.intermediate_size = a.hidden, a.intermediate
        self.model = self._make_inner(a)
        if not a.tie:
            self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)

    def _make_inner(self, a: DreamArgs) -> nn.Module:
        return DreamBaseModel(a)

    def _embedding(self):
        return self.model.embed_tokens

    def _blocks(self):
        return self.model.layers

    def _final_norm(self):
        return self.model.norm

    def _lm_head_weight(self):
        return self.model.embed_tokens.weight if self.args.tie else self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | str | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        **hf_keywords: Any,
    ) -> ModelOutput:
        """input_ids [B, L] (or ``inputs_embeds`` [B, L, D]); attention_mask [B, L] of 0/1, Dream's
        ``[B, 1, L, L]`` outer-product mask, ``"full"`` or None; position_ids [B, L]. Hugging
        Face's cache and output keywords are accepted at their no-op values only; any other
        keyword raises ``TypeError`` naming it."""
        check_forward_keywords(self, hf_keywords)
        check_forward_inputs(input_ids, "inputs_embeds", inputs_embeds, attention_mask)
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        b, length = embeds.shape[:2]
        key_mask = None
        if isinstance(attention_mask, torch.Tensor):
            if attention_mask.dim() == 4:
                # Dream's [B, 1, N, N] outer-AND mask: its diagonal marks the real tokens. We mask
                # keys only (pad queries still attend to real keys); real rows are identical and
                # pad rows, which nothing reads, never become all-masked NaNs.
                key_mask = attention_mask[:, 0].diagonal(dim1=-2, dim2=-1).bool()
            elif attention_mask.dim() == 2:
                key_mask = attention_mask.bool()
            else:
                raise ValueError(f"attention_mask must be 2-D or 4-D, got shape {tuple(attention_mask.shape)}")
            if bool(key_mask.all()):
                key_mask = None
        elif attention_mask not in (None, "full"):
            raise ValueError(f"attention_mask must be a tensor, 'full' or None, got {attention_mask!r}")
        if position_ids is None:
            position_ids = torch.arange(length, device=embeds.device).expand(b, length)
        return ModelOutput(logits=self.forward_embeds(embeds, PaddedLayout(position_ids, key_mask)))
