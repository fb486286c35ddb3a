"""DyLLM: saliency-based token selection, cached FFN reuse and partial attention (SPEC.md §2).

Where DyLLM picks its rows: :class:`DyLLMPolicy`. The first ``full_steps`` steps compute
everything (bitwise the baseline's layer) and fill per-layer caches of the rotated keys, the
values, the attention context C (before the output projection) and the FFN output. In a sparse
step the fed rows are packed once (``before_layers``) and every layer computes through a
:class:`SparseLayer` (``adapter.LayerRows``): K/V only for the gating set A (the positions
committed since the request's previous forward at layer 0, the salient set of the layer below
after it), exact attention for A's query rows, partial attention for the others from their
cached context (``seer_kernels.partial_attention``: the paper's ``C + P[:, A] dV``, by default
corrected for the change of A's keys; or exact attention for every row), the new salient set
``cos(C, C_cache) < tau`` (``seer_kernels.cosine_saliency``), and the FFN for the salient rows
only (the others add their cached output). With ``tau > 1`` every row is salient and a sparse
step computes what a dense one does.

Without a prefix cache the prompt is fed only on steps ``t % prompt_period == 0`` (its K/V,
context and FFN output come from the caches otherwise); with one the prompt is never fed. A
forward runs dense while any of its requests has had fewer than ``full_steps`` dense forwards
or has a window longer than its caches (Seer's guard grew it). Classifier-free guidance is not
supported. Statistics: ``stats.extra["dyllm"]``, one record per forward (fed rows, per-layer
gating / salient / exact-attention counts, FFN rows computed and skipped, positions computed,
ideal multiply-accumulates against the dense forward of the same rows) and the totals.
Measurements: bench/RESULTS.md ("DyLLM").
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from seer_kernels import cosine_saliency, exchange_rows, partial_attention, scatter_rows, varlen_attention

from .adapter import PackedLayout, PrefixKV, Taps
from .config import StoredConfig
from .engine import DecodeRun, Forward
from .policy import DecodePolicy

#: tau when ``DyLLMConfig.tau`` is None, per model family (the paper's defaults)
DEFAULT_TAU = {"llada": 0.99, "dream": 0.995}


@dataclass(frozen=True)
class DyLLMConfig(StoredConfig):
    """DyLLM's settings; validated on construction. See the module docstring.

    tau: cosine-similarity threshold, a row is salient when ``cos < tau``; None -> the family
        default (0.99 LLaDA, MMaDA, LaViDa-LLaDA; 0.995 Dream, LaViDa-Dream). ``tau > 1``
        makes every row salient (sparse steps then compute what dense steps compute; said by a
        UserWarning, since a typo for 0.x would otherwise silently cost all the savings).
    full_steps: warm-up steps computed in full (>= 1: the caches must be filled first).
    prompt_period: without a prefix cache, the prompt is fed on steps ``t`` with
        ``t % prompt_period == 0`` and only the window on the others (1: always fed).
    approx_attention: True (the default) approximates the rows outside the gating set from
        their cached context and the salient columns only (``partial_attention``); False gives
        every fed query row exact attention.
    key_correction: with ``approx_attention``, True (the default) also accounts for the change
        of the salient rows' keys (``partial_attention(..., k_old=...)``); False is the paper's
        ``C_cache + P[:, A] @ dV`` verbatim, which accounts for the change of their values only.
    """

    tau: float | None = None
    full_steps: int = 4
    prompt_period: int = 4
    approx_attention: bool = True
    key_correction: bool = True

    def __post_init__(self) -> None:
        if self.tau is not None:
            if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)):
                raise TypeError(f"tau must be a real number or None, got {type(self.tau).__name__}")
            if not math.isfinite(self.tau) or self.tau <= 0:
                raise ValueError(f"tau must be a finite number > 0 (a cosine-similarity threshold), got {self.tau!r}")
            object.__setattr__(self, "tau", float(self.tau))
            if self.tau > 1:  # a deliberate setting (the exactness check), but a typo for 0.x must not pass unsaid
                warnings.warn(f"DyLLMConfig(tau={self.tau}): a cosine similarity is never above 1, so every row is "
                              "salient at every layer: DyLLM then computes what the baseline computes (token for "
                              "token the same output, no saving)", UserWarning, stacklevel=3)
        for name in ("full_steps", "prompt_period"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("approx_attention", "key_correction"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")

    @property
    def attention_mode(self) -> str:
        """``"partial"`` (key-corrected partial attention), ``"paper"`` (the paper's partial
        attention verbatim) or ``"exact"``."""
        if not self.approx_attention:
            return "exact"
        return "partial" if self.key_correction else "paper"

    def tau_for(self, family: str) -> float:
        """The threshold in force for a model ``family`` ("llada" or "dream")."""
        if self.tau is not None:
            return self.tau
        if family not in DEFAULT_TAU:
            raise ValueError(f"no default tau for model family {family!r}; set tau explicitly")
        return DEFAULT_TAU[family]

    @classmethod
    def for_model(cls, model, **changes) -> DyLLMConfig:
        """The defaults for ``model`` with its family's tau filled in (``changes`` override)."""
        family = getattr(model, "family", None)
        if family not in DEFAULT_TAU:
            raise ValueError(f"model family {family!r} has no DyLLM default (known: {sorted(DEFAULT_TAU)})")
        return cls(**{"tau": DEFAULT_TAU[family], **changes})


# ------------------------------------------------------------------------------------ per forward
@dataclass
class SparseMaps:
    """Index maps of a sparse forward's fed rows packed back to back, from host lengths alone;
    built once per layout (rows, window lengths, what is fed) and reused by every step with it.

    Queries (the real fed rows, row-major; ``num_queries`` of them): ``query_src`` flat index into
    the fed hidden ``[R * Lq]``, ``query_row`` the local row, ``query_cache`` the flat index into a
    cache ``[B * Lc]``, ``query_key`` the packed key row of the query's own key. Keys: cache keys
    ``cache_key_src`` -> packed row ``cache_key_dst``; prefix keys ``(prefix_key_row,
    prefix_key_pos)`` -> ``prefix_key_dst``. ``cu_q`` / ``cu_k`` int32 prefix sums, ``max_q`` /
    ``max_k`` / ``num_keys`` host ints, ``positions`` the packed RoPE positions and ``rope`` their
    cos/sin. ``query_key_rows`` is ``query_key`` as int32 (the partial-attention kernel's key rows).

    Contiguous layouts (decided on the host): ``query_range`` ``(start, stop)`` when the queries'
    cache rows are ``query_cache = arange(start, stop)`` (consecutive requests, every fed position
    real, the prompt fed exactly where the caches hold it: ``cached_prompt == offset``), and
    ``key_range`` likewise when the packed keys are the cache rows ``arange(start, stop)`` in
    order (consecutive requests, every cached position real, no prefix cache): the layers then
    read and write those cache rows as slices (views) instead of gathering and scattering them.
    None otherwise."""

    num_queries: int
    query_src: torch.Tensor
    query_row: torch.Tensor
    query_cache: torch.Tensor
    query_key: torch.Tensor
    query_key_rows: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    num_keys: int
    cache_key_src: torch.Tensor
    cache_key_dst: torch.Tensor
    prefix_key_row: torch.Tensor | None
    prefix_key_pos: torch.Tensor | None
    prefix_key_dst: torch.Tensor | None
    positions: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor]
    slots: torch.Tensor  # arange(num_queries): the fixed-capacity row sets' slot numbers
    layer_stats: torch.Tensor  # float64 [layers, 5]: a forward's gating, salient, union, exact rows, MACs
    macs_weights: tuple[float, torch.Tensor, float, float]  # DyLLMPolicy.macs_weights of this layout
    # per layer, the buffers cosine_saliency writes: index int32 [num_queries], count int32 [1],
    # similarity fp32 [num_queries], salient flags bool [num_queries] (views of one [layers, ...]
    # tensor each, made once per layout)
    saliency: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    query_range: tuple[int, int] | None = None
    key_range: tuple[int, int] | None = None
    # the partial-attention context [num_queries, heads, head_dim], written by every sparse layer
    # in turn (each layer's context is used up before the next layer writes it); made on first use
    attention_out: torch.Tensor | None = None


@dataclass
class SparseForward:
    """One forward as DyLLM runs it: ``mode`` "full" (warm-up or rebuild), "prompt" (sparse,
    prompt fed) or "response" (sparse, window only). A sparse one holds its ``maps``, the current
    gating set as a fixed-capacity row set (``gate`` int64 or int32 ``[num_queries]``, its first
    ``gate_count`` entries live, ``gate_count`` an int32 ``[1]`` device tensor: no host read) with
    ``gate_mask`` (bool ``[num_queries]``, the same set as a mask), each layer's gating and salient
    masks (``gate_masks``, ``salient_masks``: counted once after the layer loop, :meth:`DyLLMPolicy.account`)
    and its per-layer statistics on the device (``layer_stats``, its maps' buffer)."""

    rows: list[int]
    index: torch.Tensor
    step: int
    mode: str
    row_key: tuple = ()  # the rows as a tuple (a key part)
    offset: int = 0  # fed prompt positions before the window
    maps_key: tuple | None = None  # the layout its index maps are kept under (decided on the host)
    maps: SparseMaps | None = None
    prefix: PrefixKV | None = None
    gate: torch.Tensor | None = None
    gate_count: torch.Tensor | None = None
    gate_mask: torch.Tensor | None = None
    gate_at: torch.Tensor | None = None  # the gating rows' cache rows (None: from maps.query_cache)
    gate_masks: list[torch.Tensor] = field(default_factory=list)
    salient_masks: list[torch.Tensor] = field(default_factory=list)
    padded_input: torch.Tensor | None = None  # the forward's padded hidden state before packing
    layer_stats: torch.Tensor | None = None


class DyLLMPolicy(DecodePolicy):
    """Saliency-gated sparse steps over per-request caches (see the module docstring)."""

    name = "dyllm"
    packed_layouts = False  # the caches are laid out per padded row

    def __init__(self, config: DyLLMConfig) -> None:
        self.config = config
        self.keys, self.values, self.contexts, self.ffn_outputs = [], [], [], []  # per layer, from on_request
        self._maps: dict[tuple, SparseMaps] = {}
        self._dense_cost: dict[tuple, tuple[float, int]] = {}
        self._flat: dict[tuple[str, int], torch.Tensor] = {}
        self._flat_generation = 0
        self.records: list[dict] = []
        self.current: SparseForward | None = None

    def on_request(self, run: DecodeRun) -> None:
        if run.gen.cfg_scale > 0:
            raise ValueError(f"cfg_scale: DyLLM does not support classifier-free guidance (cfg_scale="
                             f"{run.gen.cfg_scale}); use cfg_scale=0 with dyllm")
        model = run.model
        self.tau = self.config.tau_for(model.family)
        self.cached_prompt = 0 if run.prefix_cache else run.prompt_len  # prompt positions held in the caches
        self.capacity = run.width  # window positions held in the caches
        layers = run.num_layers
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.contexts: list[torch.Tensor | None] = [None] * layers
        self.ffn_outputs: list[torch.Tensor | None] = [None] * layers
        self.dense_forwards = [0] * run.batch_size
        self.valid = [0] * run.batch_size  # window positions covered by valid caches, per request
        self.snapshot = run.tokens.clone()  # the window at each request's previous forward
        self.last_prompt_state: torch.Tensor | None = None  # Dream, no prefix cache: last prompt position's state
        self.dims = {"D": model.hidden_size, "Hd": model.num_heads * model.head_dim,
                     "Hkd": model.num_kv_heads * model.head_dim, "I": model.intermediate_size}
        self.records: list[dict] = []
        self.current: SparseForward | None = None
        self.cache_generation = 0  # bumped whenever the caches are reallocated (graphs read them by address)
        self._flat: dict[tuple[str, int], torch.Tensor] = {}  # flat views of the caches (flat), this generation's
        self._flat_generation = 0
        self._maps: dict[tuple, SparseMaps] = {}  # per layout (SparseForward.maps_key)
        self._dense_cost: dict[tuple, tuple[float, int]] = {}  # (rows, windows) -> dense MACs, tokens

    # -- engine fixed points -------------------------------------------------------------------
    def plan_forward(self, run: DecodeRun, fwd: Forward) -> None:
        self.fit(run.window.longest())
        cfg = self.config
        rows = tuple(fwd.rows)
        lengths = run.window.lengths_of(rows)
        dense_forwards, valid, full_steps = self.dense_forwards, self.valid, cfg.full_steps
        if any(dense_forwards[b] < full_steps or valid[b] < n for b, n in zip(rows, lengths)):  # cold
            mode = "full"
        elif run.prefix_cache:
            mode = "response"  # the prompt is in the prefix cache
        elif fwd.step % cfg.prompt_period == 0:
            mode = "prompt"
        else:
            mode = "response"
            fwd.feed_prompt = False
        plan = self.current = SparseForward(fwd.rows, fwd.index, fwd.step, mode, rows)
        if mode != "full":
            plan.offset = run.prompt_len if mode == "prompt" else 0
            plan.maps_key = (rows, lengths, fwd.width, plan.offset, self.cached_prompt + self.capacity,
                             run.prefix_cache)

    def graph_key(self, run: DecodeRun, fwd: Forward) -> tuple | None:
        """A sparse forward replays per layout and cache generation; warm-up forwards run eagerly."""
        plan = self.current
        return None if plan.mode == "full" else ("dyllm", plan.mode, plan.maps_key, self.cache_generation)

    def before_layers(self, run: DecodeRun, fwd: Forward) -> None:
        plan = self.current
        if plan.mode == "full":
            return
        if fwd.offset != plan.offset:
            raise RuntimeError(f"dyllm planned {plan.offset} prompt positions, the layout fed {fwd.offset}")
        maps = plan.maps = self._sparse_maps(run, plan, fwd)
        self._first_gate(run, plan, fwd)
        plan.layer_stats = maps.layer_stats
        rows, length, dim = fwd.hidden.shape
        plan.padded_input = fwd.hidden
        fwd.hidden = fwd.hidden.reshape(rows * length, dim).index_select(0, maps.query_src)
        fwd.layout = PackedLayout(maps.positions, maps.cu_q, maps.cu_k, maps.max_q, maps.max_k)
        fwd.rope = maps.rope
        plan.prefix, fwd.prefix = fwd.prefix, None  # the sparse layers read the prefix themselves

    def layer_taps(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        if self.current.mode == "full":
            taps.keep_kv = taps.keep_attn_ctx = taps.keep_ffn_out = True
        else:
            taps.rows = SparseLayer(self, run, self.current, layer)

    def after_layer(self, run: DecodeRun, fwd: Forward, layer: int, taps: Taps) -> None:
        if self.current.mode != "full":
            return
        # dense forwards feed [prompt | window] (no prefix cache) or the window: cache coordinates.
        # A window padded past every live position (the router's buckets) keeps only the live part.
        k, v = taps.kv
        rows = len(fwd.rows)
        length = min(k.shape[1], self.cached_prompt + self.capacity)
        for caches, value in ((self.keys, k), (self.values, v), (self.contexts, taps.attn_ctx),
                              (self.ffn_outputs, taps.ffn_out)):
            self._cache(caches, layer, value, run.batch_size)[fwd.index, :length] = value[:rows, :length]

    def after_layers(self, run: DecodeRun, fwd: Forward) -> None:
        plan = self.current
        if plan.mode != "full":  # back to the padded layout: pad rows pass through unchanged
            self.account(plan)
            out = plan.padded_input.clone(memory_format=torch.contiguous_format)
            out.view(-1, out.shape[-1]).index_copy_(0, plan.maps.query_src, fwd.hidden)
            fwd.hidden = out
        if run.logits_shift and not run.prefix_cache:
            if fwd.offset > 0:
                if self.last_prompt_state is None:
                    self.last_prompt_state = fwd.hidden.new_zeros(run.batch_size, fwd.hidden.shape[-1])
                self.last_prompt_state[fwd.index] = fwd.hidden[: len(fwd.rows), fwd.offset - 1]
            elif plan.mode == "response":
                # the state that predicts window position 0 is the last prompt position's, not fed now
                fwd.first_state = self.last_prompt_state[fwd.index].to(fwd.hidden.dtype)
        self.snapshot[plan.index] = run.tokens[plan.index]

    def after_forward(self, run: DecodeRun, fwd: Forward) -> None:
        plan, self.current = self.current, None
        rows, layers = plan.rows, run.num_layers
        # what the baseline would compute for these rows at these window lengths (kept per layout:
        # a replayed step's host work stays a lookup; the windows as they are now: Seer cuts them
        # inside step 0's forward)
        key = (plan.row_key, run.window.lengths_of(rows))
        cost = self._dense_cost.get(key)
        if cost is None:
            tokens = sum(run.window[b] + (0 if run.prefix_cache else run.prompt_lengths[b]) for b in rows)
            cost = self._dense_cost[key] = (self.dense_macs(run, rows) * layers, tokens)
        dense, dense_tokens = cost
        record = {"step": plan.step, "mode": plan.mode, "rows": len(rows), "dense_macs": dense,
                  "tokens_dense": dense_tokens * layers}
        if plan.mode == "full":
            for b in rows:
                self.dense_forwards[b] += 1
                self.valid[b] = run.window[b]
            record.update(fed=dense_tokens, layer_stats=None)
        else:  # the maps' buffer holds this forward's counts (also after a replay): kept, read once in stats()
            maps = self._maps[plan.maps_key]
            record.update(fed=maps.num_queries, layer_stats=maps.layer_stats.clone())
        self.records.append(record)

    def report(self, run: DecodeRun) -> dict:
        return {"dyllm": self.stats(run)}

    def release(self, run: DecodeRun) -> None:
        for caches in (self.keys, self.values, self.contexts, self.ffn_outputs):
            caches[:] = [None] * len(caches)
        self._flat.clear()  # views hold the caches' memory too
        self._maps.clear()
        self._dense_cost.clear()
        self.records, self.current = [], None

    # -- caches --------------------------------------------------------------------------------
    def fit(self, capacity: int) -> None:
        """Resize every cache to ``capacity`` window positions (Seer's cut shrinks, its guard grows)."""
        if capacity == self.capacity:
            return
        keep = self.cached_prompt + min(capacity, self.capacity)
        self.cache_generation += 1
        for caches in (self.keys, self.values, self.contexts, self.ffn_outputs):
            for i, t in enumerate(caches):
                if t is None:
                    continue
                new = t.new_zeros((t.shape[0], self.cached_prompt + capacity, *t.shape[2:]))
                new[:, :keep] = t[:, :keep]
                caches[i] = new
        self.capacity = capacity
        self.valid = [min(v, capacity) for v in self.valid]

    def _cache(self, caches: list, i: int, like: torch.Tensor, batch: int) -> torch.Tensor:
        if caches[i] is None:
            caches[i] = like.new_zeros((batch, self.cached_prompt + self.capacity, *like.shape[2:]))
            self.cache_generation += 1
        return caches[i]

    def flat(self, kind: str, i: int) -> torch.Tensor:
        """Layer ``i``'s cache ``kind`` ("keys", "values", "contexts" or "ffn_outputs") as
        ``[B * Lc, ...]``: a view, made once per cache generation (the sparse layers read and write
        the caches through these every step)."""
        if self._flat_generation != self.cache_generation:
            self._flat.clear()
            self._flat_generation = self.cache_generation
        view = self._flat.get((kind, i))
        if view is None:
            cache = getattr(self, kind)[i]
            view = self._flat[(kind, i)] = cache.view(-1, *cache.shape[2:])
        return view

    # -- the sparse forward's index maps -----------------------------------------------------------
    def _sparse_maps(self, run: DecodeRun, plan: SparseForward, fwd: Forward) -> SparseMaps:
        """The index maps of this forward's layout, built once per layout and kept for the call
        (a call sees few layouts; a captured graph reads the maps of its own)."""
        maps = self._maps.get(plan.maps_key)
        if maps is None:
            maps = self._maps[plan.maps_key] = self._build_maps(run, plan, fwd)
        return maps

    def _build_maps(self, run: DecodeRun, plan: SparseForward, fwd: Forward) -> SparseMaps:
        """Real fed rows packed, keys packed per request; every size is known on the host."""
        dev = run.device
        R = len(plan.rows)
        index = plan.index
        width = fwd.width
        pre, lc = self.cached_prompt, self.cached_prompt + self.capacity
        lengths = [run.window[r] for r in plan.rows]
        prompts = [run.prompt_lengths[r] for r in plan.rows]
        live = run.window.live_mask(index, width)
        pmask = None
        if pre or plan.offset:
            pmask = (run.prompt_mask[index] if run.prompt_mask is not None
                     else torch.ones(R, run.prompt_len, dtype=torch.bool, device=dev))
        fed = torch.cat([pmask, live], dim=1) if plan.offset else live  # [R, Lq]
        lq = fed.shape[1]
        shift = pre - plan.offset  # cache coordinate of fed coordinate p is p + shift
        kc = torch.cat([pmask, live], dim=1) if pre else live  # real cache keys, coordinates [0, pre + width)
        lk = kc.shape[1]
        fed_per_request = [n + (p if plan.offset else 0) for n, p in zip(lengths, prompts)]
        cache_keys_per_request = [n + (p if pre else 0) for n, p in zip(lengths, prompts)]
        prefix_per_request = prompts if fwd.prefix is not None else [0] * R
        keys_per_request = [c + p for c, p in zip(cache_keys_per_request, prefix_per_request)]
        tq, tk = sum(fed_per_request), sum(keys_per_request)
        up = run.device_tensor
        cu_k = up([0, *_cumsum(keys_per_request)])
        np_r = up(prefix_per_request)
        pk_map = cu_k[:-1, None] + np_r[:, None] + kc.long().cumsum(1) - 1  # [R, lk] packed key row
        q_src = torch.nonzero_static(fed.reshape(-1), size=tq).squeeze(1)
        q_row, q_pos = q_src // lq, q_src % lq
        kc_flat = torch.nonzero_static(kc.reshape(-1), size=sum(cache_keys_per_request)).squeeze(1)
        kr, kj = kc_flat // lk, kc_flat % lk
        kp_row = kp_pos = kp_dst = None
        if fwd.prefix is not None:
            kp = fwd.prefix.key_mask if fwd.prefix.key_mask is not None else torch.ones(
                R, fwd.prefix.length, dtype=torch.bool, device=dev)
            kp_flat = torch.nonzero_static(kp.reshape(-1), size=sum(prefix_per_request)).squeeze(1)
            kp_row, kp_pos = kp_flat // kp.shape[1], kp_flat % kp.shape[1]
            kp_dst = cu_k[kp_row] + kp.long().cumsum(1)[kp_row, kp_pos] - 1
        positions = fwd.layout.positions.reshape(-1)[q_src]
        # contiguous layouts, from host lengths alone: consecutive requests whose every position is real
        first = plan.rows[0]
        consecutive = plan.rows == list(range(first, first + R))
        query_range = key_range = None
        if consecutive and shift == 0 and lq == lc and all(n == lq for n in fed_per_request):
            query_range = (first * lc, (first + R) * lc)
        if consecutive and fwd.prefix is None and lk == lc and all(n == lc for n in cache_keys_per_request):
            key_range = (first * lc, (first + R) * lc)
        query_key = pk_map[q_row, q_pos + shift]
        return SparseMaps(
            num_queries=tq, query_src=q_src, query_row=q_row, query_cache=index[q_row] * lc + q_pos + shift,
            query_key=query_key, query_key_rows=query_key.to(torch.int32),
            cu_q=up([0, *_cumsum(fed_per_request)], torch.int32),
            cu_k=up([0, *_cumsum(keys_per_request)], torch.int32), max_q=max(fed_per_request),
            max_k=max(keys_per_request), num_keys=tk, cache_key_src=index[kr] * lc + kj, cache_key_dst=pk_map[kr, kj],
            prefix_key_row=kp_row, prefix_key_pos=kp_pos, prefix_key_dst=kp_dst,
            positions=positions, rope=run.model.rope(positions), slots=torch.arange(tq, device=dev),
            layer_stats=torch.zeros(run.num_layers, 5, dtype=torch.float64, device=dev),
            saliency=list(zip(*(torch.empty(run.num_layers, n, dtype=dtype, device=dev).unbind(0) for n, dtype in
                                ((tq, torch.int32), (1, torch.int32), (tq, torch.float32), (tq, torch.bool))))),
            macs_weights=self.macs_weights(fed_per_request, keys_per_request, up),
            query_range=query_range, key_range=key_range)

    def _first_gate(self, run: DecodeRun, plan: SparseForward, fwd: Forward) -> None:
        """Layer 0's gating set: the positions committed since each request's previous forward
        (every fed row when ``tau > 1``), as a row set of capacity ``num_queries``."""
        maps = plan.maps
        tq = maps.num_queries
        if self.tau > 1:
            plan.gate = maps.slots
            plan.gate_count = torch.full((1,), tq, dtype=torch.int32, device=run.device)
            plan.gate_mask = torch.ones(tq, dtype=torch.bool, device=run.device)
            return
        R, width = len(plan.rows), fwd.width
        lq = plan.offset + width
        qmap = torch.full((R * lq,), -1, dtype=torch.long, device=run.device)
        qmap[maps.query_src] = maps.slots
        win = run.tokens[plan.index, :width]
        mask_id = run.token_ids.mask
        committed = (self.snapshot[plan.index, :width] == mask_id) & (win != mask_id)
        committed &= run.window.live_mask(plan.index, width)
        flat = torch.zeros(R, lq, dtype=torch.bool, device=run.device)
        flat[:, plan.offset:] = committed
        where = _true_positions(flat.reshape(-1), tq)
        plan.gate = qmap[where].clamp(min=0)  # slots past the count: row 0, never read as live
        plan.gate_count = committed.sum().reshape(1).to(torch.int32)
        plan.gate_mask = flat.reshape(-1).index_select(0, maps.query_src)  # the same rows, per slot

    def pack(self, cache: torch.Tensor, prefix: torch.Tensor | None, maps: SparseMaps) -> torch.Tensor:
        """Keys (or values) of the forward packed per request: ``[prefix keys, cache keys]``;
        ``cache`` flat ``[B * Lc, ...]`` (:meth:`flat`). A contiguous layout's keys are a view of
        the cache (``SparseMaps.key_range``)."""
        if maps.key_range is not None:
            return cache[maps.key_range[0]: maps.key_range[1]]
        part = cache.index_select(0, maps.cache_key_src)
        if prefix is None:
            return part  # no prefix: the cache keys are the packed keys, in order
        out = part.new_empty((maps.num_keys, *part.shape[1:]))
        out.index_copy_(0, maps.cache_key_dst, part)
        out.index_copy_(0, maps.prefix_key_dst, prefix[maps.prefix_key_row, :, maps.prefix_key_pos])
        return out

    # -- statistics ----------------------------------------------------------------------------
    def dense_macs(self, run: DecodeRun, rows: list[int]) -> float:
        """Multiply-accumulates of one dense layer over ``rows`` as the baseline engine feeds them."""
        d = self.dims
        per_row = d["D"] * d["Hd"] * 2 + 2 * d["D"] * d["Hkd"] + 3 * d["D"] * d["I"]
        total = 0.0
        for b in rows:
            nk = run.prompt_lengths[b] + run.window[b]
            n = run.window[b] if run.prefix_cache else nk
            total += n * per_row + 2.0 * n * nk * d["Hd"]
        return total

    def account(self, plan: SparseForward) -> None:
        """The sparse layers' counts and ideal multiply-accumulates into ``plan.layer_stats``
        ``[layers, 5]`` (on the device), all layers at once after the loop: per layer the gating
        and salient rows (``plan.gate_masks`` / ``plan.salient_masks``, bool ``[num_queries]``
        each), their union, the rows with exact attention, and the MACs of :meth:`macs_weights`."""
        maps = plan.maps
        base, per_gate, gate_squared, per_salient = maps.macs_weights
        gate, salient = torch.stack(plan.gate_masks), torch.stack(plan.salient_masks)  # [L, Tq]
        cols = torch.stack([gate, salient, gate | salient], dim=2).to(torch.float64)  # [L, Tq, 3]
        per_request = cols.new_zeros(cols.shape[0], len(plan.rows), 3).index_add_(1, maps.query_row, cols)
        totals = per_request.sum(dim=1)  # [L, 3]
        gating = per_request[:, :, 0]
        macs = base + (gating * (per_gate - gate_squared * gating)).sum(dim=1) + per_salient * totals[:, 1]
        exact = totals[:, 0] if self.config.approx_attention else totals.new_full((cols.shape[0],), maps.num_queries)
        plan.layer_stats.copy_(torch.stack([totals[:, 0], totals[:, 1], totals[:, 2], exact, macs], dim=1))

    def macs_weights(self, nq: list[int], nk: list[int], upload) -> tuple[float, torch.Tensor, float, float]:
        """The ideal MACs of a sparse layer as ``base + sum_r a_r (per_gate_r - gate_squared a_r)
        + per_salient * b`` for ``a_r`` gating rows of request r and ``b`` salient rows in all
        (built once per layout). Per request with ``nq`` fed rows and ``nk`` keys: Q for every row
        and K/V for the gating ones; ``QK^T`` over every (query, key) pair (the normaliser needs
        them all); ``P @ V`` over every key for the exact rows and over the gating keys for the
        others (three times that with the key correction: scores against the old keys and a
        ``P[:, A] @ V_old``); the FFN for the salient rows. With partial attention the exact rows
        are the gating ones; with exact attention every row is exact."""
        d = self.dims
        hd = d["Hd"]
        base = sum(q * (2 * d["D"] * hd) + q * k * hd for q, k in zip(nq, nk))
        if self.config.approx_attention:
            cost = 3 if self.config.attention_mode == "partial" else 1
            per_gate = [2 * d["D"] * d["Hkd"] + k * hd + q * cost * hd for q, k in zip(nq, nk)]
            gate_squared = float(cost * hd)
        else:
            base += sum(q * k * hd for q, k in zip(nq, nk))
            per_gate, gate_squared = [2 * d["D"] * d["Hkd"]] * len(nq), 0.0
        return float(base), upload(per_gate, torch.float64), gate_squared, float(3 * d["D"] * d["I"])

    def stats(self, run: DecodeRun) -> dict:
        """Totals over the run plus one record per forward (see the module docstring); the
        per-layer counts the sparse forwards kept on the device are read here, once."""
        layers = run.num_layers
        sparse_stats = [r["layer_stats"] for r in self.records if r["layer_stats"] is not None]
        read = torch.stack(sparse_stats).tolist() if sparse_stats else []
        recs, k = [], 0
        for r in self.records:
            fed = r["fed"]
            if r["layer_stats"] is None:
                gating = salient = union = exact = [fed] * layers
                macs = r["dense_macs"]
            else:
                per_layer = read[k]
                k += 1
                gating, salient, union, exact = ([int(row[j]) for row in per_layer] for j in range(4))
                macs = sum(row[4] for row in per_layer)
            recs.append({
                "step": r["step"], "mode": r["mode"], "rows": r["rows"], "fed": fed,
                "salient_fraction": [x / fed if fed else 0.0 for x in salient],
                "gating": gating,
                "attn_exact": exact, "attn_approx": [fed - e for e in exact],
                "ffn_computed": salient, "ffn_skipped": [fed - x for x in salient],
                "tokens_computed": sum(union), "tokens_dense": r["tokens_dense"],
                "macs": macs, "dense_macs": r["dense_macs"],
            })
        sparse = [r for r in recs if r["mode"] != "full"]
        fed = sum(r["fed"] for r in sparse)
        per_layer = [sum(r["ffn_computed"][layer] for r in sparse) / fed if fed else None for layer in range(layers)]
        fed_sparse = fed * layers
        dense_macs = sum(r["dense_macs"] for r in recs)
        return {
            "tau": self.tau,
            "full_steps": self.config.full_steps,
            "prompt_period": self.config.prompt_period,
            "approx_attention": self.config.approx_attention,
            "key_correction": self.config.key_correction,
            "forwards": {m: sum(r["mode"] == m for r in recs) for m in ("full", "prompt", "response")},
            "salient_fraction": (sum(sum(r["ffn_computed"]) for r in sparse) / fed_sparse) if fed_sparse else None,
            "salient_fraction_per_layer": per_layer,
            "ffn_computed": sum(sum(r["ffn_computed"]) for r in recs),
            "ffn_skipped": sum(sum(r["ffn_skipped"]) for r in recs),
            "attn_exact": sum(sum(r["attn_exact"]) for r in recs),
            "attn_approx": sum(sum(r["attn_approx"]) for r in recs),
            "tokens_computed": sum(r["tokens_computed"] for r in recs),
            "tokens_computed_dense": sum(r["tokens_dense"] for r in recs),
            "ideal_flop_ratio": (sum(r["macs"] for r in recs) / dense_macs) if dense_macs else None,
            "macs": sum(r["macs"] for r in recs),
            "dense_macs": dense_macs,
            "steps": recs,
        }


def _cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out


def _true_positions(mask: torch.Tensor, size: int) -> torch.Tensor:
    """int64 ``[size]``: the positions of the True entries of the 1-D bool ``mask`` in order, then
    zeros (``nonzero_static`` with a fill of 0, from a scan and a scatter: capturable in a graph)."""
    n = mask.numel()
    rank = torch.cumsum(mask, 0) - 1
    slot = torch.where(mask & (rank < size), rank, size)  # everything else lands in a spare slot
    out = torch.zeros(size + 1, dtype=torch.long, device=mask.device)
    out.scatter_(0, slot, torch.arange(n, device=mask.device))
    return out[:size]


class SparseLayer:
    """One layer of a sparse forward (``adapter.LayerRows``): the gating set's K/V into the
    caches, partial (or exact) attention, the salient set, and the FFN of the salient rows. Row
    sets are fixed-capacity index buffers with a device count, so nothing is read on the host."""

    def __init__(self, policy: DyLLMPolicy, run: DecodeRun, plan: SparseForward, layer: int) -> None:
        self.policy, self.run, self.plan, self.layer = policy, run, plan, layer
        self.kv_index, self.kv_count = plan.gate, plan.gate_count
        self._context_before: torch.Tensor | None = None
        self._gate_mask: torch.Tensor | None = None  # bool [num_queries]: the gating rows
        self._salient: tuple[torch.Tensor, torch.Tensor] | None = None
        self._salient_mask: torch.Tensor | None = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        maps = plan.maps
        gate, count, num_q = plan.gate, plan.gate_count, maps.num_queries
        key_cache, value_cache = policy.flat("keys", i), policy.flat("values", i)
        at = plan.gate_at if plan.gate_at is not None else _cache_rows(maps, gate)
        # the gating rows' new K/V into the caches, the values' change (V_new - V_old) and the previous
        # keys out (index maps built here: no checks)
        dv = exchange_rows(value_cache, at, count, v, delta=True, check=False)
        if policy.config.attention_mode == "partial":  # the keys before the update (key-corrected attention)
            k_old = exchange_rows(key_cache, at, count, k, check=False)
        else:
            k_old = None
            scatter_rows(key_cache, at, count, k, check=False)
        prefix_k = prefix_v = None
        if plan.prefix is not None:
            prefix_k, prefix_v = plan.prefix.keys[i], plan.prefix.values[i]
        keys, values = policy.pack(key_cache, prefix_k, maps), policy.pack(value_cache, prefix_v, maps)
        contexts = policy.flat("contexts", i)
        # [Tq, H*d]; with a contiguous layout a view, read (here and in ffn_index) before ffn_index writes it
        self._context_before = _query_rows(maps, contexts)
        heads, d = q.shape[1], q.shape[2]
        self._gate_mask = plan.gate_mask
        if policy.config.approx_attention:  # the gating rows' queries get exact attention
            key_rows = maps.query_key_rows.index_select(0, gate)
            cached = self._context_before.view(num_q, heads, d)
            if maps.attention_out is None:
                maps.attention_out = torch.zeros_like(q)
            ctx = partial_attention(q, keys, values, cached, dv, maps.cu_q, maps.cu_k, maps.max_q, maps.max_k,
                                    self._gate_mask, key_rows, count, k_old=k_old, out=maps.attention_out,
                                    check=False)
        else:
            ctx = varlen_attention(q, keys, values, maps.cu_q, maps.cu_k, maps.max_q, maps.max_k)
        return ctx

    def ffn_index(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        policy, plan, i = self.policy, self.plan, self.layer
        maps = plan.maps
        index, count, similarity, salient = maps.saliency[i]  # this layer's buffers: no allocation per step
        # slots past the count hold row 0 (never live): the row set is a valid index_select index;
        # ``salient`` flags the rows the index names (NaN similarity: salient)
        cosine_saliency(ctx, self._context_before, policy.tau, out_index=index, out_count=count,
                        out_similarity=similarity, out_salient=salient, index_pad=0, check=False)
        self._salient = (index, count)
        self._salient_mask = salient
        contexts = policy.flat("contexts", i)
        if maps.query_range is not None:
            _query_rows(maps, contexts).copy_(ctx)
        else:
            contexts.index_copy_(0, maps.query_cache, ctx)
        return self._salient

    def ffn_output(self, out: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        maps = plan.maps
        ffn_cache = policy.flat("ffn_outputs", i)
        salient, count = self._salient
        at = _cache_rows(maps, salient)
        scatter_rows(ffn_cache, at, count, out, check=False)
        plan.gate_masks.append(self._gate_mask)
        plan.salient_masks.append(self._salient_mask)
        # the salient set gates the next layer (its cache rows too)
        plan.gate, plan.gate_count, plan.gate_at = salient, count, at
        plan.gate_mask = self._salient_mask
        return _query_rows(maps, ffn_cache)


def _query_rows(maps: SparseMaps, cache: torch.Tensor) -> torch.Tensor:
    """The queries' rows of a flat cache ``[B * Lc, ...]`` in query order: a view (slice) with a
    contiguous layout (``SparseMaps.query_range``), a gathered copy otherwise."""
    if maps.query_range is not None:
        return cache[maps.query_range[0]: maps.query_range[1]]
    return cache.index_select(0, maps.query_cache)


def _cache_rows(maps: SparseMaps, slots: torch.Tensor) -> torch.Tensor:
    """The cache rows (flat ``[B * Lc]`` coordinates) of the query ``slots``."""
    if maps.query_range is not None:
        return slots + maps.query_range[0] if maps.query_range[0] else slots
    return maps.query_cache.index_select(0, slots)
