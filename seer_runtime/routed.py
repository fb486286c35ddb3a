"""Routed execution: after Seer's cut, every step of a batch goes through the PWR router.

The router (``router.py``) splits the active rows into groups and picks a path per group:

* ``STATIC`` - the group's windows padded to the micro-bucket ``B_G`` (padded layout, SDPA);
  on CUDA this shape is what a captured graph replays (``graph_cache.py``);
* ``VARLEN`` - the windows packed back to back (``PackedLayout``) and padded to the packed
  bucket ``P``; attention through ``seer_kernels.varlen_attention``;
* ``EAGER`` - packed with no padding (lone stragglers, ultra-short groups);
* ``EMPTY`` - nothing to run.

With the prefix KV cache (LaViDa) the window layout of a group comes from the fused
``seer_kernels.slice_repack`` kernel (cut, pack or bucket-pad, positions, cu_seqlens and the
control word in one pass); it is built once per change of the active rows or window lengths
and later steps only gather the current tokens through its ``src_index``. Without the cache
each packed sequence is the request's real prompt tokens followed by its window, assembled
with index maps in torch.

Per-path useful and padded tokens are reported in ``stats.extra["router"]``. Classifier-free
guidance and DyLLM keep the padded layout (their per-row state is laid out that way): with
them the router's decisions are recorded but every group runs padded.

Graphs: with the prefix cache, STATIC groups run through a :class:`~seer_runtime.graph_cache.
GraphCache` keyed by the router's ``GraphKey`` (batch bucket, ``B_G``): persistent buffers hold
the window ids, positions, key mask and the group's prefix K/V (written once per layout
change; each step copies only the window's ids, positions and mask), and the cache captures a
CUDA graph per key on a CUDA device (``graphs="auto"``), or replays through any backend given
(``FakeGraphBackend`` in tests). On a machine without CUDA it runs the same buffers eagerly and
says so once. VARLEN and EAGER groups run eagerly (their key-side layout depends on the
group's prompt lengths; capturing it needs a key-index buffer per packed bucket, not done yet).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import PackedLayout
from .router import PATH_EAGER, PATH_EMPTY, PATH_STATIC, PATH_VARLEN, Router, RouterConfig, RouterStats


@dataclass
class PackedGroup:
    """The packed layout of one group: ``tokens`` flat indices into ``x`` (window tokens) or a
    recipe to assemble prompt + window; ``window_index [n, 2]`` (group row, window position)
    of each gathered logit row and ``logit_rows`` the packed rows they are read from."""

    rows: list[int]
    layout: PackedLayout
    src_index: torch.Tensor          # flat index into x.view(-1) per packed window token (-1: pad)
    capacity: int                    # packed rows computed (P, or T for eager)
    logit_rows: torch.Tensor         # packed row whose state gives each window position's logits
    logit_dest: torch.Tensor         # (group row, window position) of each of those
    prompt_rows: torch.Tensor | None = None   # no cache: packed rows holding prompt tokens
    prompt_src: torch.Tensor | None = None    # (request, prompt position) of each


class RoutedPolicy:
    """Mixed into ``DecodeRun`` (after ``SeerPolicy`` in the MRO): routed forwards after the cut."""

    def init_router(self, config: RouterConfig | None, *, graphs="auto") -> None:
        if config is None:
            config = RouterConfig.for_window(self.W, max_batch=max(1, self.B))
        self.router = Router(config)
        self.router_stats = RouterStats()
        self._groups: dict[tuple, PackedGroup] = {}
        self.graph_backend = graphs
        self._graphs = None
        self._graph_layout = None

    def _routing_active(self) -> bool:
        if not getattr(self, "cut_done", True):
            return False  # Seer's step 0 (the cut happens inside it) runs padded
        return True

    def forward(self, rows, step, *, wmax=None):
        if wmax is not None or not self._routing_active():
            return super().forward(rows, step, wmax=wmax)
        lengths = [self.wlen[r] for r in rows]
        routes = self.router.route(lengths)
        self.router_stats.add(routes)
        padded_only = self.gen.cfg_scale > 0 or hasattr(self, "dyllm")
        longest = max(lengths)
        logits = None
        for route in routes:
            if route.path == PATH_EMPTY:
                continue
            group = [rows[i] for i in route.rows]
            if route.path == PATH_STATIC and not padded_only and self._graphable():
                part = self._forward_static_graph(group, step, route)
            elif route.path == PATH_STATIC or padded_only:
                width = min(self.W, route.key.length) if route.path == PATH_STATIC else max(self.wlen[r] for r in group)
                part = super().forward(group, step, wmax=width)
            else:
                part = self._forward_packed(group, step, route)
            if logits is None:
                logits = part.new_zeros((len(rows), longest, part.shape[-1]))
            cut = min(part.shape[1], longest)
            logits[list(route.rows), :cut] = part[:, :cut]
        return logits

    # -- packed groups ---------------------------------------------------------------------------
    def _group_layout(self, group: list[int], route) -> PackedGroup:
        key = (tuple(group), tuple(self.wlen[r] for r in group), route.path,
               None if route.key is None else route.key.length)
        cached = self._groups.get(key)
        if cached is None:
            cached = self._build_packed(group, route)
            self._groups = {key: cached}  # one layout at a time: rows and lengths change rarely
        return cached

    def _build_packed(self, group: list[int], route) -> PackedGroup:
        dev = self.device
        lens = [self.wlen[r] for r in group]
        total = sum(lens)
        capacity = route.key.length if route.path == PATH_VARLEN else total
        if self.use_cache:
            return self._build_packed_cached(group, lens, capacity)
        # no cache: each sequence is the request's real prompt tokens, then its window
        prompt = [self.prompt_real[r] for r in group]
        seq = [p + n for p, n in zip(prompt, lens)]
        starts = torch.tensor([0] + seq, device=dev).cumsum(0)
        cu = starts.to(torch.int32)
        capacity = capacity + sum(prompt)
        src = torch.full((capacity,), -1, dtype=torch.long, device=dev)
        positions = torch.zeros(capacity, dtype=torch.long, device=dev)
        prompt_rows, prompt_src, logit_rows, logit_dest = [], [], [], []
        for g, (r, p, n) in enumerate(zip(group, prompt, lens)):
            s = int(starts[g])
            pr = torch.arange(s, s + p, device=dev)
            prompt_rows.append(pr)
            prompt_src.append(torch.stack([torch.full_like(pr, r), torch.arange(self.Lp - p, self.Lp, device=dev)], 1))
            wr = torch.arange(s + p, s + p + n, device=dev)
            src[wr] = r * self.W + torch.arange(n, device=dev)
            positions[s: s + p + n] = self.positions[r, self.Lp - p: self.Lp + n]
            logit_rows.append(wr - self.shift)  # Dream: window j reads the state at j - 1
            logit_dest.append(torch.stack([torch.full_like(wr, g), torch.arange(n, device=dev)], 1))
        layout = PackedLayout(positions, cu, cu, max(seq), max(seq))
        return PackedGroup(group, layout, src, capacity, torch.cat(logit_rows), torch.cat(logit_dest),
                           torch.cat(prompt_rows), torch.cat(prompt_src))

    def _build_packed_cached(self, group: list[int], lens: list[int], capacity: int) -> PackedGroup:
        from seer_kernels import slice_repack

        dev = self.device
        cfg = self.router.config
        idx = torch.tensor(group, device=dev)
        keep = torch.tensor(self.wlen, dtype=torch.int32, device=dev)
        out = slice_repack(self.x, keep, positions=self.positions[:, self.Lp: self.Lp + self.W].contiguous(),
                           row_ids=idx.to(torch.int32), micro_buckets=cfg.micro_buckets,
                           packed_buckets=cfg.packed_buckets, batch_buckets=cfg.batch_buckets, tau_pad=cfg.tau_pad,
                           eager_max_bucket=cfg.eager_max_bucket, pad_value=self.ids.pad)
        ctrl = out.read()  # one small read per layout change; steps in between never sync
        if ctrl.path not in (PATH_VARLEN, PATH_EAGER):
            raise RuntimeError(f"slice_repack chose path {ctrl.path} where the router chose a packed path")
        cap = ctrl.bucket if ctrl.path == PATH_VARLEN else ctrl.total
        cu_q = out.cu_seqlens[: len(group) + 1].clone()
        src = out.packed_src_index[:cap].clone()
        positions = out.packed_positions[:cap].clone()
        prefix_len = (self.prefix.key_mask[idx].sum(1) if self.prefix.key_mask is not None
                      else torch.full((len(group),), self.Lp, device=dev)).tolist()
        seq_k = [p + n for p, n in zip(prefix_len, lens)]
        cu_k = torch.tensor([0] + seq_k, device=dev).cumsum(0).to(torch.int32)
        pref_start = torch.tensor([0] + prefix_len, device=dev).cumsum(0)
        n_prefix = int(pref_start[-1])
        key_index, logit_rows, logit_dest = [], [], []
        for g, (p, n) in enumerate(zip(prefix_len, lens)):
            s = int(cu_q[g])
            key_index.append(torch.arange(int(pref_start[g]), int(pref_start[g]) + p, device=dev))
            key_index.append(n_prefix + torch.arange(s, s + n, device=dev))
            rows_g = torch.arange(s, s + n, device=dev)
            if self.shift:  # within the window: position 0 keeps its own state
                rows_g = torch.cat([rows_g[:1], rows_g[:-1]])
            logit_rows.append(rows_g)
            logit_dest.append(torch.stack([torch.full((n,), g, device=dev), torch.arange(n, device=dev)], 1))
        layout = PackedLayout(positions, cu_q, cu_k, max(lens), max(seq_k), torch.cat(key_index))
        return PackedGroup(group, layout, src, cap, torch.cat(logit_rows), torch.cat(logit_dest))

    def _forward_packed(self, group: list[int], step: int, route) -> torch.Tensor:
        pg = self._group_layout(group, route)
        flat = self.x.reshape(-1)
        tokens = torch.where(pg.src_index >= 0, flat[pg.src_index.clamp(min=0)],
                             torch.full_like(pg.src_index, self.ids.pad))
        hidden = self.model.embed(tokens)
        if pg.prompt_rows is not None:
            hidden[pg.prompt_rows] = self.prompt_embeds[pg.prompt_src[:, 0], pg.prompt_src[:, 1]]
        prefix = None
        if self.use_cache:
            idx = torch.tensor(group, device=self.device)
            prefix = self.prefix if len(group) == self.B else self.prefix.select(idx)
        self.stats.tokens_computed += pg.capacity * self.layers
        for r in group:
            own = self.wlen[r] + (0 if self.use_cache else self.prompt_real[r])
            self.per_request_tokens[r] += own * self.layers
        hidden = self.run_layers(hidden, pg.layout, prefix, rows=group, step=step)
        logits = self.model.head(hidden[pg.logit_rows])
        out = logits.new_zeros((len(group), max(self.wlen[r] for r in group), logits.shape[-1]))
        out[pg.logit_dest[:, 0], pg.logit_dest[:, 1]] = logits
        self.stats.nfe += 1
        return out

    def router_report(self) -> dict:
        return self.router_stats.as_dict()

    def graph_report(self) -> dict | None:
        if self._graphs is None:
            return None
        c = self._graphs.counters
        return {"captures": c.captures, "replays": c.replays, "eager_runs": c.eager_runs}

    # -- static groups through the graph cache ----------------------------------------------------
    def _graphable(self) -> bool:
        return self.use_cache and self.graph_backend is not None and self.W <= self.router.config.n_max

    def _static_cache(self):
        """The graph cache of this run's static keys (built at the first static group)."""
        if self._graphs is not None:
            return self._graphs
        from .graph_cache import FILL_FIRST_TRUE, BufferSpec, GraphCache

        m = self.model
        lp, hk, hd = self.Lp, m.num_kv_heads, m.head_dim
        dtype = self.prefix.keys[0].dtype
        specs = {
            "ids": BufferSpec(("batch", "length"), torch.long, self.ids.pad),
            "positions": BufferSpec(("batch", "length"), torch.long, 0),
            "key_mask": BufferSpec(("batch", f"length+{lp}"), torch.bool, FILL_FIRST_TRUE),
        }
        for i in range(self.layers):
            specs[f"k{i}"] = BufferSpec(("batch", hk, lp, hd), dtype, 0)
            specs[f"v{i}"] = BufferSpec(("batch", hk, lp, hd), dtype, 0)
        keys = [k for k in self.router.valid_keys(PATH_STATIC) if k.length <= self.W]

        def fn(key, bufs):
            from .layout import PaddedLayout, PrefixKV

            prefix = PrefixKV([bufs[f"k{i}"] for i in range(self.layers)], [bufs[f"v{i}"] for i in range(self.layers)],
                              None, lp)
            layout = PaddedLayout(bufs["positions"], bufs["key_mask"])
            hidden = self.model.embed(bufs["ids"])
            rope = self.model.rope(layout.positions)
            for i in range(self.layers):
                hidden = self.model.layer(i, hidden, layout, rope=rope, prefix=prefix)
            return self.window_logits(hidden, 0, key.length)

        self._graphs = GraphCache(fn, specs, keys, device=self.device, backend=self.graph_backend)
        return self._graphs

    def _forward_static_graph(self, group: list[int], step: int, route) -> torch.Tensor:
        cache = self._static_cache()
        key = route.key
        idx = torch.tensor(group, device=self.device)
        width = key.length
        layout_id = (tuple(group), key)
        if self._graph_layout != layout_id:  # the group's prefix K/V: written once per layout
            prefix = self.prefix.select(idx)
            cache.write(key, {**{f"k{i}": prefix.keys[i] for i in range(self.layers)},
                              **{f"v{i}": prefix.values[i] for i in range(self.layers)}})
            self._graph_layout = layout_id
        live = torch.arange(width, device=self.device)[None, :] < torch.tensor(
            [self.wlen[r] for r in group], device=self.device)[:, None]
        pmask = self.prefix.key_mask[idx] if self.prefix.key_mask is not None else torch.ones(
            len(group), self.Lp, dtype=torch.bool, device=self.device)
        ids = torch.where(live, self.x[idx, :width], torch.full_like(live, self.ids.pad, dtype=torch.long))
        inputs = {"ids": ids, "positions": self.positions[idx, self.Lp: self.Lp + width],
                  "key_mask": torch.cat([pmask, live], dim=1)}
        logits = cache.run(key, inputs, narrow=len(group))
        self.stats.tokens_computed += key.batch * width * self.layers
        for r in group:
            self.per_request_tokens[r] += self.wlen[r] * self.layers
        self.stats.nfe += 1
        return logits.clone()
