"""Fast-dLLM's block caches (``GenerationConfig.block_cache``): keys and values reused within a block.

Where a block's first step runs in full and its later steps run on part of the sequence:
:class:`BlockCachePolicy` (``execute``). The first step of a request's block (and any step
after its window changed) runs the engine's padded forward over the whole sequence and keeps
every layer's rotated keys and values of every position. Its later steps feed only a span of the
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
from .engine import DecodeRun, Forward
from .policy import DecodePolicy

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


class BlockCachePolicy(DecodePolicy):
    """Per-block key/value caches (module docstring); ``mode`` "prefix" or "dual"."""

    name = "block_cache"
    packed_layouts = False

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"block_cache must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self._layouts: dict[tuple, SpanLayout] = {}

    def on_request(self, run: DecodeRun) -> None:
        if run.rules.family != "llada":
            raise ValueError("block_cache is implemented for the LLaDA family (LLaDA, MMaDA, LaViDa-LLaDA): a Dream "
                             "window position reads the previous position's state, which a cached span does not feed")
        others = [p.name for p in run.policies if p is not self and p.runs_forwards]
        if others or any(p.name == "dyllm" for p in run.policies):
            raise ValueError(f"block_cache runs the step's forwards itself: it composes with neither DyLLM (its own "
                             f"caches) nor a policy that runs forwards ({others or ['dyllm']})")
        self.keys = [None] * run.num_layers
        self.values = [None] * run.num_layers
        self.filled: list[tuple | None] = [None] * run.batch_size  # (block, window) each request's cache holds
        self._layouts = {}
        self._filling = False
        self.forwards = {"full": 0, "cached": 0}
        self.fed_positions = {"full": 0, "cached": 0}
        if run.prefix_cache:  # the prompt's keys/values come from the prompt cache, once
            for i in range(run.num_layers):
                self._store(run, i, run.prefix.keys[i].transpose(1, 2), run.prefix.values[i].transpose(1, 2),
                            rows=None, start=0)

    # -- the step ----------------------------------------------------------------------------------
    def execute(self, run: DecodeRun, rows: list[int], step: int) -> torch.Tensor | None:
        blocks = {r: (run.plans[r].block_starts[step], run.plans[r].block_ends[step]) for r in rows}
        first = [r for r in rows if self.filled[r] != (blocks[r], run.window[r])]
        later = [r for r in rows if r not in first]
        parts: dict[int, torch.Tensor] = {}
        if first:
            self._filling = True
            try:
                logits = run.forward(first, step)
            finally:
                self._filling = False
            for r in first:  # the window as it is now (Seer cuts inside step 0)
                self.filled[r] = (blocks[r], run.window[r])
            parts.update(zip(first, logits))
            self.forwards["full"] += 1
        if later:
            parts.update(zip(later, self._cached_forward(run, later, step, blocks)))
            self.forwards["cached"] += 1
        width = max(t.shape[0] for t in parts.values())
        any_part = next(iter(parts.values()))
        out = any_part.new_zeros((len(rows), width, any_part.shape[-1]))
        for i, r in enumerate(rows):
            out[i, : parts[r].shape[0]] = parts[r]
        return out

    # -- the first step of a block: keep every layer's keys and values -----------------------------
    def graph_key(self, run: DecodeRun, fwd: Forward) -> tuple | None:
        return None if self._filling else ()  # a block's first step fills the caches: eager

    def layer_taps(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        if self._filling:
            taps.keep_kv = True

    def after_layer(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        if not self._filling:
            return
        k, v = taps.kv  # [R, L, Hk, d], rotated; the prompt first unless the prompt cache holds it
        self._store(run, layer, k, v, rows=fwd.index, start=0 if fwd.offset else run.prompt_len)
        self.fed_positions["full"] += k.shape[0] * k.shape[1] if layer == 0 else 0

    def _store(self, run: DecodeRun, layer: int, k: torch.Tensor, v: torch.Tensor, *, rows, start: int) -> None:
        if self.keys[layer] is None:
            shape = (run.batch_size, run.prompt_len + run.width, *k.shape[2:])
            self.keys[layer], self.values[layer] = k.new_zeros(shape), v.new_zeros(shape)
        n = min(k.shape[1], run.prompt_len + run.width - start)
        for cache, value in ((self.keys[layer], k), (self.values[layer], v)):
            if rows is None:
                cache[:, start: start + n] = value[:, :n]
            else:
                cache[rows, start: start + n] = value[: rows.shape[0], :n]

    # -- a later step: the span fed, everything else from the caches ---------------------------------
    def _span(self, run: DecodeRun, r: int, block: tuple[int, int]) -> tuple[int, int]:
        start, end = block
        return (start, run.window[r]) if self.mode == "prefix" else (start, end)

    def _layout(self, run: DecodeRun, rows: list[int], blocks: dict) -> SpanLayout:
        spans = [self._span(run, r, blocks[r]) for r in rows]
        key = (tuple(rows), tuple(spans), tuple(run.window[r] for r in rows))
        layout = self._layouts.get(key)
        if layout is not None:
            return layout
        lp = run.prompt_len
        width = max(e - s for s, e in spans)
        fed, fed_mask, kept, kept_mask = [], [], [], []
        for r, (s, e) in zip(rows, spans):
            fed.append([min(s + j, e - 1) for j in range(width)])
            fed_mask.append([j < e - s for j in range(width)])
            prompt = list(range(lp - run.prompt_lengths[r], lp))  # the real prompt positions (left padding)
            window = [lp + p for p in range(run.window[r]) if not s <= p < e]
            kept.append(prompt + window)
        kept_len = max(len(k) for k in kept)
        for k in kept:
            kept_mask.append([True] * len(k) + [False] * (kept_len - len(k)))
            k.extend([k[-1] if k else 0] * (kept_len - len(k)))
        up = run.device_tensor
        index = run.row_index(rows)
        fed_t = torch.stack([up(f) for f in fed])
        positions = run.positions[index].gather(1, fed_t + lp)
        layout = SpanLayout(spans, fed_t, torch.stack([up([int(m) for m in f], torch.bool) for f in fed_mask]),
                            positions, torch.stack([up(k) for k in kept]),
                            torch.stack([up([int(m) for m in k], torch.bool) for k in kept_mask]))
        if len(self._layouts) >= 16:  # spans change once per block: keep the table small
            self._layouts.clear()
        self._layouts[key] = layout
        return layout

    def _kept_kv(self, run: DecodeRun, rows: list[int], layout: SpanLayout) -> PrefixKV:
        """Every layer's kept keys/values of ``rows`` (``[R, Hk, Lk, d]``), gathered once per layout:
        the caches change only at a block's first step, which changes the layout too."""
        if layout.prefix is None:
            index = run.row_index(rows)
            flat = (index[:, None] * (run.prompt_len + run.width) + layout.kept).reshape(-1)
            keys, values = [], []
            for k, v in zip(self.keys, self.values):
                shape = (len(rows), layout.kept.shape[1], *k.shape[2:])
                keys.append(k.reshape(-1, *k.shape[2:]).index_select(0, flat).view(shape).transpose(1, 2))
                values.append(v.reshape(-1, *v.shape[2:]).index_select(0, flat).view(shape).transpose(1, 2))
            layout.prefix = PrefixKV(keys, values, layout.key_mask, layout.kept.shape[1])
        return layout.prefix

    def _cached_forward(self, run: DecodeRun, rows: list[int], step: int, blocks: dict) -> list[torch.Tensor]:
        layout = self._layout(run, rows, blocks)
        index = run.row_index(rows)
        width = layout.fed.shape[1]
        fwd = Forward(rows, index, step, width, feed_prompt=False)
        fwd.prefix = self._kept_kv(run, rows, layout)
        fwd.layout = PaddedLayout(layout.positions, torch.cat([layout.key_mask, layout.fed_mask], dim=1))
        fwd.lengths = [e - s for s, e in layout.spans]
        fwd.positions = len(rows) * width
        self.fed_positions["cached"] += fwd.positions

        def compute() -> torch.Tensor:
            fwd.hidden = run.model.embed(run.tokens[index].gather(1, layout.fed))
            run.run_forward(fwd)
            return run.check_logits(run.model.head(fwd.hidden))

        key = run.forward_key(fwd, "block_cache", self.mode, tuple(layout.spans))
        span_logits = run.finish_forward(fwd, run.run_keyed(key, rows, compute))
        out = []
        for i, (r, (s, e)) in enumerate(zip(rows, layout.spans)):
            full = span_logits.new_zeros((run.window[r], span_logits.shape[-1]))
            full[s:e] = span_logits[i, : e - s]
            out.append(full)
        return out

    def report(self, run: DecodeRun) -> dict:
        return {"block_cache": {"mode": self.mode, "forwards": dict(self.forwards),
                                "fed_positions": dict(self.fed_positions)}}

    def release(self, run: DecodeRun) -> None:
        self.keys, self.values, self._layouts = [], [], {}
