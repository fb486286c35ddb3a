"""A sparse forward of DyLLM: its fed rows packed back to back (:class:`SparseMaps`, built once per
layout from host lengths alone: :func:`build_maps`), its gating set (:func:`first_gate`), and one
layer computing some rows (:class:`SparseLayer`): the gating set's K/V into the caches, partial (or
exact) attention, the salient set and the FFN of the salient rows. Row sets are fixed-capacity
index buffers with a device count, so nothing is read on the host."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seer_kernels import cosine_saliency, exchange_rows, partial_attention, scatter_rows, varlen_attention

from ..adapter import PrefixKV
from ..batch import BatchState
from ..profiling import prange
from ..runner import Forward


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
    request_rows: torch.Tensor  # float64 [R]: each request's recomputed (union) rows, summed over the layers
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


def build_maps(state: BatchState, plan: SparseForward, fwd: Forward, *, cached_prompt: int, capacity: int, model,
               macs_weights) -> SparseMaps:
    """Real fed rows packed, keys packed per request; every size is known on the host. The caches
    hold ``cached_prompt`` prompt and ``capacity`` window positions per request; ``macs_weights``
    gives the layout's FLOP weights (``DyLLMAccounting.macs_weights``)."""
    dev, R, index, width = state.device, len(plan.rows), plan.index, fwd.width
    pre, lc = cached_prompt, cached_prompt + capacity
    lengths = [state.window[r] for r in plan.rows]
    prompts = [state.prompt_lengths[r] for r in plan.rows]
    live = state.window.live_mask(index, width)
    pmask = None
    if pre or plan.offset:
        pmask = state.prompt_keys(None if state.prompt_mask is None else state.prompt_mask[index], R)
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
    up = state.device_tensor
    cu_k = up([0, *_cumsum(keys_per_request)])
    np_r = up(prefix_per_request)
    pk_map = cu_k[:-1, None] + np_r[:, None] + kc.long().cumsum(1) - 1  # [R, lk] packed key row
    q_src = torch.nonzero_static(fed.reshape(-1), size=tq).squeeze(1)
    q_row, q_pos = q_src // lq, q_src % lq
    kc_flat = torch.nonzero_static(kc.reshape(-1), size=sum(cache_keys_per_request)).squeeze(1)
    kr, kj = kc_flat // lk, kc_flat % lk
    kp_row = kp_pos = kp_dst = None
    if fwd.prefix is not None:  # the prompt cache's real keys, packed in front of each request's
        kp = state.prompt_keys(fwd.prefix.key_mask, R)
        kp_flat = torch.nonzero_static(kp.reshape(-1), size=sum(prefix_per_request)).squeeze(1)
        kp_row, kp_pos = kp_flat // kp.shape[1], kp_flat % kp.shape[1]
        kp_dst = cu_k[kp_row] + kp.long().cumsum(1)[kp_row, kp_pos] - 1
    positions = fwd.layout.positions.reshape(-1)[q_src]
    # contiguous layouts, from host lengths alone: consecutive requests whose every position is real
    first = plan.rows[0]
    rows_range = (first * lc, (first + R) * lc) if plan.rows == list(range(first, first + R)) else None
    every_fed = shift == 0 and lq == lc and all(n == lq for n in fed_per_request)
    every_cached = fwd.prefix is None and lk == lc and all(n == lc for n in cache_keys_per_request)
    query_key = pk_map[q_row, q_pos + shift]
    return SparseMaps(
        num_queries=tq, query_src=q_src, query_row=q_row, query_cache=index[q_row] * lc + q_pos + shift,
        query_key=query_key, query_key_rows=query_key.to(torch.int32),
        cu_q=up([0, *_cumsum(fed_per_request)], torch.int32),
        cu_k=up([0, *_cumsum(keys_per_request)], torch.int32), max_q=max(fed_per_request),
        max_k=max(keys_per_request), num_keys=tk, cache_key_src=index[kr] * lc + kj, cache_key_dst=pk_map[kr, kj],
        prefix_key_row=kp_row, prefix_key_pos=kp_pos, prefix_key_dst=kp_dst,
        positions=positions, rope=model.rope(positions), slots=torch.arange(tq, device=dev),
        layer_stats=torch.zeros(model.num_layers, 5, dtype=torch.float64, device=dev),
        request_rows=torch.zeros(R, dtype=torch.float64, device=dev),
        saliency=list(zip(*(torch.empty(model.num_layers, n, dtype=dtype, device=dev).unbind(0) for n, dtype in
                            ((tq, torch.int32), (1, torch.int32), (tq, torch.float32), (tq, torch.bool))))),
        macs_weights=macs_weights(fed_per_request, keys_per_request, up),
        query_range=rows_range if every_fed else None, key_range=rows_range if every_cached else None)


def first_gate(state: BatchState, plan: SparseForward, fwd: Forward, *, tau: float, snapshot: torch.Tensor) -> None:
    """Layer 0's gating set: the positions committed since each request's previous forward
    (every fed row when ``tau > 1``), as a row set of capacity ``num_queries``."""
    maps = plan.maps
    tq = maps.num_queries
    if tau > 1:
        plan.gate = maps.slots
        plan.gate_count = torch.full((1,), tq, dtype=torch.int32, device=state.device)
        plan.gate_mask = torch.ones(tq, dtype=torch.bool, device=state.device)
        return
    R, width = len(plan.rows), fwd.width
    lq = plan.offset + width
    qmap = torch.full((R * lq,), -1, dtype=torch.long, device=state.device)
    qmap[maps.query_src] = maps.slots
    win = state.tokens[plan.index, :width]
    mask_id = state.token_ids.mask
    committed = (snapshot[plan.index, :width] == mask_id) & (win != mask_id)
    committed &= state.window.live_mask(plan.index, width)
    flat = torch.zeros(R, lq, dtype=torch.bool, device=state.device)
    flat[:, plan.offset:] = committed
    where = _true_positions(flat.reshape(-1), tq)
    plan.gate = qmap[where].clamp(min=0)  # slots past the count: row 0, never read as live
    plan.gate_count = committed.sum().reshape(1).to(torch.int32)
    plan.gate_mask = flat.reshape(-1).index_select(0, maps.query_src)  # the same rows, per slot


def pack_keys(cache: torch.Tensor, prefix: torch.Tensor | None, maps: SparseMaps) -> torch.Tensor:
    """Keys (or values) of the forward packed per request: ``[prefix keys, cache keys]``;
    ``cache`` flat ``[B * Lc, ...]`` (``DyLLMCaches.flat``). A contiguous layout's keys are a view of
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

    def __init__(self, policy, state: BatchState, plan: SparseForward, layer: int) -> None:
        self.policy, self.state, self.plan, self.layer = policy, state, plan, layer
        self.kv_index, self.kv_count = plan.gate, plan.gate_count
        self._context_before: torch.Tensor | None = None
        self._gate_mask: torch.Tensor | None = None  # bool [num_queries]: the gating rows
        self._salient: tuple[torch.Tensor, torch.Tensor] | None = None
        self._salient_mask: torch.Tensor | None = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with prange("dyllm/attention"):
            return self._attend(q, k, v)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        maps = plan.maps
        gate, count, num_q = plan.gate, plan.gate_count, maps.num_queries
        key_cache, value_cache = policy.caches.flat("keys", i), policy.caches.flat("values", i)
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
        keys, values = pack_keys(key_cache, prefix_k, maps), pack_keys(value_cache, prefix_v, maps)
        contexts = policy.caches.flat("contexts", i)
        # [Tq, H*d]; with a contiguous layout a view, read (here and in ffn_index) before ffn_index writes it
        self._context_before = _query_rows(maps, contexts)
        heads, d = q.shape[1], q.shape[2]
        self._gate_mask = plan.gate_mask
        if policy.config.approx_attention:  # the gating rows' queries get exact attention
            key_rows = maps.query_key_rows.index_select(0, gate)
            cached = self._context_before.view(num_q, heads, d)
            if maps.attention_out is None:
                maps.attention_out = torch.zeros_like(q)
            with prange("dyllm/partial_attention"):
                ctx = partial_attention(q, keys, values, cached, dv, maps.cu_q, maps.cu_k, maps.max_q, maps.max_k,
                                        self._gate_mask, key_rows, count, k_old=k_old, out=maps.attention_out,
                                        check=False)
        else:
            ctx = varlen_attention(q, keys, values, maps.cu_q, maps.cu_k, maps.max_q, maps.max_k)
        return ctx

    def ffn_index(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with prange("dyllm/saliency"):
            return self._ffn_index(ctx)

    def _ffn_index(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        policy, plan, i = self.policy, self.plan, self.layer
        maps = plan.maps
        index, count, similarity, salient = maps.saliency[i]  # this layer's buffers: no allocation per step
        # slots past the count hold row 0 (never live): the row set is a valid index_select index;
        # ``salient`` flags the rows the index names (NaN similarity: salient)
        cosine_saliency(ctx, self._context_before, policy.tau, out_index=index, out_count=count,
                        out_similarity=similarity, out_salient=salient, index_pad=0, check=False)
        self._salient = (index, count)
        self._salient_mask = salient
        contexts = policy.caches.flat("contexts", i)
        if maps.query_range is not None:
            _query_rows(maps, contexts).copy_(ctx)
        else:
            contexts.index_copy_(0, maps.query_cache, ctx)
        return self._salient

    def ffn_output(self, out: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        maps = plan.maps
        ffn_cache = policy.caches.flat("ffn_outputs", i)
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
