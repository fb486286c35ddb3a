"""Math shared by the LLaDA and Dream families: RMSNorm, rotate-half RoPE, attention per layout,
and the one composition of a pre-norm block that ``forward()``, the engine and DyLLM's sparse
steps use.

A block class only maps names: it implements ``attn_norm``, ``project_qkv`` (and ``project_q``,
``project_kv``), ``project_out``, ``ffn_norm``, ``mlp_gate_up`` and ``mlp_down``
(``seer_runtime.adapter.TransformerBlock``); :func:`block_forward` composes them. So the
Hugging Face calling convention, the engine's layer-by-layer loop and a layer that computes
only some rows (``Taps.rows``) run the same code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import seer_kernels
from seer_kernels.rotary_embedding import apply_rotary
from seer_runtime.adapter import PackedLayout, PaddedLayout, Taps
from seer_runtime.profiling import prange


class RMSNorm(nn.Module):
    """RMSNorm as LLaDA and Dream compute it: in fp32, cast back to the input dtype, then x weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return seer_kernels.rms_norm_reference(x, self.weight, self.eps)

    def rows(self, x: torch.Tensor, index: torch.Tensor | None = None, count=None) -> torch.Tensor:
        """The norm of ``x [N, D]``'s rows, or of the rows ``index[:count]`` names (zero past the
        count), in one launch (``seer_kernels.rms_norm``): for a layer that computes some rows
        (``Taps.rows``). The same values as ``forward`` on the CPU; on a GPU within rounding."""
        return seer_kernels.rms_norm(x, self.weight, self.eps, index=index, count=count, check=False)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin of rotate-half RoPE for int positions ``[...]`` -> ``[..., head_dim]`` each.

    inv_freq = 1 / theta^(2j/d); angles = position * inv_freq, concatenated twice (NeoX layout).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, full_precision: bool) -> torch.Tensor:
    """Rotate ``x [..., tokens, heads, d]`` with ``cos/sin [..., tokens, d]`` (broadcast over heads),
    or ``[..., tokens, 1, d]`` (already broadcastable: a layer unsqueezes once for q and k).

    full_precision=True (LLaDA, ``rope_full_precision``): rotate in fp32, cast back.
    full_precision=False (Dream): cast cos/sin to x's dtype and rotate in that dtype.
    (``seer_kernels.rotary_embedding.apply_rotary``, the reference of the fused row op.)
    """
    if cos.dim() < x.dim():
        cos = cos.unsqueeze(-2)
        sin = sin.unsqueeze(-2)
    return apply_rotary(x, cos, sin, full_precision=full_precision)


def _sdpa_padded(q, k, v, key_mask, scale=None, attn_mask=None):
    """q [B, L, H, d], k/v [B, Lk, Hk, d], key_mask [B, Lk] bool or None -> [B, L, H, d].

    attn_mask (bool [B, 1, L, Lk]) replaces key_mask when given."""
    heads, kv_heads = q.shape[2], k.shape[2]
    q_, k_, v_ = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kv_heads != heads:
        k_ = k_.repeat_interleave(heads // kv_heads, dim=1)
        v_ = v_.repeat_interleave(heads // kv_heads, dim=1)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    if attn_mask is not None:
        mask = attn_mask
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)
    return out.transpose(1, 2)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: PaddedLayout | PackedLayout,
    *,
    prefix_k: torch.Tensor | None = None,
    prefix_v: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional attention of this forward's queries over (prefix keys +) its own keys.

    Padded: q [B, L, H, d], k/v [B, L, Hk, d], prefix_k/v [B, Lp, Hk, d] -> [B, L, H, d].
    Packed: q [T, H, d], k/v [T, Hk, d], prefix_k/v [Tp, Hk, d] packed -> [T, H, d], through
    ``seer_kernels.varlen_attention`` (flash-attention's varlen convention).
    """
    if isinstance(layout, PaddedLayout):
        if prefix_k is not None:
            k = torch.cat([prefix_k, k], dim=1)
            v = torch.cat([prefix_v, v], dim=1)
        return _sdpa_padded(q, k, v, layout.key_mask, attn_mask=layout.attn_mask)
    if prefix_k is not None:
        if layout.key_index is None:
            raise ValueError("a packed layout with a prefix cache needs layout.key_index")
        k = torch.cat([prefix_k, k], dim=0).index_select(0, layout.key_index)
        v = torch.cat([prefix_v, v], dim=0).index_select(0, layout.key_index)
    return seer_kernels.varlen_attention(
        q, k, v, layout.cu_seqlens_q, layout.cu_seqlens_k, layout.max_seqlen_q, layout.max_seqlen_k
    )


def linear(module: nn.Linear, x: torch.Tensor, count: int | torch.Tensor | None = None) -> torch.Tensor:
    """``module(x)``; with ``count``, only the first ``count`` rows of ``x [capacity, K]`` are
    computed (``seer_kernels.row_linear``: the count may stay on the device), the rest are zero."""
    if count is None:
        return module(x)
    return seer_kernels.row_linear(x, module.weight, module.bias, count, check=False)  # rows the engine built


def linear_pair(module_a: nn.Linear, module_b: nn.Linear, x: torch.Tensor,
                count: int | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(module_a(x), module_b(x))``; with ``count``, both of the first ``count`` rows of ``x
    [capacity, K]`` in one launch (``seer_kernels.row_linear_pair``; K and V, gate and up), the
    rest zero."""
    if count is None:
        return module_a(x), module_b(x)
    return seer_kernels.row_linear_pair(x, module_a.weight, module_a.bias, module_b.weight, module_b.bias, count,
                                        check=False)  # rows the engine built


def swiglu(gate: torch.Tensor, up: torch.Tensor, taps: Taps | None) -> torch.Tensor:
    """silu(gate) * up, measuring its sparsity in the same pass when a tap asks for it."""
    if taps is not None and taps.mlp_sparsity_eps is not None:
        act, sparsity = seer_kernels.swiglu_sparsity(gate, up, taps.mlp_sparsity_eps)
        taps.mlp_sparsity = sparsity
    else:
        act = F.silu(gate) * up
    if taps is not None and taps.keep_mlp_act:
        taps.mlp_act = act
    return act


def block_forward(
    block: nn.Module,
    hidden: torch.Tensor,
    layout: PaddedLayout | PackedLayout,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rope_full_precision: bool,
    prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    taps: Taps | None = None,
) -> torch.Tensor:
    """One pre-norm block: x + attn(attn_norm(x)); x + mlp(ffn_norm(x)).

    hidden [B, L, D] (padded) or [T, D] (packed); cos/sin fp32 for the query positions, shaped
    like hidden without its last dim plus head_dim. prefix_kv: this layer's cached prefix
    (rotated keys, values) in the layout's form. With ``taps.rows`` (packed hidden only) K/V are
    projected for ``rows.kv_index`` alone, ``rows.attend`` replaces the attention core, and the
    FFN runs for the rows ``rows.ffn_index(ctx)`` names alone (``seer_runtime.adapter.LayerRows``;
    row sets are fixed-capacity index buffers with a count that may stay on the device); such a
    layer norms and rotates with the fused row ops (``block.row_norms()``' ``rows``,
    ``seer_kernels.rotary_embedding``: the same values on the CPU, within rounding on a GPU).
    Returns the new hidden state, same shape.
    """
    rows = taps.rows if taps is not None else None
    if rows is not None and (taps.mlp_sparsity_eps is not None or taps.keep_mlp_act):
        raise ValueError("taps cannot be served on a layer that computes only some rows (taps.rows): "
                         "the MLP activation exists for those rows only")
    if rows is None:
        x_n = block.attn_norm(hidden)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [..., tokens, 1, d]: broadcast over heads, for q and k
        q, k, v = block.project_qkv(x_n)
        k = apply_rope(k, cos, sin, full_precision=rope_full_precision)
        q = apply_rope(q, cos, sin, full_precision=rope_full_precision)
    else:  # K/V of the first kv_count rows of kv_index only (a fixed-capacity row set); fused norms and RoPE
        attn_norm, ffn_norm = block.row_norms()
        x_n = attn_norm.rows(hidden)
        index, count = rows.kv_index, rows.kv_count
        # the K/V rows normed by index (the rows of x_n, without a gather and its buffer)
        k, v = block.project_kv(attn_norm.rows(hidden, index, count), count=count)
        k = seer_kernels.rotary_embedding(k, cos, sin, full_precision=rope_full_precision, index=index, count=count,
                                          check=False)
        q = seer_kernels.rotary_embedding(block.project_q(x_n), cos, sin, full_precision=rope_full_precision,
                                          check=False)
    if taps is not None and taps.keep_kv:
        taps.kv = (k, v)
    if rows is None:
        pk, pv = prefix_kv if prefix_kv is not None else (None, None)
        ctx = attention(q, k, v, layout, prefix_k=pk, prefix_v=pv)
    else:
        ctx = rows.attend(q, k, v)
    ctx = ctx.reshape(*ctx.shape[:-2], -1)
    if taps is not None and taps.keep_attn_ctx:
        # a row set's attend may return a buffer the next layer overwrites (LayerRows.attend)
        taps.attn_ctx = ctx if rows is None else ctx.clone()
    hidden = hidden + block.project_out(ctx)
    if rows is None:
        gate, up = block.mlp_gate_up(block.ffn_norm(hidden))
        ffn = block.mlp_down(swiglu(gate, up, taps))
    else:
        index, count = rows.ffn_index(ctx)
        with prange("dyllm/ffn_rows"):  # the FFN of the salient rows alone
            gate, up = block.mlp_gate_up(ffn_norm.rows(hidden, index, count), count=count)
            ffn = rows.ffn_output(block.mlp_down(swiglu(gate, up, None), count=count))
    if taps is not None and taps.keep_ffn_out:
        taps.ffn_out = ffn
    return hidden + ffn
