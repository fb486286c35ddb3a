"""Fast-dLLM's block caches (``GenerationConfig.block_cache``): keys and values reused within a block.

Where a block's first step runs in full and its later steps run on part of the sequence:
:meth:`BlockCacheLayouts.forwards`, a way the model runner lays a step out. The first step of a
request's block (and any step after its window changed) runs the padded forward over the whole
sequence and keeps every layer's rotated keys and values of every position. Its later steps feed only a span of the
window and attend to the kept keys/values of everything else:

* ``"prefix"``: the span is the block and what follows it (the keys/values before the block
  come from the block's first step: Fast-dLLM's ``generate_with_prefix_cache``);
* ``"dual"``: the span is the block alone (those after it come from the first step too:
  ``generate_with_dual_cache``).

With the LaViDa prompt cache (``prefix_cache``) the prompt's keys/values are the prompt cache's.
It is an approximation, as in Fast-dLLM: a kept key/value is the one of the block's first step.
The LLaDA family only (a Dream window position reads the previous position's state, which a
span does not feed); neither DyLLM (its own caches) nor the router (its own forwards) composes
with it. Requests at different blocks decode together: the first steps of blocks run as one
padded forward, the later ones as another. Statistics: ``stats.extra["block_cache"]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .adapter import PaddedLayout, PrefixKV, Taps
from .batch import BatchState
from .policy import LayerHook
from .runner import Forward, padded_forward

MODES = ("prefix", "dual")


@dataclass
class SpanLayout:
    """A cached forward's layout, built once per (rows, spans, windows): the fed positions
    ``fed`` (int64 ``[R, L]``, clamped), which are real (``fed_mask``), their RoPE positions, the
    kept keys' cache positions ``kept`` (int64 ``[R, Lk]``, clamped) and which are real, and the
    kept keys/values gathered per layer (``prefix``, built at its first use)."""

    spans: list[tuple[int, int]]
    fed: torch.Tensor
    fed_mask: torch.Tensor
    positions: torch.Tensor
    kept: torch.Tensor
    key_mask: torch.Tensor
    prefix: PrefixKV | None = None


class BlockCacheLayouts:
    """Per-block key/value caches (module docstring); ``mode`` "prefix" or "dual"."""

    name = "block_cache"
    fuses_choice = False  # a step may run two forwards

    def __init__(self, mode: str, state: BatchState, model) -> None:
        if mode not in MODES:
            raise ValueError(f"block_cache must be one of {MODES}, got {mode!r}")
        if state.rules.family != "llada":
            raise ValueError("block_cache is implemented for the LLaDA family (LLaDA, MMaDA, LaViDa-LLaDA): a Dream "
                             "window position reads the previous position's state, which a cached span does not feed")
        self.mode, self.model = mode, model
        self.keys: list[torch.Tensor | None] = [None] * model.num_layers
        self.values: list[torch.Tensor | None] = [None] * model.num_layers
        self.filled: list[tuple | None] = [None] * state.batch_size  # (block, window) each request's cache holds
        self._layouts: dict[tuple, SpanLayout] = {}
        self._step: tuple = ()  # this step's (first rows, later rows, blocks, span layout)
        self.forwards_run = {"full": 0, "cached": 0}
        self.fed_positions = {"full": 0, "cached": 0}
        if state.prefix_cache:  # the prompt's keys/values come from the prompt cache, once
            for i in range(model.num_layers):
                self._store(state, i, state.prefix.keys[i].transpose(1, 2), state.prefix.values[i].transpose(1, 2),
                            rows=None, start=0)

    # -- the step ----------------------------------------------------------------------------------
    def forwards(self, state: BatchState, rows: list[int], step: int) -> list[Forward]:
        """A padded forward of the rows at their block's first step (filling the caches), and a
        cached-span forward of the others."""
        blocks = {r: (state.plans[r].block_starts[step], state.plans[r].block_ends[step]) for r in rows}
        first = [r for r in rows if self.filled[r] != (blocks[r], state.window[r])]
        later = [r for r in rows if r not in first]
        out = []
        if first:
            fwd = padded_forward(state, first, step)
            fwd.keyed, fwd.layer_hook = False, _Fill(self, state)  # a block's first step fills the caches: eager
            out.append(fwd)
            self.forwards_run["full"] += 1
        layout = None
        if later:
            layout = self._layout(state, later, blocks)
            out.append(self._cached_forward(state, later, step, layout))
            self.forwards_run["cached"] += 1
        self._step = (first, later, blocks, layout)
        return out

    def merge(self, state: BatchState, rows: list[int], forwards: list[Forward], logits: list[torch.Tensor]):
        """The step's logits ``[R, W, V]``, a later row's outside its span zero."""
        first, later, blocks, layout = self._step
        parts: dict[int, torch.Tensor] = {}
        if first:
            for r in first:  # the window as it is now (Seer cuts inside step 0)
                self.filled[r] = (blocks[r], state.window[r])
            parts.update(zip(first, logits[0]))
        if later:
            span_logits = logits[-1]
            for i, (r, (s, e)) in enumerate(zip(later, layout.spans)):
                full = span_logits.new_zeros((state.window[r], span_logits.shape[-1]))
                full[s:e] = span_logits[i, : e - s]
                parts[r] = full
        width = max(t.shape[0] for t in parts.values())
        any_part = next(iter(parts.values()))
        out = any_part.new_zeros((len(rows), width, any_part.shape[-1]))
        for i, r in enumerate(rows):
            out[i, : parts[r].shape[0]] = parts[r]
        return out

    # -- the first step of a block: keep every layer's keys and values -----------------------------
    def _store(self, state: BatchState, layer: int, k: torch.Tensor, v: torch.Tensor, *, rows, start: int) -> None:
        if self.keys[layer] is None:
            shape = (state.batch_size, state.prompt_len + state.width, *k.shape[2:])
            self.keys[layer], self.values[layer] = k.new_zeros(shape), v.new_zeros(shape)
        n = min(k.shape[1], state.prompt_len + state.width - start)
        for cache, value in ((self.keys[layer], k), (self.values[layer], v)):
            if rows is None:
                cache[:, start: start + n] = value[:, :n]
            else:
                cache[rows, start: start + n] = value[: rows.shape[0], :n]

    # -- a later step: the span fed, everything else from the caches ---------------------------------
    def _span(self, state: BatchState, r: int, block: tuple[int, int]) -> tuple[int, int]:
        start, end = block
        return (start, state.window[r]) if self.mode == "prefix" else (start, end)

    def _layout(self, state: BatchState, rows: list[int], blocks: dict) -> SpanLayout:
        spans = [self._span(state, r, blocks[r]) for r in rows]
        key = (tuple(rows), tuple(spans), state.window.lengths_of(rows))
        layout = self._layouts.get(key)
        if layout is not None:
            return layout
        lp = state.prompt_len
        width = max(e - s for s, e in spans)
        fed, fed_mask, kept, kept_mask = [], [], [], []
        for r, (s, e) in zip(rows, spans):
            fed.append([min(s + j, e - 1) for j in range(width)])
            fed_mask.append([j < e - s for j in range(width)])
            prompt = list(range(lp - state.prompt_lengths[r], lp))  # the real prompt positions (left padding)
            window = [lp + p for p in range(state.window[r]) if not s <= p < e]
            kept.append(prompt + window)
        kept_len = max(len(k) for k in kept)
        for k in kept:
            kept_mask.append([True] * len(k) + [False] * (kept_len - len(k)))
            k.extend([k[-1] if k else 0] * (kept_len - len(k)))
        up = state.device_tensor
        index = state.row_index(rows)
        fed_t = torch.stack([up(f) for f in fed])
        positions = state.positions[index].gather(1, fed_t + lp)
        layout = SpanLayout(spans, fed_t, torch.stack([up([int(m) for m in f], torch.bool) for f in fed_mask]),
                            positions, torch.stack([up(k) for k in kept]),
                            torch.stack([up([int(m) for m in k], torch.bool) for k in kept_mask]))
        if len(self._layouts) >= 16:  # spans change once per block: keep the table small
            self._layouts.clear()
        self._layouts[key] = layout
        return layout

    def _kept_kv(self, state: BatchState, rows: list[int], layout: SpanLayout) -> PrefixKV:
        """Every layer's kept keys/values of ``rows`` (``[R, Hk, Lk, d]``), gathered once per layout:
        the caches change only at a block's first step, which changes the layout too."""
        if layout.prefix is None:
            index = state.row_index(rows)
            flat = (index[:, None] * (state.prompt_len + state.width) + layout.kept).reshape(-1)
            keys, values = [], []
            for k, v in zip(self.keys, self.values):
                shape = (len(rows), layout.kept.shape[1], *k.shape[2:])
                keys.append(k.reshape(-1, *k.shape[2:]).index_select(0, flat).view(shape).transpose(1, 2))
                values.append(v.reshape(-1, *v.shape[2:]).index_select(0, flat).view(shape).transpose(1, 2))
            layout.prefix = PrefixKV(keys, values, layout.key_mask, layout.kept.shape[1])
        return layout.prefix

    def _cached_forward(self, state: BatchState, rows: list[int], step: int, layout: SpanLayout) -> Forward:
        index = state.row_index(rows)
        width = layout.fed.shape[1]
        fwd = Forward(rows, index, step, width, feed_prompt=False, positions=len(rows) * width,
                      lengths=[e - s for s, e in layout.spans], kind="block_cache",
                      detail=(self.mode, tuple(layout.spans)))
        fwd.prefix = self._kept_kv(state, rows, layout)
        fwd.layout = PaddedLayout(layout.positions, torch.cat([layout.key_mask, layout.fed_mask], dim=1))
        self.fed_positions["cached"] += fwd.positions

        def build(f: Forward) -> None:
            f.hidden = self.model.embed(state.tokens[index].gather(1, layout.fed))

        fwd.build, fwd.head = build, lambda f: self.model.head(f.hidden)
        return fwd

    def report(self) -> dict:
        return {"block_cache": {"mode": self.mode, "forwards": dict(self.forwards_run),
                                "fed_positions": dict(self.fed_positions)}}

    def release(self) -> None:
        self.keys, self.values, self._layouts = [], [], {}


class _Fill(LayerHook):
    """A block's first step: every layer's rotated keys and values of every position kept."""

    def __init__(self, layouts: BlockCacheLayouts, state: BatchState) -> None:
        self.layouts, self.state = layouts, state

    def taps(self, layer: int, taps: Taps) -> None:
        taps.keep_kv = True

    def after(self, layer: int, fwd: Forward, taps: Taps) -> None:
        k, v = taps.kv  # [R, L, Hk, d], rotated; the prompt first unless the prompt cache holds it
        self.layouts._store(self.state, layer, k, v, rows=fwd.index, start=0 if fwd.offset else self.state.prompt_len)
        self.layouts.fed_positions["full"] += k.shape[0] * k.shape[1] if layer == 0 else 0
