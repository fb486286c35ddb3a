"""Where DyLLM picks its rows: :class:`DyLLMPolicy` (the ``dyllm`` package's docstring)."""

from __future__ import annotations

import torch

from ..adapter import PackedLayout, Taps
from ..batch import BatchState
from ..policy import LayerHook, Policy
from ..runner import Forward
from .accounting import DyLLMAccounting
from .caches import KINDS, DyLLMCaches
from .config import DyLLMConfig
from .sparse import SparseForward, SparseLayer, SparseMaps, build_maps, first_gate


class DyLLMPolicy(Policy):
    """Saliency-gated sparse steps over per-request caches (the package docstring)."""

    name = "dyllm"
    packed_layouts = False  # the caches are laid out per padded row
    block_caches = False  # its own caches
    guidance = False

    def __init__(self, config: DyLLMConfig) -> None:
        self.config = config
        self.caches: DyLLMCaches | None = None
        self.accounting: DyLLMAccounting | None = None
        self._maps: dict[tuple, SparseMaps] = {}
        self.current: SparseForward | None = None

    def start(self, state: BatchState, model) -> None:
        self.model, self.logits_shift = model, int(model.logits_shift)
        self.tau = self.config.tau_for(model.family)
        # the caches hold the prompt's positions unless the prefix cache does, and the window
        self.caches = DyLLMCaches(int(model.num_layers), cached_prompt=0 if state.prefix_cache else state.prompt_len,
                                  capacity=state.width)
        self.accounting = DyLLMAccounting(self.config, model)
        self.dense_forwards = [0] * state.batch_size
        self.valid = [0] * state.batch_size  # window positions covered by valid caches, per request
        self.snapshot = state.tokens.clone()  # the window at each request's previous forward
        self.last_prompt_state: torch.Tensor | None = None  # Dream, no prefix cache: last prompt position's state
        self.current = None
        self._maps = {}  # per layout (SparseForward.maps_key)

    def plan(self, state: BatchState, fwd: Forward) -> tuple | None:
        """What the forward computes (full, or sparse with or without the prompt); a sparse forward
        replays per layout and cache generation, warm-up forwards run eagerly."""
        if self.caches.fit(state.window.longest()):  # Seer's cut shrinks them, its guard grows them
            self.valid = [min(v, self.caches.capacity) for v in self.valid]
        cfg = self.config
        rows = tuple(fwd.rows)
        lengths = state.window.lengths_of(rows)
        dense_forwards, valid, full_steps = self.dense_forwards, self.valid, cfg.full_steps
        if any(dense_forwards[b] < full_steps or valid[b] < n for b, n in zip(rows, lengths)):  # cold
            mode = "full"
        elif state.prefix_cache:
            mode = "response"  # the prompt is in the prefix cache
        elif (fwd.step + 1) % cfg.prompt_period == 0 or fwd.step < cfg.prompt_period:  # the authors' phase
            mode = "prompt"
        else:
            mode = "response"
            fwd.feed_prompt = False
        plan = self.current = SparseForward(fwd.rows, fwd.index, fwd.step, mode, rows)
        if mode == "full":
            return None
        plan.offset = state.prompt_len if mode == "prompt" else 0
        plan.maps_key = (rows, lengths, fwd.width, plan.offset, self.caches.cached_prompt + self.caches.capacity,
                         state.prefix_cache)
        return ("dyllm", plan.mode, plan.maps_key, self.caches.generation)

    def layers(self, state: BatchState, fwd: Forward) -> LayerHook:
        return _DenseFill(self, state) if self.current.mode == "full" else _SparseLayers(self, state)

    def _pack(self, state: BatchState, fwd: Forward) -> None:
        """A sparse forward's fed rows packed back to back, its first gating set."""
        plan = self.current
        if fwd.offset != plan.offset:
            raise RuntimeError(f"dyllm planned {plan.offset} prompt positions, the layout fed {fwd.offset}")
        maps = self._maps.get(plan.maps_key)  # built once per layout, kept for the call (a graph reads its own)
        if maps is None:
            maps = self._maps[plan.maps_key] = build_maps(
                state, plan, fwd, cached_prompt=self.caches.cached_prompt, capacity=self.caches.capacity,
                model=self.model, macs_weights=self.accounting.macs_weights)
        plan.maps = maps
        first_gate(state, plan, fwd, tau=self.tau, snapshot=self.snapshot)
        plan.layer_stats = maps.layer_stats
        rows, length, dim = fwd.hidden.shape
        plan.padded_input = fwd.hidden
        fwd.hidden = fwd.hidden.reshape(rows * length, dim).index_select(0, maps.query_src)
        fwd.layout = PackedLayout(maps.positions, maps.cu_q, maps.cu_k, maps.max_q, maps.max_k)
        fwd.rope = maps.rope
        plan.prefix, fwd.prefix = fwd.prefix, None  # the sparse layers read the prefix themselves

    def _fill(self, state: BatchState, fwd: Forward, layer: int, taps: Taps) -> None:
        """A dense forward's layer into the caches: it feeds [prompt | window] (no prefix cache) or
        the window, in cache coordinates; a window padded past every live position (the router's
        buckets) keeps only the live part."""
        k, v = taps.kv
        rows = len(fwd.rows)
        length = min(k.shape[1], self.caches.cached_prompt + self.caches.capacity)
        for kind, value in zip(KINDS, (k, v, taps.attn_ctx, taps.ffn_out)):
            self.caches.layer(kind, layer, value, state.batch_size)[fwd.index, :length] = value[:rows, :length]

    def _end(self, state: BatchState, fwd: Forward) -> None:
        """After the layer loop: the padded layout back, the window's snapshot; Dream's state before the window."""
        plan = self.current
        if plan.mode != "full":  # back to the padded layout: pad rows pass through unchanged
            self.accounting.account(plan)
            out = plan.padded_input.clone(memory_format=torch.contiguous_format)
            out.view(-1, out.shape[-1]).index_copy_(0, plan.maps.query_src, fwd.hidden)
            fwd.hidden = out
        if self.logits_shift and not state.prefix_cache:
            if fwd.offset > 0:
                if self.last_prompt_state is None:
                    self.last_prompt_state = fwd.hidden.new_zeros(state.batch_size, fwd.hidden.shape[-1])
                self.last_prompt_state[fwd.index] = fwd.hidden[: len(fwd.rows), fwd.offset - 1]
            elif plan.mode == "response":
                # the state that predicts window position 0 is the last prompt position's, not fed now
                fwd.first_state = self.last_prompt_state[fwd.index].to(fwd.hidden.dtype)
        self.snapshot[plan.index] = state.tokens[plan.index]

    def after_forward(self, state: BatchState, fwd: Forward) -> None:
        plan, self.current = self.current, None
        self.accounting.record(state, plan, None if plan.mode == "full" else self._maps[plan.maps_key], fwd)
        if plan.mode == "full":
            for b in plan.rows:
                self.dense_forwards[b] += 1
                self.valid[b] = state.window[b]

    def report(self, state: BatchState) -> dict:
        return {"dyllm": self.accounting.stats(self.tau)}

    def saved_positions(self, state: BatchState) -> tuple[int, list[int]]:
        return self.accounting.saved(state.batch_size)

    def release(self) -> None:
        if self.caches is not None:
            self.caches.release()
        self._maps.clear()
        self.accounting, self.current = None, None


class _DenseFill(LayerHook):
    """A warm-up (or rebuild) forward: dense, every layer's K/V, context and FFN output cached."""

    def __init__(self, policy: DyLLMPolicy, state: BatchState) -> None:
        self.policy, self.state = policy, state

    def taps(self, layer: int, taps: Taps) -> None:
        taps.keep_kv = taps.keep_attn_ctx = taps.keep_ffn_out = True

    def after(self, layer: int, fwd: Forward, taps: Taps) -> None:
        self.policy._fill(self.state, fwd, layer, taps)

    def end(self, fwd: Forward) -> None:
        self.policy._end(self.state, fwd)


class _SparseLayers(_DenseFill):
    """A sparse forward: the fed rows packed, each layer a :class:`SparseLayer`."""

    def before(self, fwd: Forward) -> None:
        self.policy._pack(self.state, fwd)

    def taps(self, layer: int, taps: Taps) -> None:
        taps.rows = SparseLayer(self.policy, self.state, self.policy.current, layer)

    def after(self, layer: int, fwd: Forward, taps: Taps) -> None:
        return None
