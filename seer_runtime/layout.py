"""The contract between the decoding engine and a model adapter.

The engine owns the layer loop (DESIGN.md, "The seam"); an adapter exposes its model in pieces
and is driven with these small value types:

* :class:`TokenIds` - the special token ids a decoder needs;
* :class:`PaddedLayout` / :class:`PackedLayout` - how the batch is laid out for one forward;
* :class:`PrefixKV` - keys/values of a prompt computed once (LaViDa's prefix-DLM cache);
* :class:`Taps` - what a policy wants a layer to hand back (MLP activation sparsity for Seer,
  the attention context for DyLLM) without the layer knowing which policy asked.

This module knows nothing of any model's module names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TokenIds:
    """Special token ids of a model family (``reference/MODELS.md``)."""

    mask: int
    eos: int
    eot: int
    pad: int
    bos: int | None = None

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

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


@dataclass
class PrefixKV:
    """Per-layer keys and values of a prompt prefix, computed once before denoising.

    keys[i], values[i]: ``[B, Hk, Lp, head_dim]``, keys already rotated (RoPE applied at their
    positions). LLaDA's LaViDa fork stores keys before RoPE and re-rotates them every step;
    rotating once at the same positions gives the same numbers (RoPE of a key depends only on
    its own position), so one post-RoPE form serves both families.
    key_mask: bool ``[B, Lp]`` (True = a real prefix token), None when no row is padded.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor | None
    length: int

    def packed(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s real prefix keys/values packed back to back: ``[sum Lp_b, Hk, d]``."""
        k = self.keys[layer].transpose(1, 2)
        v = self.values[layer].transpose(1, 2)
        if self.key_mask is None:
            return k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        return k[self.key_mask], v[self.key_mask]

    def select(self, rows: torch.Tensor) -> PrefixKV:
        """The cache restricted to batch rows ``rows`` (int64 index tensor)."""
        mask = None if self.key_mask is None else self.key_mask[rows]
        return PrefixKV([k[rows] for k in self.keys], [v[rows] for v in self.values], mask, self.length)


@dataclass
class Taps:
    """What a policy asks a layer to hand back. Requests are set by the caller, results by the layer.

    mlp_sparsity_eps: when set, the layer measures the per-token fraction of its MLP activation
        (the SwiGLU product, the input of the down projection) with ``|a| < eps`` and stores it
        in ``mlp_sparsity`` (fp32, one value per query token).
    keep_mlp_act / keep_attn_ctx / keep_kv: store the MLP activation, the attention context
        (before the output projection, heads concatenated) or the rotated K/V of this forward.
    """

    mlp_sparsity_eps: float | None = None
    keep_mlp_act: bool = False
    keep_attn_ctx: bool = False
    keep_kv: bool = False
    mlp_sparsity: torch.Tensor | None = None
    mlp_act: torch.Tensor | None = None
    attn_ctx: torch.Tensor | None = None
    kv: tuple[torch.Tensor, torch.Tensor] | None = None
    extra: dict = field(default_factory=dict)
