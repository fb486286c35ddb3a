"""LLaDA (``LLaDAModelLM``) and MMaDA (``MMadaModelLM``): our definitions of the published models.

Module tree and state-dict keys follow ``reference/MODELS.md`` §1.2 exactly::

    model.transformer.wte.weight                       [vocab, d_model]
    model.transformer.blocks.{i}.attn_norm.weight      [d_model]
    model.transformer.blocks.{i}.{q,k,v}_proj.weight   [n_heads*hd | n_kv_heads*hd, d_model]
    model.transformer.blocks.{i}.attn_out.weight       [d_model, d_model]
    model.transformer.blocks.{i}.ff_norm.weight        [d_model]
    model.transformer.blocks.{i}.ff_proj.weight        [mlp_hidden, d_model]   (the gate)
    model.transformer.blocks.{i}.up_proj.weight        [mlp_hidden, d_model]
    model.transformer.blocks.{i}.ff_out.weight         [d_model, mlp_hidden]   (down projection)
    model.transformer.ln_f.weight                      [d_model]
    model.transformer.ff_out.weight                    [vocab, d_model]        (LM head, untied)

Numerics: RMSNorm in fp32; rotate-half RoPE applied in fp32 (``rope_full_precision``) at implicit
positions ``0..L-1``; bidirectional attention with a key-padding mask (never the causal fallback
of the old LLaDA file); SwiGLU MLP ``ff_out(silu(ff_proj(h)) * up_proj(h))``.
MMaDA is the same network with the 134656-row vocabulary (LLaDA's 126464 + 8192 image codes).
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
    key_mask_from_attention_bias,
    key_mask_from_attention_mask,
    token_ids_from_config,
)

# LLaDA-8B-Instruct special tokens (tokenizer_config.json; MODELS.md §1.6)
LLADA_TOKEN_IDS = TokenIds(mask=126336, eos=126081, eot=126348, pad=126081, bos=126080)

_UNSUPPORTED = {
    # option: value the published checkpoints use (anything else is not implemented here)
    "alibi": False,
    "attention_layer_norm": False,
    "scale_logits": False,
    "input_emb_norm": False,
}


class LLaDAArgs:
    """The fields of an OLMo-style LLaDA ``config.json`` this definition reads (validated)."""

    def __init__(self, config: dict):
        problems = []
        block_type = config_value(config, "block_type", "llama")
        if block_type != "llama":
            problems.append(f"block_type={block_type!r} (only 'llama' is implemented)")
        act = config_value(config, "activation_type", "silu")
        if act not in ("silu", "swiglu"):
            problems.append(f"activation_type={act!r} (only silu/swiglu)")
        norm = config_value(config, "layer_norm_type", "rms")
        if norm != "rms":
            problems.append(f"layer_norm_type={norm!r} (only 'rms')")
        for key, value in _UNSUPPORTED.items():
            if bool(config_value(config, key, value)) != value:
                problems.append(f"{key}={config[key]!r}")
        if not config_value(config, "rope", True):
            problems.append("rope=false")
        if problems:
            raise ValueError("unsupported LLaDA config options: " + "; ".join(problems))
        self.d_model = int(config["d_model"])
        self.n_heads = int(config["n_heads"])
        self.n_kv_heads = int(config_value(config, "n_kv_heads", self.n_heads))
        self.n_layers = int(config["n_layers"])
        mlp_hidden = config.get("mlp_hidden_size")
        self.mlp_hidden = int(mlp_hidden) if mlp_hidden else int(config_value(config, "mlp_ratio", 4) * self.d_model)
        self.rope_theta = float(config_value(config, "rope_theta", 10000.0))
        self.rope_full_precision = bool(config_value(config, "rope_full_precision", True))
        self.rms_norm_eps = float(config_value(config, "rms_norm_eps", 1e-5))
        self.weight_tying = bool(config_value(config, "weight_tying", False))
        self.include_bias = bool(config_value(config, "include_bias", False))
        self.include_qkv_bias = bool(config_value(config, "include_qkv_bias", False))
        # MMaDA resizes the embedding to new_vocab_size; otherwise embedding_size pads vocab_size.
        self.embedding_rows = int(
            config.get("new_vocab_size") or config.get("embedding_size") or config["vocab_size"]
        )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        self.head_dim = self.d_model // self.n_heads
        self.token_ids = token_ids_from_config(config, LLADA_TOKEN_IDS)


class LLaDALlamaBlock(nn.Module):
    """``model.transformer.blocks.{i}``: pre-norm attention + SwiGLU MLP, no post-norms."""

    def __init__(self, a: LLaDAArgs):
        super().__init__()
        qkv_bias = a.include_bias or a.include_qkv_bias
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.attn_norm = _rms(a)
        self.q_proj = nn.Linear(a.d_model, a.n_heads * a.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(a.d_model, a.n_kv_heads * a.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(a.d_model, a.n_kv_heads * a.head_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(a.d_model, a.d_model, bias=a.include_bias)
        self.ff_norm = _rms(a)
        self.ff_proj = nn.Linear(a.d_model, a.mlp_hidden, bias=a.include_bias)
        self.up_proj = nn.Linear(a.d_model, a.mlp_hidden, bias=a.include_bias)
        self.ff_out = nn.Linear(a.mlp_hidden, a.d_model, bias=a.include_bias)

    # the sub-steps composed by common.block_forward
    def project_qkv(self, x: torch.Tensor):
        lead = x.shape[:-1]
        return (
            self.q_proj(x).view(*lead, self.n_heads, self.head_dim),
            self.k_proj(x).view(*lead, self.n_kv_heads, self.head_dim),
            self.v_proj(x).view(*lead, self.n_kv_heads, self.head_dim),
        )

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x).view(*x.shape[:-1], self.n_heads, self.head_dim)

    def project_kv(self, x: torch.Tensor, *, count=None):
        lead = x.shape[:-1]
        k, v = linear_pair(self.k_proj, self.v_proj, x, count)
        return k.view(*lead, self.n_kv_heads, self.head_dim), v.view(*lead, self.n_kv_heads, self.head_dim)

    def project_out(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.attn_out(ctx)

    def mlp_gate_up(self, h: torch.Tensor, *, count=None):
        return linear_pair(self.ff_proj, self.up_proj, h, count)

    def mlp_down(self, act: torch.Tensor, *, count=None) -> torch.Tensor:
        return linear(self.ff_out, act, count)

    def ffn_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff_norm(x)

    def row_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.attn_norm, self.ff_norm

    # attn_norm is the module itself (name kept from the checkpoint)


def _rms(a: LLaDAArgs):
    return RMSNorm(a.d_model, a.rms_norm_eps)


class LLaDAModel(nn.Module):
    """``model``: holds ``transformer`` = ModuleDict(wte, blocks, ln_f[, ff_out])."""

    def __init__(self, a: LLaDAArgs):
        super().__init__()
        modules = {
            "wte": nn.Embedding(a.embedding_rows, a.d_model),
            "blocks": nn.ModuleList([LLaDALlamaBlock(a) for _ in range(a.n_layers)]),
            "ln_f": _rms(a),
        }
        if not a.weight_tying:
            modules["ff_out"] = nn.Linear(a.d_model, a.embedding_rows, bias=False)
        self.transformer = nn.ModuleDict(modules)


class LLaDAModelLM(DiffusionDecoder):
    """LLaDA-8B-Instruct / Base and any LLaDA-architecture config.

    Callable like the Hugging Face class: ``model(input_ids, attention_mask=None).logits``
    (position i predicts token i), with ``.device``; so LLaDA's own generate.py and Fast-dLLM
    drive it unchanged.
    """

    family = "llada"
    logits_shift = 0

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        a = LLaDAArgs(self.config)
        self.args = a
        self.token_ids = a.token_ids
        self.rope_theta = a.rope_theta
        self.rope_full_precision = a.rope_full_precision
        self.num_heads, self.num_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.hidden_size, self.intermediate_size = a.d_model, a.mlp_hidden
        self.model = self._make_inner(a)

    def _make_inner(self, a: LLaDAArgs) -> nn.Module:
        return LLaDAModel(a)

    def _embedding(self):
        return self.model.transformer.wte

    def _blocks(self):
        return self.model.transformer.blocks

    def _final_norm(self):
        return self.model.transformer.ln_f

    def _lm_head_weight(self):
        t = self.model.transformer
        return t.wte.weight if self.args.weight_tying else t.ff_out.weight

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        input_embeddings: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
        **hf_keywords: Any,
    ) -> ModelOutput:
        """input_ids [B, L] (or ``input_embeddings`` [B, L, D]); attention_mask [B, L] of 0/1;
        attention_bias: LLaDA's padding bias ``[B or 1, 1, L, L]`` as MMaDA passes it (a padding
        mask only, see :func:`key_mask_from_attention_bias`); combined with the mask when both are
        given. Hugging Face's cache and output keywords are accepted at their no-op values only;
        any other keyword raises ``TypeError`` naming it.

        Positions are implicit (0..L-1), as in LLaDA's file; padded keys are masked, and
        attention stays bidirectional with or without padding.
        """
        check_forward_keywords(self, hf_keywords)
        check_forward_inputs(input_ids, "input_embeddings", input_embeddings, attention_mask)
        embeds = self.embed(input_ids) if input_embeddings is None else input_embeddings
        b, length = embeds.shape[:2]
        key_mask = key_mask_from_attention_mask(attention_mask)
        if attention_bias is not None:
            from_bias = key_mask_from_attention_bias(attention_bias, b, length)
            key_mask = from_bias if key_mask is None else key_mask & from_bias
            if bool(key_mask.all()):
                key_mask = None
        positions = self.position_ids(attention_mask, length, b, embeds.device)
        return ModelOutput(logits=self.forward_embeds(embeds, PaddedLayout(positions, key_mask)))


class MMadaModelLM(LLaDAModelLM):
    """MMaDA-8B: LLaDA with the 134656-row vocabulary (text 126464 + 8192 MAGVIT-v2 codes).

    Image understanding (``mmu_generate``) sees image *token ids*: a MAGVIT-v2 code c in
    [0, 8192) becomes id ``c + text_vocab_size`` (126349, the tokenizer length). Running
    MAGVIT-v2 itself is out of scope here: supply its codes and build the prompt with
    :func:`mmada_mmu_input_ids`.
    """

    MMU, SOI, EOI = 126089, 126084, 126085

    @property
    def text_vocab_size(self) -> int:
        return int(self.config.get("text_vocab_size", 126349))

    @property
    def codebook_size(self) -> int:
        return int(self.config.get("codebook_size", 8192))


def mmada_mmu_input_ids(model: MMadaModelLM, image_codes: torch.Tensor, prompt_ids: torch.Tensor) -> torch.Tensor:
    """``[<|mmu|>, <|soi|>, codes + text_vocab, <|eoi|>, prompt...]`` as MMaDA's inference_mmu.py builds it.

    image_codes: int64 ``[B, n_codes]`` MAGVIT-v2 codes in [0, codebook_size) (1024 for 512 px);
    prompt_ids: int64 ``[B, Lp]`` chat-templated prompt (BOS, user header, ..., assistant header).
    """
    if image_codes.dtype != torch.long or prompt_ids.dtype != torch.long:
        raise TypeError("image_codes and prompt_ids must be int64")
    if image_codes.dim() != 2 or prompt_ids.dim() != 2 or image_codes.shape[0] != prompt_ids.shape[0]:
        raise ValueError(
            f"image_codes [B, n] and prompt_ids [B, L] must share B, got {tuple(image_codes.shape)} "
            f"and {tuple(prompt_ids.shape)}"
        )
    if image_codes.numel() and (int(image_codes.min()) < 0 or int(image_codes.max()) >= model.codebook_size):
        raise ValueError(f"image_codes must lie in [0, {model.codebook_size})")
    b = image_codes.shape[0]
    tok = lambda v: torch.full((b, 1), v, dtype=torch.long, device=image_codes.device)  # noqa: E731
    return torch.cat([tok(model.MMU), tok(model.SOI), image_codes + model.text_vocab_size, tok(model.EOI),
                      prompt_ids], dim=1)
