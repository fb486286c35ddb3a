"""The adapter surface every model here implements (``seer_runtime.adapter.DiffusionAdapter``).

:class:`DiffusionDecoder` is the base class of the LLaDA-family and Dream-family language models.
It holds no parameters of its own: subclasses build the exact Hugging Face module tree and tell
the base class where the embedding, the blocks, the final norm and the LM head live. The engine
drives a model only through the methods below, so it never sees a module name:

==============================  ===========================================================
``token_ids``                   mask / EOS / end-of-turn / pad ids (:class:`TokenIds`)
``logits_shift``                0: position i predicts token i (LLaDA); 1: i predicts i+1 (Dream)
``position_ids(mask)``          the family's RoPE positions for a left-padded ``[B, L]`` mask
``embed(ids)``                  token embeddings ``[..., D]``
``embed_prompt(...)``           a request's prompt embeddings (text; images for a DMLLM)
``layer(i, hidden, layout)``    one block; ``taps`` asks for MLP sparsity, K/V, context, FFN output,
                                or restricts the rows it computes (DyLLM)
``block(i)``                    the block's sub-steps (norms, projections, MLP pieces)
``head(hidden)``                final norm + LM head -> logits in the model dtype
``prefill(embeds, ...)``        prompt K/V computed once (:class:`PrefixKV`) + final hidden
==============================  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from seer_runtime.adapter import PackedLayout, PaddedLayout, PrefixKV, Taps, TokenIds

from .common import block_forward, rope_cos_sin


@dataclass
class ModelOutput:
    """What the Hugging Face-style ``forward`` returns: ``.logits`` ``[B, L, V]`` in the model dtype."""

    logits: torch.Tensor


class DiffusionDecoder(nn.Module):
    """Base class: the engine-facing pieces of a masked-diffusion transformer LM.

    Subclasses set in ``__init__``: ``family`` ("llada" | "dream"), ``logits_shift``,
    ``token_ids``, ``rope_theta``, ``rope_full_precision``, ``num_heads``, ``num_kv_heads``,
    ``head_dim``, ``hidden_size``, ``intermediate_size``, ``config`` (the raw config dict), and
    implement ``_embedding()``, ``_blocks()``, ``_final_norm()`` and ``_lm_head_weight()``.
    """

    family: str
    logits_shift: int
    token_ids: TokenIds
    rope_theta: float
    rope_full_precision: bool
    is_multimodal: bool = False

    # -- structure supplied by subclasses -------------------------------------------------------
    def _embedding(self) -> nn.Embedding:
        raise NotImplementedError

    def _blocks(self) -> nn.ModuleList:
        raise NotImplementedError

    def _final_norm(self) -> nn.Module:
        raise NotImplementedError

    def _lm_head_weight(self) -> torch.Tensor:
        raise NotImplementedError

    # -- generic properties ----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self._embedding().weight.dtype

    @property
    def num_layers(self) -> int:
        return len(self._blocks())

    @property
    def vocab_size(self) -> int:
        """Number of logit columns (rows of the LM head), which may exceed the tokenizer's size."""
        return self._lm_head_weight().shape[0]

    def block(self, i: int) -> nn.Module:
        """Block ``i``, exposing ``attn_norm``, ``project_qkv``, ``project_out``, ``ffn_norm``,
        ``mlp_gate_up`` and ``mlp_down`` (the sub-steps DyLLM runs on subsets of rows)."""
        return self._blocks()[i]

    # -- positions --------------------------------------------------------------------------------
    def position_ids(self, attention_mask: torch.Tensor | None, length: int, batch: int,
                     device: torch.device) -> torch.Tensor:
        """RoPE positions for a left-padded ``[B, L]`` sequence, as the family's reference does.

        LLaDA: implicit ``0..L-1`` whatever the padding (its attention is relative, so a uniform
        shift changes nothing but rounding). Dream: ``cumsum(mask) - 1`` with pads at 1 when
        some row is padded, ``0..L-1`` otherwise (``generation_utils._sample``).
        """
        base = torch.arange(length, device=device).expand(batch, length)
        if self.family == "llada" or attention_mask is None or bool(attention_mask.all()):
            return base
        pos = attention_mask.long().cumsum(-1) - 1
        return pos.masked_fill(attention_mask == 0, 1)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos/sin for ``positions [...]`` -> ``[..., head_dim]``."""
        return rope_cos_sin(positions, self.head_dim, self.rope_theta)

    # -- the pieces the engine drives -----------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., D]`` for int64 ids (no scaling: neither family scales)."""
        return self._embedding()(input_ids)

    def embed_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     images=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt embeddings ``[B, Lp, D]`` and mask; text-only models take no images."""
        if images is not None:
            raise ValueError(f"images were given, but {type(self).__name__} is a text-only model")
        return self.embed(input_ids), attention_mask

    def layer(
        self,
        i: int,
        hidden: torch.Tensor,
        layout: PaddedLayout | PackedLayout,
        *,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        prefix: PrefixKV | None = None,
        taps: Taps | None = None,
    ) -> torch.Tensor:
        """Run block ``i`` on ``hidden`` ([B, L, D] padded or [T, D] packed).

        rope: precomputed ``self.rope(layout.positions)`` (pass it to avoid recomputing per layer).
        prefix: a prompt cache; its layer-``i`` keys/values are attended to before this forward's.
        """
        cos, sin = rope if rope is not None else self.rope(layout.positions)
        prefix_kv = None
        if prefix is not None:
            if isinstance(layout, PaddedLayout):
                prefix_kv = (prefix.keys[i].transpose(1, 2), prefix.values[i].transpose(1, 2))
            else:
                prefix_kv = prefix.packed(i)
        return block_forward(
            self.block(i), hidden, layout, cos, sin,
            rope_full_precision=self.rope_full_precision, prefix_kv=prefix_kv, taps=taps,
        )

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: ``[..., D] -> [..., V]`` logits in the model dtype."""
        return nn.functional.linear(self._final_norm()(hidden), self._lm_head_weight())

    def forward_embeds(
        self,
        embeds: torch.Tensor,
        layout: PaddedLayout | PackedLayout,
        *,
        prefix: PrefixKV | None = None,
    ) -> torch.Tensor:
        """All layers then the head: logits for every position of ``embeds``."""
        rope = self.rope(layout.positions)
        hidden = embeds
        for i in range(self.num_layers):
            hidden = self.layer(i, hidden, layout, rope=rope, prefix=prefix)
        return self.head(hidden)

    @torch.no_grad()
    def prefill(
        self,
        embeds: torch.Tensor,
        key_mask: torch.Tensor | None,
        positions: torch.Tensor,
    ) -> tuple[PrefixKV, torch.Tensor]:
        """Compute a prompt's K/V once (bidirectional among prompt tokens only, as LaViDa does).

        embeds [B, Lp, D], key_mask [B, Lp] bool or None, positions [B, Lp].
        Returns the cache (rotated keys, values; ``[B, Hk, Lp, d]`` per layer) and the final
        hidden state ``[B, Lp, D]`` (LaViDa-Dream reads its first response token from it).
        """
        layout = PaddedLayout(positions=positions, key_mask=key_mask)
        rope = self.rope(positions)
        keys, values = [], []
        hidden = embeds
        for i in range(self.num_layers):
            taps = Taps(keep_kv=True)
            hidden = self.layer(i, hidden, layout, rope=rope, taps=taps)
            k, v = taps.kv
            keys.append(k.transpose(1, 2).contiguous())
            values.append(v.transpose(1, 2).contiguous())
        return PrefixKV(keys, values, key_mask, embeds.shape[1]), hidden


def config_value(config: dict, key: str, default: Any = None) -> Any:
    """``config[key]``, or ``default`` when the key is absent or null (as Hugging Face configs write it)."""
    value = config.get(key, default)
    return default if value is None else value


def token_ids_from_config(config: dict, defaults: TokenIds) -> TokenIds:
    """The special ids a ``config.json`` names (``mask_token_id``, ``eos_token_id``, ...), the
    family's published ones where it names none."""
    return TokenIds(
        mask=int(config_value(config, "mask_token_id", defaults.mask)),
        eos=int(config_value(config, "eos_token_id", defaults.eos)),
        eot=int(config_value(config, "eot_token_id", defaults.eot)),
        pad=int(config_value(config, "pad_token_id", defaults.pad)),
        bos=int(config_value(config, "bos_token_id", defaults.bos)),
    )


def key_mask_from_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A 2-D 0/1 attention mask -> bool key mask, or None when nothing is padded."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be 2-D [batch, length], got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    return None if bool(mask.all()) else mask
