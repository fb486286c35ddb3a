"""Routed layouts: after Seer's cut, each step's rows run on the path the PWR router picks
(``router.Router``), a way the model runner lays a step out (:meth:`RoutedLayouts.forwards`):

* ``STATIC`` - the windows padded to the micro-bucket ``B_G``; with the prefix cache the rows are
  padded to the batch bucket too and the step is a bucket unit: its inputs (window ids,
  positions, key mask, the group's prompt K/V) live in persistent buffers of the bucket
  (``graphs.BucketInputs``, allocated when the bucket is served: one bucket's at a time, the
  previous bucket's buffers and graphs let go), so one graph per bucket serves any group of its
  shape; without the prefix cache a padded forward of the bucket width;
* ``VARLEN`` - the windows packed back to back (``PackedLayout``), padded to the packed bucket
  ``P``; attention through ``seer_kernels.varlen_attention``;
* ``EAGER`` - packed with no padding (a lone request, ultra-short windows).

A packed layout is built once per change of the rows or their window lengths and later steps
only gather the current tokens through its source index: with the prefix cache by the fused
``seer_kernels.slice_repack`` kernel, without it (each sequence is the request's real prompt
tokens then its window) with index maps. Step 0 while Seer may still cut, classifier-free guidance
and policies that need padded rows (``Policy.packed_layouts``: DyLLM) run padded; the router's
decisions are still recorded. Useful and padded tokens per path: ``stats.extra["router"]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seer_kernels import slice_repack

from ..adapter import PackedLayout, PaddedLayout, PrefixKV
from ..batch import BatchState
from ..graphs import BucketInputs
from ..profiling import prange
from ..runner import Forward, padded_forward
from .router import PATH_NAMES, PATH_STATIC, PATH_VARLEN, GraphKey, Route, Router, RouterConfig, RouterStats

#: the profiler's range of each path's layout (``seer_runtime.profiling``)
PATH_RANGES = {path: f"router/{name.lower()}" for path, name in PATH_NAMES.items()}


@dataclass
class PackedGroup:
    """The packed layout of one group: ``src_index`` flat indices into the windows' tokens
    (``-1``: padding), ``capacity`` packed rows computed, ``logit_rows`` the packed row whose
    state gives each window position's logits and ``logit_dest`` its (group row, position);
    without the prefix cache, ``prompt_rows`` the packed rows holding prompt tokens and
    ``prompt_src`` the (request, prompt position) of each."""

    layout: PackedLayout
    src_index: torch.Tensor
    capacity: int
    logit_rows: torch.Tensor
    logit_dest: torch.Tensor
    prompt_rows: torch.Tensor | None = None
    prompt_src: torch.Tensor | None = None


def window_logit_rows(starts: torch.Tensor, lengths: torch.Tensor, *, prompt_fed: bool, shift: int) -> torch.Tensor:
    """The packed row whose state gives each window position's logits, windows packed at ``starts``
    (int64, host) with ``lengths``: the position itself (LLaDA), or Dream's state before it - the
    prompt's last for position 0 when the prompt is fed, its own otherwise (a prefix cache)."""
    own = torch.repeat_interleave(starts, lengths) + _ranks(lengths)
    if not shift:
        return own
    before = own - 1
    if not prompt_fed:
        first = _ranks(lengths) == 0
        before = torch.where(first, own, before)
    return before


def _pairs(t: torch.Tensor) -> list[tuple[int, int]]:
    """An ``[N, 2]`` host tensor as a list of int pairs (a key of the batch's device tables)."""
    return [tuple(p) for p in t.tolist()]


def _ranks(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, 1, .., n0 - 1, 0, 1, .., n1 - 1, ...]`` for ``lengths`` ``[n0, n1, ...]`` (int64, host)."""
    starts = torch.cumsum(lengths, 0) - lengths
    return torch.arange(int(lengths.sum())) - torch.repeat_interleave(starts, lengths)


class RoutedLayouts:
    """Each step on the path the router picks (module docstring).

    config: the router's tables (None: ``RouterConfig.for_window(gen_length, max_batch=B)``);
    padded_only: every group runs padded (classifier-free guidance, or a policy that needs it).
    """

    name = "router"
    fuses_choice = True

    def __init__(self, config: RouterConfig | None, state: BatchState, model, *, padded_only: bool) -> None:
        self.router = Router(config or RouterConfig.for_window(state.width, max_batch=max(1, state.batch_size)))
        self.model, self.padded_only = model, padded_only
        self.stats = RouterStats()
        self._group: tuple[tuple, PackedGroup] | None = None  # one layout at a time: rows and lengths change rarely
        self._buckets: dict[GraphKey, BucketInputs] = {}  # the static buckets served, allocated on first use
        self._bucket_layout: tuple | None = None  # the group whose inputs the buckets hold

    def forwards(self, state: BatchState, rows: list[int], step: int) -> list[Forward]:
        if state.window.cut_pending:
            return [padded_forward(state, rows, step)]  # Seer's step 0 (the cut happens inside it) runs padded
        lengths = state.window.lengths_of(rows)
        with prange("router/route"):
            route = self.router.route(lengths, check=False)
        self.stats.add(route)
        with prange(PATH_RANGES[route.path]):
            return self._path_forwards(state, rows, step, route, lengths)

    def _path_forwards(self, state: BatchState, rows: list[int], step: int, route: Route,
                       lengths) -> list[Forward]:
        """The forward of ``rows`` laid out on ``route``'s path (module docstring)."""
        static = route.path == PATH_STATIC
        if (static and not self.padded_only and state.prefix_cache and state.width <= self.router.config.n_max
                and route.key.length <= state.width):
            return [self._bucket_forward(state, rows, step, route.key)]
        if static or self.padded_only:
            fwd = padded_forward(state, rows, step, min(state.width, route.key.length) if static else max(lengths))
        else:
            fwd = self._packed_forward(state, rows, step, route)
        fwd.keep = max(lengths)
        return [fwd]

    def merge(self, state: BatchState, rows: list[int], forwards: list[Forward], logits: list[torch.Tensor]):
        return logits[0]

    def report(self) -> dict:
        return {"router": self.stats.as_dict()}

    def release(self) -> None:
        self._group = self._bucket_layout = None
        self._buckets.clear()

    # -- static groups over a bucket's persistent inputs ------------------------------------------
    def _bucket_forward(self, state: BatchState, rows: list[int], step: int, key: GraphKey) -> Forward:
        """``rows`` padded to the bucket ``key`` (``key.batch`` rows of ``key.length`` positions),
        the prompt from the prefix cache; a step writes its window ids into the bucket's buffers."""
        inputs = self._buckets.get(key)
        if inputs is None:  # one bucket's buffers at a time: the previous ones go first
            self._buckets.clear()
            self._bucket_layout = None
            model, prefix = self.model, state.prefix
            inputs = self._buckets[key] = BucketInputs(
                key.batch, key.length, state.prompt_len, layers=model.num_layers, kv_heads=model.num_kv_heads,
                head_dim=model.head_dim, kv_dtype=prefix.keys[0].dtype, pad_id=state.token_ids.pad,
                device=state.device)
        index, width = state.row_index(rows), key.length
        lengths = state.window.lengths_of(rows)

        def prepare() -> None:  # outside the unit: what stays while the rows, their windows and the key do
            layout_id = (tuple(rows), lengths, key)
            if self._bucket_layout is None or self._bucket_layout[0] != layout_id:
                prefix = state.prefix
                live = state.window.live_mask(index, width)
                prompt_keys = state.prompt_keys(None if prefix.key_mask is None else prefix.key_mask[index], len(rows))
                pad = torch.full((), state.token_ids.pad, dtype=torch.long, device=state.device)
                inputs.write(torch.where(live, state.tokens[index, :width], pad),
                             state.positions[index, state.prompt_len: state.prompt_len + width],
                             torch.cat([prompt_keys, live], dim=1), prefix.keys, prefix.values, index)
                self._bucket_layout = (layout_id, live, pad, inputs.ids[: len(rows)])
            else:  # the same layout: this step's window ids into the ids buffer, nothing else
                _, live, pad, ids = self._bucket_layout
                torch.where(live, state.tokens[index, :width], pad, out=ids)

        def build(fwd: Forward) -> None:
            fwd.hidden = self.model.embed(inputs.ids)
            fwd.layout = PaddedLayout(inputs.positions, inputs.key_mask)
            fwd.prefix = PrefixKV(inputs.keys, inputs.values, None, state.prompt_len)

        return Forward(rows, index, step, width, positions=key.batch * width, lengths=list(lengths), kind="bucket",
                       bucket=key, prepare=prepare, build=build, hooks=False)

    # -- packed groups -----------------------------------------------------------------------------
    def _packed_forward(self, state: BatchState, rows: list[int], step: int, route: Route) -> Forward:
        """A packed group's forward: its device work gathers the current tokens through the group's
        layout and scatters the window logits to ``[R, longest window, V]``."""
        lengths = state.window.lengths_of(rows)
        key = (tuple(rows), lengths, route.path, None if route.key is None else route.key.length)
        if self._group is None or self._group[0] != key:
            self._group = None
            self._group = (key, self._build_packed(state, rows, route))
        pg = self._group[1]
        fwd = Forward(rows, state.row_index(rows), step, max(lengths), positions=pg.capacity, lengths=list(lengths),
                      prompt_fed=not state.prefix_cache, kind="packed", detail=(route.path, pg.capacity))
        if state.prefix_cache:
            fwd.prefix = state.prefix_rows(rows)
        fwd.layout = pg.layout

        def build(f: Forward) -> None:
            flat = state.tokens.reshape(-1)
            tokens = torch.where(pg.src_index >= 0, flat[pg.src_index.clamp(min=0)],
                                 torch.full_like(pg.src_index, state.token_ids.pad))
            f.hidden = self.model.embed(tokens)
            if pg.prompt_rows is not None:
                f.hidden[pg.prompt_rows] = state.prompt_embeds[pg.prompt_src[:, 0], pg.prompt_src[:, 1]]

        def head(f: Forward) -> torch.Tensor:
            logits = self.model.head(f.hidden[pg.logit_rows])
            out = logits.new_zeros((len(rows), f.width, logits.shape[-1]))
            out[pg.logit_dest[:, 0], pg.logit_dest[:, 1]] = logits
            return out

        fwd.build, fwd.head = build, head
        return fwd

    def _build_packed(self, state: BatchState, rows: list[int], route: Route) -> PackedGroup:
        """A group's packed layout, from host lengths alone (uploaded once per layout change)."""
        lens = torch.tensor([state.window[r] for r in rows])
        capacity = route.key.length if route.path == PATH_VARLEN else int(lens.sum())
        if state.prefix_cache:
            return self._build_packed_cached(state, rows, lens, route, capacity)
        # no cache: each sequence is the request's real prompt tokens, then its window
        lp, width, rows_t = state.prompt_len, state.width, torch.tensor(rows)
        prompt = torch.tensor([state.prompt_lengths[r] for r in rows])
        seq = prompt + lens
        starts = torch.cumsum(seq, 0) - seq
        capacity += int(prompt.sum())
        prompt_rows = torch.repeat_interleave(starts, prompt) + _ranks(prompt)
        prompt_pos = lp - torch.repeat_interleave(prompt, prompt) + _ranks(prompt)
        prompt_req = torch.repeat_interleave(rows_t, prompt)
        window_rows = torch.repeat_interleave(starts + prompt, lens) + _ranks(lens)
        window_req = torch.repeat_interleave(rows_t, lens)
        src = torch.full((capacity,), -1, dtype=torch.long)
        src[window_rows] = window_req * width + _ranks(lens)
        position_src = torch.full((capacity,), -1, dtype=torch.long)
        position_src[prompt_rows] = prompt_req * (lp + width) + prompt_pos
        position_src[window_rows] = window_req * (lp + width) + lp + _ranks(lens)
        logit_rows = window_logit_rows(starts + prompt, lens, prompt_fed=True, shift=self.model.logits_shift)
        logit_dest = torch.stack([torch.repeat_interleave(torch.arange(len(rows)), lens), _ranks(lens)], dim=1)
        up = state.device_tensor
        flat = up(position_src.tolist())
        positions = torch.where(flat >= 0, state.positions.reshape(-1)[flat.clamp(min=0)], 0)
        cu = up(torch.cat([starts, starts[-1:] + seq[-1:]]).tolist(), torch.int32)
        layout = PackedLayout(positions, cu, cu, int(seq.max()), int(seq.max()))
        return PackedGroup(layout, up(src.tolist()), capacity, up(logit_rows.tolist()), up(_pairs(logit_dest)),
                           up(prompt_rows.tolist()), up(_pairs(torch.stack([prompt_req, prompt_pos], 1))))

    def _build_packed_cached(self, state: BatchState, rows: list[int], lens: torch.Tensor, route: Route,
                             capacity: int) -> PackedGroup:
        cfg = self.router.config
        index = state.row_index(rows)
        # the fused kernel routes the group on the device by the rule the router applied on the host
        # (``slice_repack_decision``: the same path and bucket) and writes its packed layout; the host
        # knows the decision already and reads nothing back
        out = slice_repack(state.tokens, state.window.device_lengths(),
                           positions=state.positions[:, state.prompt_len: state.prompt_len + state.width].contiguous(),
                           row_ids=index.to(torch.int32), micro_buckets=cfg.micro_buckets,
                           packed_buckets=cfg.packed_buckets, batch_buckets=cfg.batch_buckets, tau_pad=cfg.tau_pad,
                           eager_max_bucket=cfg.eager_max_bucket, pad_value=state.token_ids.pad, check=False)
        cu_q = out.cu_seqlens[: len(rows) + 1].clone()
        src = out.packed_src_index[:capacity].clone()
        positions = out.packed_positions[:capacity].clone()
        prefix_len = torch.tensor([state.prompt_lengths[r] for r in rows])  # the cached prefix's real positions
        seq_k = prefix_len + lens
        q_start, k_start = torch.cumsum(lens, 0) - lens, torch.cumsum(seq_k, 0) - seq_k
        prefix_start = torch.cumsum(prefix_len, 0) - prefix_len
        # the keys of sequence g: its cached prefix, then its own window (packed after every prefix)
        key_index = torch.empty(int(seq_k.sum()), dtype=torch.long)
        key_index[torch.repeat_interleave(k_start, prefix_len) + _ranks(prefix_len)] = (
            torch.repeat_interleave(prefix_start, prefix_len) + _ranks(prefix_len))
        key_index[torch.repeat_interleave(k_start + prefix_len, lens) + _ranks(lens)] = (
            int(prefix_len.sum()) + torch.repeat_interleave(q_start, lens) + _ranks(lens))
        logit_rows = window_logit_rows(q_start, lens, prompt_fed=False, shift=self.model.logits_shift)
        logit_dest = torch.stack([torch.repeat_interleave(torch.arange(len(rows)), lens), _ranks(lens)], dim=1)
        up = state.device_tensor
        cu_k = up(torch.cat([k_start, k_start[-1:] + seq_k[-1:]]).tolist(), torch.int32)
        layout = PackedLayout(positions, cu_q, cu_k, int(lens.max()), int(seq_k.max()), up(key_index.tolist()))
        return PackedGroup(layout, src, capacity, up(logit_rows.tolist()), up(_pairs(logit_dest)))
