"""The contract between the decoding engine and a model adapter (README, "Layout").

The engine owns the layer loop; a model exposes itself in pieces (:class:`DiffusionAdapter`)
and is driven with the small value types below. This module is the only place the contract is
stated; it imports nothing but torch, so a model definition can import it without loading
the engine.

* :class:`TokenIds` - the special token ids, and :data:`IMAGE_TOKEN_INDEX`, the placeholder a
  multimodal prompt carries where its image features go;
* :class:`PaddedLayout` / :class:`PackedLayout` - how the batch is laid out for one forward;
* :class:`PrefixKV` - keys/values of a prompt computed once (LaViDa's prefix-DLM cache);
* :class:`Taps` - what a policy asks a layer for (Seer: MLP activation sparsity; DyLLM: the
  K/V, attention context and FFN output, or which rows to compute, :class:`LayerRows`),
  without the layer knowing which policy asked;
* :class:`TransformerBlock` / :class:`DiffusionAdapter` - the methods a block and a model
  implement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

#: the prompt id LLaVA-style models (LaViDa) put where an image's features are spliced in
IMAGE_TOKEN_INDEX = -200


@dataclass(frozen=True)
class TokenIds:
    """Special token ids of a model family (each family's ``tokenizer_config.json``); ``image`` is the prompt
    placeholder of image features (multimodal models only)."""

    mask: int
    eos: int
    eot: int
    pad: int
    bos: int | None = None
    image: int = IMAGE_TOKEN_INDEX

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Ids that end an answer: EOS and end-of-turn."""
        return (self.eos, self.eot) if self.eot != self.eos else (self.eos,)


@dataclass
class PaddedLayout:
    """A ``[B, L]`` batch: hidden states ``[B, L, D]``.

    positions: int64 ``[B, L]`` RoPE positions of the query tokens.
    key_mask:  bool ``[B, Lk]`` (True = a real key) over the keys this forward attends to,
               ``Lk = prefix length + L``; ``None`` when nothing is padded.
    attn_mask: optional bool ``[B, 1, L, Lk]`` (True = may attend) replacing ``key_mask``, for
               masks that differ per query, e.g. a prefix-LM mask in training.
    """

    positions: torch.Tensor
    key_mask: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.positions.shape[0]

    @property
    def length(self) -> int:
        return self.positions.shape[1]


@dataclass
class PackedLayout:
    """Sequences packed back to back: hidden states ``[T, D]`` (flash-attention varlen convention).

    positions:     int64 ``[T]`` RoPE positions of the packed query tokens.
    cu_seqlens_q:  int32 ``[B+1]`` exclusive prefix sums of the query lengths.
    cu_seqlens_k:  int32 ``[B+1]`` the same for the keys (prefix + queries of each sequence).
    max_seqlen_q / max_seqlen_k: host ints, upper bounds of the per-sequence lengths.
    key_index:     int64 ``[Tk]`` or None. With a prefix cache, the keys of sequence b are its
                   cached prefix followed by its own tokens; ``key_index`` gathers them from
                   ``cat([prefix_packed, current_packed])``. None when there is no prefix.
    """

    positions: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    key_index: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.cu_seqlens_q.numel() - 1


@dataclass
class PrefixKV:
    """Per-layer keys and values of a prompt prefix, computed once before denoising.

    keys[i], values[i]: ``[B, Hk, Lp, head_dim]``, keys already rotated (RoPE applied at their
    positions). LLaDA's LaViDa fork stores keys before RoPE and re-rotates them every step;
    rotating once at the same positions gives the same numbers (RoPE of a key depends only on
    its own position), so one post-RoPE form serves both families.
    key_mask: bool ``[B, Lp]`` (True = a real prefix token), None when no row is padded.
    real_index: int64 ``[sum Lp_b]``, the flat indices (into ``B * Lp``) of the real prefix
    tokens in order, when the caller knows how many there are (the engine does, from the prompt
    lengths): packing then reads nothing back. None: found from ``key_mask`` (a host read).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor | None
    length: int
    real_index: torch.Tensor | None = None

    def packed(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s real prefix keys/values packed back to back: ``[sum Lp_b, Hk, d]``."""
        k = self.keys[layer].transpose(1, 2)
        v = self.values[layer].transpose(1, 2)
        k, v = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        if self.key_mask is None:
            return k, v
        if self.real_index is None:
            self.real_index = self.key_mask.reshape(-1).nonzero().squeeze(1)
        return k.index_select(0, self.real_index), v.index_select(0, self.real_index)

    def select(self, rows: torch.Tensor, *, real_tokens: int | None = None) -> PrefixKV:
        """The cache restricted to batch rows ``rows`` (int64 index tensor); ``real_tokens``: how
        many real prefix tokens those rows hold (lets :meth:`packed` read nothing back)."""
        mask = real_index = None
        if self.key_mask is not None:
            mask = self.key_mask[rows]
            if real_tokens is not None:
                real_index = torch.nonzero_static(mask.reshape(-1), size=real_tokens).squeeze(1)
        return PrefixKV([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values],
                        mask, self.length, real_index)


@runtime_checkable
class LayerRows(Protocol):
    """Which rows of a packed forward ``[T, D]`` a layer computes, and how the others are filled.

    DyLLM's sparse steps hand one to the layer through :attr:`Taps.rows`. A row set is a
    fixed-capacity index buffer (int64 or int32 ``[capacity]``, its first ``count`` entries live, the rest
    any valid row) with ``count`` an int or an int32 ``[1]`` device tensor, so that nothing has to
    be read on the host. The block runs its own sub-steps in this order
    (``model_adapters.common.block_forward``):

    1. Q for every row; K and V only for the row set ``(kv_index, kv_count)``, rotated at their
       positions (``[capacity, Hk, d]``, rows past the count zero);
    2. ``attend(q [T, H, d], k, v) -> ctx [T, H, d]``: the attention core, which may keep cached
       keys/values for the rows outside the set; ``ctx`` may be a buffer that later layers write
       again (DyLLM keeps one per layout), so the block copies it for ``Taps.keep_attn_ctx``;
    3. the output projection and the residual for every row;
    4. ``ffn_index(ctx [T, H*d]) -> (index, count)``: the row set whose FFN is computed;
    5. ``ffn_output(out [capacity, D]) -> [T, D]``: the FFN output of every row (the computed
       ones, and cached outputs for the rest), added to the residual.
    """

    kv_index: torch.Tensor
    kv_count: int | torch.Tensor

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def ffn_index(self, ctx: torch.Tensor) -> tuple[torch.Tensor, int | torch.Tensor]: ...

    def ffn_output(self, out: torch.Tensor) -> torch.Tensor: ...


@dataclass
class Taps:
    """What a policy asks a layer for. Requests are set by the caller, results by the layer.

    mlp_sparsity_eps: when set, the layer measures the per-token fraction of its MLP activation
        (the SwiGLU product, the input of the down projection) with ``|a| < eps`` and stores it
        in ``mlp_sparsity`` (fp32, one value per query token).
    keep_mlp_act / keep_kv / keep_attn_ctx / keep_ffn_out: store the MLP activation, the
        rotated K/V, the attention context (before the output projection, heads concatenated)
        or the FFN output (the down projection's output, before the residual) of this forward.
    rows: compute only some rows (:class:`LayerRows`); the MLP taps cannot be served then.
    """

    mlp_sparsity_eps: float | None = None
    keep_mlp_act: bool = False
    keep_kv: bool = False
    keep_attn_ctx: bool = False
    keep_ffn_out: bool = False
    rows: LayerRows | None = None
    mlp_sparsity: torch.Tensor | None = None
    mlp_act: torch.Tensor | None = None
    kv: tuple[torch.Tensor, torch.Tensor] | None = None
    attn_ctx: torch.Tensor | None = None
    ffn_out: torch.Tensor | None = None

    @property
    def requested(self) -> bool:
        """Whether any request is set (a layer given an empty Taps computes what it does without)."""
        return (self.mlp_sparsity_eps is not None or self.keep_mlp_act or self.keep_kv or self.keep_attn_ctx
                or self.keep_ffn_out or self.rows is not None)


class TransformerBlock(Protocol):
    """The sub-steps of one pre-norm block, composed once by the model (and driven row by row
    through :class:`LayerRows`): ``[..., D]`` in, the shapes in each docstring out."""

    def attn_norm(self, x: torch.Tensor) -> torch.Tensor: ...

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., D] -> ([..., H, d], [..., Hk, d], [..., Hk, d])``."""

    def project_q(self, x: torch.Tensor) -> torch.Tensor: ...

    def project_kv(self, x: torch.Tensor, *, count=None) -> tuple[torch.Tensor, torch.Tensor]:
        """With ``count``, only the first ``count`` rows are computed (the rest zero)."""

    def project_out(self, ctx: torch.Tensor) -> torch.Tensor:
        """``[..., H * d] -> [..., D]``."""

    def ffn_norm(self, x: torch.Tensor) -> torch.Tensor: ...

    def mlp_gate_up(self, x: torch.Tensor, *, count=None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def mlp_down(self, act: torch.Tensor, *, count=None) -> torch.Tensor: ...

    def row_norms(self) -> tuple:
        """The norms ``attn_norm`` and ``ffn_norm`` apply, as modules with ``rows(x, index,
        count)`` (``model_adapters.common.RMSNorm``): a layer that computes some rows norms them
        with one fused op each."""


@runtime_checkable
class DiffusionAdapter(Protocol):
    """What the engine needs from a model (``model_adapters.decoder.DiffusionDecoder`` implements it).

    family: ``"llada"`` or ``"dream"`` (which reference generator the decoding follows);
    is_multimodal: a LaViDa model (images, prefix cache by default); logits_shift: 0 when
    position i predicts token i (LLaDA), 1 when it predicts i + 1 (Dream); the widths (hidden,
    heads, KV heads, head dim, MLP intermediate) size caches, graph buffers and FLOP counts.
    Optional: ``max_sequence_length`` (int or None), the longest prompt + window the model
    takes; ``generate`` rejects longer requests (an adapter without it sets no limit).
    """

    family: str
    is_multimodal: bool
    logits_shift: int
    token_ids: TokenIds
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    @property
    def device(self) -> torch.device: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int64 ids ``[...]`` -> embeddings ``[..., D]``."""

    def embed_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     images=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A left-padded prompt batch (image placeholders spliced) -> ``([B, Lp, D], mask [B, Lp] or None)``."""

    def position_ids(self, attention_mask: torch.Tensor | None, length: int, batch: int,
                     device: torch.device) -> torch.Tensor:
        """The family's RoPE positions ``[B, length]`` for a left-padded mask."""

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos/sin ``[..., head_dim]`` for int positions ``[...]``."""

    def layer(self, i: int, hidden: torch.Tensor, layout: PaddedLayout | PackedLayout, *,
              rope: tuple[torch.Tensor, torch.Tensor] | None = None, prefix: PrefixKV | None = None,
              taps: Taps | None = None) -> torch.Tensor:
        """Block ``i`` on ``[B, L, D]`` (padded) or ``[T, D]`` (packed) hidden states."""

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: ``[..., D] -> [..., V]``."""

    def prefill(self, embeds: torch.Tensor, key_mask: torch.Tensor | None,
                positions: torch.Tensor) -> tuple[PrefixKV, torch.Tensor]:
        """A prompt's K/V computed once, and its final hidden state ``[B, Lp, D]``."""

    def block(self, i: int) -> TransformerBlock: ...


def missing_adapter_members(model) -> list[str]:
    """The members of :class:`DiffusionAdapter` (its attributes, properties and methods) that
    ``model`` lacks: what ``generate`` checks before decoding."""
    members = (n for n, v in vars(DiffusionAdapter).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property)))
    declared = [*DiffusionAdapter.__annotations__, *members]
    return [n for n in dict.fromkeys(declared) if not hasattr(model, n)]
