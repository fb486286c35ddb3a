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
    def max_sequence_length(self) -> int | None:
        """The longest sequence (prompt + response window) the config allows: ``max_sequence_length``
        (LLaDA family) or ``max_position_embeddings`` (Dream family); None when it names neither.
        ``generate`` rejects requests beyond it."""
        value = config_value(self.config, "max_sequence_length") or config_value(self.config, "max_position_embeddings")
        return int(value) if value else None

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


#: Hugging Face ``forward`` keywords accepted at the value that changes nothing (None: the config's default)
NO_OP_KEYWORDS = {"past_key_values": (None,), "use_cache": (None, False), "output_attentions": (None, False),
                  "output_hidden_states": (None, False), "return_dict": (None, True), "labels": (None,)}


def check_forward_keywords(model: nn.Module, extra: dict[str, Any]) -> None:
    """Reject ``forward`` keywords this definition does not implement, by name: a keyword dropped
    silently (a ported call's ``attention_bias``, a cache) would change the result unsaid."""
    name = type(model).__name__
    for key, value in extra.items():
        allowed = NO_OP_KEYWORDS.get(key)
        if allowed is None:
            raise TypeError(f"{name}.forward() got an unsupported keyword argument {key!r}; it takes input_ids, "
                            f"attention_mask and the embeddings keyword, and {sorted(NO_OP_KEYWORDS)} at their "
                            "defaults")
        if not any(value is a for a in allowed):
            hint = ": use model.prefill(...) for a prompt K/V cache" if key in ("past_key_values", "use_cache") else ""
            raise ValueError(f"{key}={value!r} is not supported by {name}.forward (only {allowed}){hint}")


def check_forward_inputs(input_ids: torch.Tensor | None, embeds_name: str, embeds: torch.Tensor | None,
                         attention_mask: torch.Tensor | None) -> None:
    """Exactly one of ``input_ids`` [B, L] int64 or the embeddings [B, L, D]; a 2-D mask shaped [B, L]."""
    if (input_ids is None) == (embeds is None):
        raise ValueError(f"pass exactly one of input_ids and {embeds_name}")
    if input_ids is not None and (not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2
                                  or input_ids.dtype != torch.long):
        raise ValueError(f"input_ids must be an int64 tensor [batch, length], got {_describe_tensor(input_ids)}")
    if embeds is not None and (not isinstance(embeds, torch.Tensor) or embeds.dim() != 3):
        raise ValueError(f"{embeds_name} must be a tensor [batch, length, hidden], got {_describe_tensor(embeds)}")
    shape = tuple((input_ids if input_ids is not None else embeds).shape[:2])
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and tuple(attention_mask.shape) != shape:
        raise ValueError(f"attention_mask must have shape {shape} (batch, length), got {tuple(attention_mask.shape)}")


def _describe_tensor(t: object) -> str:
    return f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def key_mask_from_attention_bias(attention_bias: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """LLaDA's ``attention_bias`` as a bool key mask ``[B, L]`` (True: may be attended to).

    Accepted (``reference/MODELS.md`` §1.3): ``[B or 1, 1, L, L]``, bool / integer (nonzero: may
    attend) or float added to the scores (0: attend; ``-inf`` or below ``finfo.min / 2``: masked),
    as long as it is a padding mask: every query that may attend to itself (a real token) sees
    exactly the keys on the diagonal. That is what MMaDA's ``mmu_generate`` passes (the outer
    product of its padding mask). Any other bias (causal, arbitrary additive) raises ValueError:
    the blocks mask keys only. Padded queries, whose outputs nothing reads, attend to the real keys.
    """
    bias = attention_bias
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"attention_bias must be a tensor, got {type(bias).__name__}")
    if bias.dim() != 4 or bias.shape[1] != 1 or bias.shape[0] not in (1, batch) or bias.shape[2:] != (length, length):
        raise ValueError(f"attention_bias must have shape [{batch} or 1, 1, {length}, {length}], "
                         f"got {tuple(bias.shape)}")
    if bias.is_complex():
        raise TypeError(f"attention_bias must be bool, integer or float, got {bias.dtype}")
    if bias.is_floating_point():
        masked = (bias == float("-inf")) | (bias <= torch.finfo(bias.dtype).min / 2)
        if not bool((masked | (bias == 0)).all()):
            raise ValueError("attention_bias: a float bias must hold only 0 (attend) and -inf or finfo.min (masked); "
                             "other additive biases are not supported")
        allowed = ~masked
    else:
        allowed = bias != 0
    allowed = allowed[:, 0].expand(batch, length, length)
    keys = allowed.diagonal(dim1=-2, dim2=-1)  # [B, L]: the real tokens
    real_rows = allowed[keys]  # the rows of the real queries, each must equal its batch row's key mask
    expected = keys[:, None, :].expand(batch, length, length)[keys]
    if not torch.equal(real_rows, expected):
        raise ValueError("attention_bias is not a padding mask (the outer product of a key mask): causal or "
                         "per-query biases are not supported; pass attention_mask [batch, length] instead")
    return keys
