"""DyLLM: saliency-based token selection, cached FFN reuse and partial attention (the DyLLM paper,
arXiv 2603.08026, and its authors' code, younjoo0614/DyLLM).

Where DyLLM picks its rows: :class:`DyLLMPolicy`. The first ``full_steps`` steps compute
everything (bitwise the baseline's layer) and fill per-layer caches of the rotated keys, the
values, the attention context C (before the output projection) and the FFN output. In a sparse
step the fed rows are packed once (``sparse.build_maps``) and every layer computes through a
:class:`SparseLayer` (``adapter.LayerRows``): K/V only for the gating set A (the positions
committed since the request's previous forward at layer 0, the salient set of the layer below
after it), exact attention for A's query rows, partial attention for the others from their
cached context (``seer_kernels.partial_attention``: the paper's ``C + P[:, A] dV``, by default
corrected for the change of A's keys; or exact attention for every row), the new salient set
``cos(C, C_cache) < tau`` (``seer_kernels.cosine_saliency``), and the FFN for the salient rows
only (the others add their cached output). With ``tau > 1`` every row is salient and a sparse
step computes what a dense one does.

Without a prefix cache the prompt is fed only on steps with ``(t + 1) % prompt_period == 0`` and the
steps ``t < prompt_period`` (its K/V, context and FFN output come from the caches otherwise); with
one the prompt is never fed. A
forward runs dense while any of its requests has had fewer than ``full_steps`` dense forwards
or has a window longer than its caches (Seer's guard grew it). Classifier-free guidance is not
supported. Statistics: ``stats.extra["dyllm"]``, one record per forward (fed rows, per-layer
gating / salient / exact-attention counts, FFN rows computed and skipped, positions computed,
ideal multiply-accumulates against the dense forward of the same rows) and the totals.
Measurements: bench/RESULTS.md ("DyLLM").

Modules: ``config`` (:class:`DyLLMConfig`), ``policy`` (:class:`DyLLMPolicy`: what a forward
feeds and computes), ``sparse`` (a sparse forward's layout and :class:`SparseLayer`), ``caches``
(the per-layer caches), ``accounting`` (the statistics).
"""

from __future__ import annotations

from .config import DEFAULT_TAU, DyLLMConfig
from .policy import DyLLMPolicy
from .sparse import SparseForward, SparseLayer, SparseMaps

__all__ = ["DEFAULT_TAU", "DyLLMConfig", "DyLLMPolicy", "SparseForward", "SparseLayer", "SparseMaps"]
