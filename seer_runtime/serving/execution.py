"""Routed execution: after Seer's cut, every step of a batch runs the path the PWR router picks.

:class:`RoutedExecution` is the policy that owns a step's forward (``execute``):

* ``STATIC`` - the windows padded to the micro-bucket ``B_G`` (padded layout, SDPA); with the
  prefix cache it replays a graph of the :class:`~seer_runtime.serving.graph_cache.GraphCache`
  keyed by the router's ``GraphKey`` (persistent buffers hold the window ids, positions, key
  mask and the group's prefix K/V; a CUDA graph per key on a CUDA device, the same buffers run
  eagerly elsewhere, said once);
* ``VARLEN`` - the windows packed back to back (``PackedLayout``), padded to the packed bucket
  ``P``; attention through ``seer_kernels.varlen_attention``;
* ``EAGER`` - packed with no padding (a lone request, ultra-short windows).

A packed layout is built once per change of the rows or their window lengths and later steps
only gather the current tokens through its source index: with the prefix cache by the fused
``seer_kernels.slice_repack`` kernel, without it (each sequence is the request's real prompt
tokens then its window) with index maps in torch. Classifier-free guidance and policies that
need padded rows (``DecodePolicy.packed_layouts``, DyLLM) keep every group padded; the router's
decisions are still recorded. Useful and padded tokens per path: ``stats.extra["router"]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seer_kernels import ControlValues, slice_repack

from ..adapter import PackedLayout, PaddedLayout, PrefixKV
from ..engine import DecodeRun, Forward, StepChoice
from ..policy import DecodePolicy
from ..profiling import prange
from .graph_cache import FILL_FIRST_TRUE, BufferSpec, GraphCache
from .router import PATH_STATIC, PATH_VARLEN, Route, Router, RouterConfig, RouterStats


@dataclass
class PackedGroup:
    """The packed layout of one group: ``src_index`` flat indices into the windows' tokens
    (``-1``: padding), ``capacity`` packed rows computed, ``logit_rows`` the packed row whose
    state gives each window position's logits and ``logit_dest`` its (group row, position);
    without the prefix cache, ``prompt_rows`` the packed rows holding prompt tokens and
    ``prompt_src`` the (request, prompt position) of each."""

    rows: list[int]
    layout: PackedLayout
    src_index: torch.Tensor
    capacity: int
    logit_rows: torch.Tensor
    logit_dest: torch.Tensor
    prompt_rows: torch.Tensor | None = None
    prompt_src: torch.Tensor | None = None


class RoutedExecution(DecodePolicy):
    """Runs each step's forward on the path the router picks (see the module docstring).

    config: the router's tables (None: ``RouterConfig.for_window(gen_length, max_batch=B)``);
    graphs: "auto" (CUDA graphs on a CUDA device), None (eager) or a graph backend object.
    """

    name = "router"

    def __init__(self, config: RouterConfig | None = None, *, graphs="auto") -> None:
        self.config = config
        self.graph_backend = graphs
        self._graphs: GraphCache | None = None
        self._group = self._graph_layout = None

    def on_request(self, run: DecodeRun) -> None:
        config = self.config or RouterConfig.for_window(run.width, max_batch=max(1, run.batch_size))
        self.router = Router(config)
        self.stats = RouterStats()
        self._group: tuple[tuple, PackedGroup] | None = None  # one layout at a time: rows and lengths change rarely
        self._graphs: GraphCache | None = None
        self._graph_layout = None
        self._padded_only = run.gen.cfg_scale > 0 or not all(p.packed_layouts for p in run.policies)

    def execute(self, run: DecodeRun, rows: list[int], step: int) -> torch.Tensor | None:
        if run.window.cut_pending:
            return None  # Seer's step 0 (the cut happens inside it) runs padded
        lengths = run.window.lengths_of(rows)
        route = self.router.route(lengths, check=False)
        self.stats.add(route)
        if route.path == PATH_STATIC and not self._padded_only and self._graphable(run):
            logits = self._forward_static_graph(run, rows, step, route)
        elif route.path == PATH_STATIC or self._padded_only:
            width = min(run.width, route.key.length) if route.path == PATH_STATIC else max(lengths)
            logits = run.forward(rows, step, width=width)
        else:
            logits = self._forward_packed(run, rows, step, route)
        return logits[:, : max(lengths)]

    def release(self, run: DecodeRun) -> None:
        if self._graphs is not None:
            self._graphs.clear()
        self._graphs = self._group = self._graph_layout = None

    def report(self, run: DecodeRun) -> dict:
        out = {"router": self.stats.as_dict()}
        if self._graphs is not None:
            c = self._graphs.counters
            out["graphs"] = {"captures": c.captures, "replays": c.replays, "eager_runs": c.eager_runs}
        return out

    # -- packed groups ---------------------------------------------------------------------------
    def _packed_group(self, run: DecodeRun, rows: list[int], route: Route) -> PackedGroup:
        key = (tuple(rows), run.window.lengths_of(rows), route.path, None if route.key is None else route.key.length)
        if self._group is None or self._group[0] != key:
            self._group = (key, self._build_packed(run, rows, route))
        return self._group[1]

    def _build_packed(self, run: DecodeRun, rows: list[int], route: Route) -> PackedGroup:
        """A group's packed layout, from host lengths alone (uploaded once per layout change)."""
        lens = [run.window[r] for r in rows]
        capacity = route.key.length if route.path == PATH_VARLEN else sum(lens)
        if run.prefix_cache:
            return self._build_packed_cached(run, rows, lens, route, capacity)
        # no cache: each sequence is the request's real prompt tokens, then its window
        prompt = [run.prompt_lengths[r] for r in rows]
        seq = [p + n for p, n in zip(prompt, lens)]
        starts = _exclusive_cumsum(seq)
        capacity = capacity + sum(prompt)
        lp = run.prompt_len
        src = [-1] * capacity
        position_src = [-1] * capacity
        prompt_rows, prompt_src, logit_rows, logit_dest = [], [], [], []
        for g, (r, p, n) in enumerate(zip(rows, prompt, lens)):
            s = starts[g]
            for j in range(p):
                prompt_rows.append(s + j)
                prompt_src.append((r, lp - p + j))
                position_src[s + j] = r * (lp + run.width) + lp - p + j
            for j in range(n):
                src[s + p + j] = r * run.width + j
                position_src[s + p + j] = r * (lp + run.width) + lp + j
                logit_rows.append(s + p + j - run.logits_shift)  # Dream: window j reads the state at j - 1
                logit_dest.append((g, j))
        up = run.device_tensor
        flat = up(position_src)
        positions = torch.where(flat >= 0, run.positions.reshape(-1)[flat.clamp(min=0)], 0)
        cu = up(starts + [starts[-1] + seq[-1]], torch.int32)
        layout = PackedLayout(positions, cu, cu, max(seq), max(seq))
        return PackedGroup(rows, layout, up(src), capacity, up(logit_rows), up(logit_dest),
                           up(prompt_rows), up(prompt_src))

    def _build_packed_cached(self, run: DecodeRun, rows: list[int], lens: list[int], route: Route,
                             capacity: int) -> PackedGroup:
        cfg = self.router.config
        index = run.row_index(rows)
        # the fused kernel writes the layout the router decided (no second decision, nothing read back)
        decided = ControlValues(route.path, capacity, sum(lens), max(lens), 0, len(rows))
        out = slice_repack(run.tokens, run.window.device_lengths(),
                           positions=run.positions[:, run.prompt_len: run.prompt_len + run.width].contiguous(),
                           row_ids=index.to(torch.int32), micro_buckets=cfg.micro_buckets,
                           packed_buckets=cfg.packed_buckets, batch_buckets=cfg.batch_buckets, tau_pad=cfg.tau_pad,
                           eager_max_bucket=cfg.eager_max_bucket, pad_value=run.token_ids.pad, route=decided,
                           check=False)
        cu_q = out.cu_seqlens[: len(rows) + 1].clone()
        src = out.packed_src_index[:capacity].clone()
        positions = out.packed_positions[:capacity].clone()
        prefix_len = [run.prompt_lengths[r] for r in rows]  # the cached prefix holds each prompt's real positions
        seq_k = [p + n for p, n in zip(prefix_len, lens)]
        q_start, k_start = _exclusive_cumsum(lens), _exclusive_cumsum(seq_k)
        prefix_start = _exclusive_cumsum(prefix_len)
        n_prefix = sum(prefix_len)
        key_index, logit_rows, logit_dest = [], [], []
        for g, (p, n) in enumerate(zip(prefix_len, lens)):
            s = q_start[g]
            key_index += list(range(prefix_start[g], prefix_start[g] + p))
            key_index += [n_prefix + s + j for j in range(n)]
            own = list(range(s, s + n))
            logit_rows += ([own[0]] + own[:-1]) if run.logits_shift else own  # Dream: position 0 keeps its state
            logit_dest += [(g, j) for j in range(n)]
        up = run.device_tensor
        cu_k = up(k_start + [k_start[-1] + seq_k[-1]], torch.int32)
        layout = PackedLayout(positions, cu_q, cu_k, max(lens), max(seq_k), up(key_index))
        return PackedGroup(rows, layout, src, capacity, up(logit_rows), up(logit_dest))

    def _forward_packed(self, run: DecodeRun, rows: list[int], step: int, route: Route) -> torch.Tensor:
        pg, fwd, compute = self._packed_forward(run, rows, step, route)
        key = run.forward_key(fwd, "packed", route.path, pg.capacity)
        return run.finish_forward(fwd, run.run_keyed(key, rows, compute))

    def _packed_forward(self, run: DecodeRun, rows: list[int], step: int, route: Route):
        """A packed group's forward, planned: ``(group, Forward, compute)``, ``compute()`` its
        device work returning the window logits ``[R, max length, V]``."""
        pg = self._packed_group(run, rows, route)
        lengths = run.window.lengths_of(rows)
        fwd = Forward(rows, run.row_index(rows), step, max(lengths), layout=pg.layout, positions=pg.capacity,
                      prompt_fed=not run.prefix_cache, lengths=list(lengths))
        if run.prefix_cache:
            fwd.prefix = run.prefix_rows(rows)

        def compute() -> torch.Tensor:
            flat = run.tokens.reshape(-1)
            tokens = torch.where(pg.src_index >= 0, flat[pg.src_index.clamp(min=0)],
                                 torch.full_like(pg.src_index, run.token_ids.pad))
            fwd.hidden = run.model.embed(tokens)
            if pg.prompt_rows is not None:
                fwd.hidden[pg.prompt_rows] = run.prompt_embeds[pg.prompt_src[:, 0], pg.prompt_src[:, 1]]
            run.run_forward(fwd)
            logits = run.check_logits(run.model.head(fwd.hidden[pg.logit_rows]))
            out = logits.new_zeros((len(rows), fwd.width, logits.shape[-1]))
            out[pg.logit_dest[:, 0], pg.logit_dest[:, 1]] = logits
            return out

        return pg, fwd, compute

    def execute_and_choose(self, run: DecodeRun, rows: list[int], step: int, choice: StepChoice) -> bool:
        """A packed group (varlen or eager route) with the step's token choice in its graph unit;
        a static group through the graph cache, its choice in a graph of its own that reads the
        cache's static logits where they lie. False for Seer's step 0, padded-only runs and a
        static group without the graph cache: :meth:`execute` runs them and the engine samples."""
        if run.window.cut_pending or self._padded_only:
            return False
        lengths = run.window.lengths_of(rows)
        route = self.router.route(lengths, check=False)
        if route.path == PATH_STATIC:
            if not self._graphable(run):
                return False
            self.stats.add(route)
            logits = self._forward_static_graph(run, rows, step, route, copy=False)[:, : max(lengths)]
            # keyed by the graph that wrote the logits too: a key the cache captures again may move
            # them; an eager cache's logits are new tensors each time (no graph may read them)
            number = self._graphs.capture_number(route.key)
            key = None if number is None else ("static+chosen", *choice.detail, tuple(rows), lengths, route.key, number)
            with prange("sample"):
                result = run.run_keyed(key, rows, lambda: choice.choose(logits))
            choice.commit(result)
            return True
        self.stats.add(route)
        pg, fwd, compute = self._packed_forward(run, rows, step, route)
        key = run.forward_key(fwd, "packed", route.path, pg.capacity, *choice.detail)
        if key is None:  # a policy's hooks cannot replay this forward: eager, sampled apart
            run.sample(rows, run.finish_forward(fwd, run.run_keyed(None, rows, compute)), step)
            return True
        with prange("forward"):
            result = run.run_keyed(key, rows, lambda: choice.choose(compute()))
        run.chosen_forward(fwd)
        choice.commit(result)
        return True

    # -- static groups through the graph cache ----------------------------------------------------
    def _graphable(self, run: DecodeRun) -> bool:
        return run.prefix_cache and self.graph_backend is not None and run.width <= self.router.config.n_max

    def _static_cache(self, run: DecodeRun) -> GraphCache:
        """The graph cache of this run's static keys (built at the first static group)."""
        if self._graphs is not None:
            return self._graphs
        model, layers, lp = run.model, run.num_layers, run.prompt_len
        hk, hd = model.num_kv_heads, model.head_dim
        dtype = run.prefix.keys[0].dtype
        specs = {
            "ids": BufferSpec(("batch", "length"), torch.long, run.token_ids.pad),
            "positions": BufferSpec(("batch", "length"), torch.long, 0),
            "key_mask": BufferSpec(("batch", f"length+{lp}"), torch.bool, FILL_FIRST_TRUE),
        }
        for i in range(layers):
            specs[f"k{i}"] = BufferSpec(("batch", hk, lp, hd), dtype, 0)
            specs[f"v{i}"] = BufferSpec(("batch", hk, lp, hd), dtype, 0)
        keys = [k for k in self.router.valid_keys(PATH_STATIC) if k.length <= run.width]

        def step_logits(key, bufs):
            """One captured step: embed the window ids, every layer against the buffered prefix, logits."""
            prefix = PrefixKV([bufs[f"k{i}"] for i in range(layers)], [bufs[f"v{i}"] for i in range(layers)],
                              None, lp)
            layout = PaddedLayout(bufs["positions"], bufs["key_mask"])
            fwd = Forward([], None, step=-1, width=key.length, hidden=model.embed(bufs["ids"]), layout=layout,
                          prefix=prefix, hooks=False)
            fwd.rope = model.rope(layout.positions)
            run.run_layers(fwd)
            return run.window_logits(fwd)

        self._graphs = GraphCache(step_logits, specs, keys, device=run.device, backend=self.graph_backend)
        return self._graphs

    def _forward_static_graph(self, run: DecodeRun, rows: list[int], step: int, route: Route, *,
                              copy: bool = True) -> torch.Tensor:
        """The window logits ``[R, bucket length, V]`` of a static group from the graph cache: a copy,
        or with ``copy=False`` the cache's static output itself (the next replay of the key
        overwrites it)."""
        cache = self._static_cache(run)
        key, width = route.key, route.key.length
        index = run.row_index(rows)
        layout_id = (tuple(rows), run.window.lengths_of(rows), key)
        if self._graph_layout is None or self._graph_layout[0] != layout_id:
            # what stays while the rows, their windows and the key do (one group per step: nothing
            # else writes these buffers in between): the group's prefix K/V, positions, key mask,
            # the padding of every buffer; a step writes its window ids alone
            prefix = run.prefix_rows(rows)
            live = run.window.live_mask(index, width)
            prompt_keys = run.prefix.key_mask[index] if run.prefix.key_mask is not None else torch.ones(
                len(rows), run.prompt_len, dtype=torch.bool, device=run.device)
            pad = torch.full((), run.token_ids.pad, dtype=torch.long, device=run.device)
            views = cache.write(key, {
                **{f"k{i}": prefix.keys[i] for i in range(run.num_layers)},
                **{f"v{i}": prefix.values[i] for i in range(run.num_layers)},
                "ids": torch.where(live, run.tokens[index, :width], pad),
                "positions": run.positions[index, run.prompt_len: run.prompt_len + width],
                "key_mask": torch.cat([prompt_keys, live], dim=1)})
            self._graph_layout = (layout_id, live, pad, views["ids"][: len(rows), :width])
        else:  # the same layout: this step's window ids into the ids buffer, nothing else
            _, live, pad, ids = self._graph_layout
            torch.where(live, run.tokens[index, :width], pad, out=ids)
        logits = cache.run(key, narrow=len(rows))
        run.stats.tokens_computed += key.batch * width * run.num_layers
        for r in rows:
            run.tokens_per_request[r] += run.window[r] * run.num_layers
        run.stats.nfe += 1
        return logits.clone() if copy else logits


def _exclusive_cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        out.append(total)
        total += v
    return out
