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
from dataclasses import dataclass, field

import torch

from seer_kernels import cosine_saliency, gather_rows, partial_attention, scatter_rows, varlen_attention

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
        makes every row salient (sparse steps then compute what dense steps compute).
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
class SparseForward:
    """One forward as DyLLM runs it: ``mode`` "full" (warm-up or rebuild), "prompt" (sparse,
    prompt fed) or "response" (sparse, window only), and for a sparse one the index maps of its
    real fed rows packed back to back (built once per forward)."""

    rows: list[int]
    index: torch.Tensor
    step: int
    mode: str
    offset: int = 0  # fed prompt positions before the window
    num_queries: int = 0  # packed query rows (the real fed rows, row-major)
    query_src: torch.Tensor | None = None  # int64 [Tq]: flat index into the fed hidden [R * Lq]
    query_row: torch.Tensor | None = None  # int64 [Tq]: local row of each query
    query_cache: torch.Tensor | None = None  # int64 [Tq]: flat index into a cache [B * Lc]
    query_key: torch.Tensor | None = None  # int64 [Tq]: packed key row of each query's own key
    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None
    max_q: int = 0
    max_k: int = 0
    num_keys: int = 0
    cache_key_src: torch.Tensor | None = None  # cache keys: flat cache index -> packed key row cache_key_dst
    cache_key_dst: torch.Tensor | None = None
    prefix_key_row: torch.Tensor | None = None  # prefix keys (row, position) -> packed key row prefix_key_dst
    prefix_key_pos: torch.Tensor | None = None
    prefix_key_dst: torch.Tensor | None = None
    prefix: PrefixKV | None = None
    gate: torch.Tensor | None = None  # int64 ascending packed query rows: the current gating set
    queries_per_request: torch.Tensor | None = None  # float64 [R]
    keys_per_request: torch.Tensor | None = None  # float64 [R]
    padded_input: torch.Tensor | None = None  # the forward's padded hidden state before packing
    record: dict = field(default_factory=dict)


class DyLLMPolicy(DecodePolicy):
    """Saliency-gated sparse steps over per-request caches (see the module docstring)."""

    name = "dyllm"
    packed_layouts = False  # the caches are laid out per padded row

    def __init__(self, config: DyLLMConfig) -> None:
        self.config = config

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

    # -- engine fixed points -------------------------------------------------------------------
    def plan_forward(self, run: DecodeRun, fwd: Forward) -> None:
        self.fit(run.window.longest())
        cfg = self.config
        cold = any(self.dense_forwards[b] < cfg.full_steps or self.valid[b] < run.window[b] for b in fwd.rows)
        if cold:
            mode = "full"
        elif run.prefix_cache or fwd.step % cfg.prompt_period == 0:
            mode = "sparse"  # prompt or response: decided by what the layout feeds
        else:
            mode = "response"
            fwd.feed_prompt = False
        self.current = SparseForward(fwd.rows, fwd.index, fwd.step, mode)

    def before_layers(self, run: DecodeRun, fwd: Forward) -> None:
        plan = self.current
        if plan.mode == "full":
            return
        plan.offset = fwd.offset
        if plan.mode == "sparse":
            plan.mode = "prompt" if fwd.offset else "response"
        self._plan_sparse(run, plan, fwd)
        rows, length, dim = fwd.hidden.shape
        plan.padded_input = fwd.hidden
        fwd.hidden = fwd.hidden.reshape(rows * length, dim).index_select(0, plan.query_src)
        positions = fwd.layout.positions.reshape(-1)[plan.query_src]
        fwd.layout = PackedLayout(positions, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k)
        fwd.rope = run.model.rope(positions)
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
        plan, self.current = self.current, None
        if plan.mode != "full":  # back to the padded layout: pad rows pass through unchanged
            out = plan.padded_input.clone(memory_format=torch.contiguous_format)
            out.view(-1, out.shape[-1]).index_copy_(0, plan.query_src, fwd.hidden)
            fwd.hidden = out
        if run.logits_shift and not run.prefix_cache:
            if fwd.offset > 0:
                if self.last_prompt_state is None:
                    self.last_prompt_state = fwd.hidden.new_zeros(run.batch_size, fwd.hidden.shape[-1])
                self.last_prompt_state[fwd.index] = fwd.hidden[: len(fwd.rows), fwd.offset - 1]
            elif plan.mode == "response":
                # the state that predicts window position 0 is the last prompt position's, not fed now
                fwd.first_state = self.last_prompt_state[fwd.index].to(fwd.hidden.dtype)
        self._finish(run, plan)

    def report(self, run: DecodeRun) -> dict:
        return {"dyllm": self.stats(run)}

    # -- caches --------------------------------------------------------------------------------
    def fit(self, capacity: int) -> None:
        """Resize every cache to ``capacity`` window positions (Seer's cut shrinks, its guard grows)."""
        if capacity == self.capacity:
            return
        keep = self.cached_prompt + min(capacity, self.capacity)
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
        return caches[i]

    # -- the sparse forward's index maps -----------------------------------------------------------
    def _plan_sparse(self, run: DecodeRun, plan: SparseForward, fwd: Forward) -> None:
        """Index maps of a sparse forward: real fed rows packed, keys packed per request."""
        dev = run.device
        R = len(plan.rows)
        index = plan.index
        width = fwd.width
        pre, lc = self.cached_prompt, self.cached_prompt + self.capacity
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
        prefix = fwd.prefix
        if prefix is not None:
            kp = prefix.key_mask if prefix.key_mask is not None else torch.ones(
                R, prefix.length, dtype=torch.bool, device=dev)
            np_r = kp.sum(1)
        else:
            kp, np_r = None, torch.zeros(R, dtype=torch.long, device=dev)
        nk_r = np_r + kc.sum(1)
        nq_r = fed.sum(1)
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        cu_k = torch.cat([zero, nk_r.cumsum(0)])
        cu_q = torch.cat([zero, nq_r.cumsum(0)])
        pk_map = cu_k[:-1, None] + np_r[:, None] + kc.long().cumsum(1) - 1  # [R, lk] packed key row
        q_src = fed.reshape(-1).nonzero().squeeze(1)
        q_row, q_pos = q_src // lq, q_src % lq
        plan.query_src, plan.query_row = q_src, q_row
        plan.query_cache = index[q_row] * lc + q_pos + shift
        plan.query_key = pk_map[q_row, q_pos + shift]
        plan.num_queries = int(q_src.numel())
        kc_flat = kc.reshape(-1).nonzero().squeeze(1)
        kr, kj = kc_flat // lk, kc_flat % lk
        plan.cache_key_src = index[kr] * lc + kj
        plan.cache_key_dst = pk_map[kr, kj]
        if kp is not None:
            kp_flat = kp.reshape(-1).nonzero().squeeze(1)
            plan.prefix_key_row, plan.prefix_key_pos = kp_flat // kp.shape[1], kp_flat % kp.shape[1]
            plan.prefix_key_dst = cu_k[plan.prefix_key_row] + kp.long().cumsum(1)[plan.prefix_key_row,
                                                                                  plan.prefix_key_pos] - 1
        plan.cu_q, plan.cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
        plan.max_q, plan.max_k = int(nq_r.max()), int(nk_r.max())
        plan.num_keys = int(cu_k[-1])
        plan.queries_per_request, plan.keys_per_request = nq_r.double(), nk_r.double()
        # layer 0's gating set: the positions committed since the request's previous forward
        if self.tau > 1:
            plan.gate = torch.arange(plan.num_queries, device=dev)
        else:
            qmap = torch.full((R * lq,), -1, dtype=torch.long, device=dev)
            qmap[q_src] = torch.arange(plan.num_queries, device=dev)
            win = run.tokens[index, :width]
            mask_id = run.token_ids.mask
            committed = (self.snapshot[index, :width] == mask_id) & (win != mask_id) & live
            plan.gate = qmap.view(R, lq)[:, plan.offset:][committed]
        plan.record = {"fed": plan.num_queries, "gating": [], "salient": [], "union": [], "exact": [], "macs": 0.0}

    def pack(self, cache: torch.Tensor, prefix: torch.Tensor | None, plan: SparseForward) -> torch.Tensor:
        """Keys (or values) of the forward packed per request: ``[prefix keys, cache keys]``."""
        part = cache.view(-1, *cache.shape[2:]).index_select(0, plan.cache_key_src)
        if prefix is None:
            return part  # no prefix: the cache keys are the packed keys, in order
        out = part.new_empty((plan.num_keys, *part.shape[1:]))
        out.index_copy_(0, plan.cache_key_dst, part)
        out.index_copy_(0, plan.prefix_key_dst, prefix[plan.prefix_key_row, :, plan.prefix_key_pos])
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

    def account(self, plan: SparseForward, gate: torch.Tensor, salient: torch.Tensor, exact: torch.Tensor) -> None:
        """One sparse layer's counts and ideal multiply-accumulates, into ``plan.record``."""
        d = self.dims
        R = len(plan.rows)
        a_r = torch.bincount(plan.query_row.index_select(0, gate), minlength=R).double()
        b_r = torch.bincount(plan.query_row.index_select(0, salient), minlength=R).double()
        e_r = torch.bincount(plan.query_row[exact], minlength=R).double()
        nq, nk = plan.queries_per_request, plan.keys_per_request
        approx_cost = 3 if self.config.attention_mode == "partial" else 1
        macs = (nq * (2 * d["D"] * d["Hd"]) + a_r * (2 * d["D"] * d["Hkd"]) + b_r * (3 * d["D"] * d["I"])
                + nq * nk * d["Hd"]  # QK^T: every (query, key) pair, the softmax normaliser needs them all
                + (e_r * nk + (nq - e_r) * a_r * approx_cost) * d["Hd"])  # P @ V for exact rows, P[:, A] @ dV
        # for the others (the key correction adds their scores against A's old keys and a P[:, A] @ V_old)
        union = torch.zeros(plan.num_queries, dtype=torch.bool, device=gate.device)
        union[gate] = True
        union[salient] = True
        rec = plan.record
        rec["gating"].append(int(gate.numel()))
        rec["salient"].append(int(salient.numel()))
        rec["union"].append(int(union.sum()))
        rec["exact"].append(int(exact.sum()))
        rec["macs"] += float(macs.sum())

    def _finish(self, run: DecodeRun, plan: SparseForward) -> None:
        rows, layers = plan.rows, run.num_layers
        dense = self.dense_macs(run, rows) * layers
        dense_tokens = sum(run.window[b] + (0 if run.prefix_cache else run.prompt_lengths[b]) for b in rows)
        if plan.mode == "full":
            n = dense_tokens
            rec = {"fed": n, "gating": [n] * layers, "salient": [n] * layers, "union": [n] * layers,
                   "exact": [n] * layers, "macs": dense}
            for b in rows:
                self.dense_forwards[b] += 1
                self.valid[b] = run.window[b]
        else:
            rec = plan.record
        fed = rec["fed"]
        self.records.append({
            "step": plan.step, "mode": plan.mode, "rows": len(rows), "fed": fed,
            "salient_fraction": [s / fed if fed else 0.0 for s in rec["salient"]],
            "gating": rec["gating"],
            "attn_exact": rec["exact"], "attn_approx": [fed - e for e in rec["exact"]],
            "ffn_computed": rec["salient"], "ffn_skipped": [fed - s for s in rec["salient"]],
            "tokens_computed": sum(rec["union"]), "tokens_dense": dense_tokens * layers,
            "macs": rec["macs"], "dense_macs": dense,
        })
        self.snapshot[plan.index] = run.tokens[plan.index]

    def stats(self, run: DecodeRun) -> dict:
        """Totals over the run plus the per-forward records (see the module docstring)."""
        recs, layers = self.records, run.num_layers
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
            "steps": recs,
        }


class SparseLayer:
    """One layer of a sparse forward (``adapter.LayerRows``): the gating set's K/V into the
    caches, partial (or exact) attention, the salient set, and the FFN of the salient rows."""

    def __init__(self, policy: DyLLMPolicy, run: DecodeRun, plan: SparseForward, layer: int) -> None:
        self.policy, self.run, self.plan, self.layer = policy, run, plan, layer
        self.kv_index = plan.gate
        self._context_before: torch.Tensor | None = None
        self._exact: torch.Tensor | None = None
        self._salient: torch.Tensor | None = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        gate, n_a, num_q = plan.gate, plan.gate.numel(), plan.num_queries
        key_cache = policy.keys[i].view(-1, *policy.keys[i].shape[2:])
        value_cache = policy.values[i].view(-1, *policy.values[i].shape[2:])
        at = plan.query_cache.index_select(0, gate)
        dv = v - gather_rows(value_cache, at, n_a)
        # the salient rows' keys before the update (the key-corrected partial attention)
        k_old = gather_rows(key_cache, at, n_a) if policy.config.attention_mode == "partial" else None
        scatter_rows(key_cache, at, n_a, k)
        scatter_rows(value_cache, at, n_a, v)
        prefix_k = prefix_v = None
        if plan.prefix is not None:
            prefix_k, prefix_v = plan.prefix.keys[i], plan.prefix.values[i]
        keys, values = policy.pack(policy.keys[i], prefix_k, plan), policy.pack(policy.values[i], prefix_v, plan)
        contexts = policy.contexts[i].view(-1, policy.contexts[i].shape[-1])
        self._context_before = contexts.index_select(0, plan.query_cache)  # [Tq, H*d]
        heads, d = q.shape[1], q.shape[2]
        if policy.config.approx_attention:
            exact = torch.zeros(num_q, dtype=torch.bool, device=q.device)
            exact[gate] = True
            key_rows = plan.query_key.index_select(0, gate)
            cached = self._context_before.view(num_q, heads, d)
            ctx = partial_attention(q, keys, values, cached, dv, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k,
                                    exact, key_rows.to(torch.int32), n_a, k_old=k_old)
        else:
            exact = torch.ones(num_q, dtype=torch.bool, device=q.device)
            ctx = varlen_attention(q, keys, values, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k)
        self._exact = exact
        return ctx

    def ffn_index(self, ctx: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        index, count, _ = cosine_saliency(ctx, self._context_before, policy.tau)
        self._salient = index[: int(count)].long()
        policy.contexts[i].view(-1, policy.contexts[i].shape[-1]).index_copy_(0, plan.query_cache, ctx)
        return self._salient

    def ffn_output(self, out: torch.Tensor) -> torch.Tensor:
        policy, plan, i = self.policy, self.plan, self.layer
        ffn_cache = policy.ffn_outputs[i].view(-1, policy.ffn_outputs[i].shape[-1])
        salient = self._salient
        scatter_rows(ffn_cache, plan.query_cache.index_select(0, salient), salient.numel(), out)
        policy.account(plan, plan.gate, salient, self._exact)
        plan.gate = salient  # the salient set gates the next layer
        return ffn_cache.index_select(0, plan.query_cache)
