"""The model runner: one forward of some requests, from its layout to its window logits.

Where a forward runs: :meth:`ModelRunner.run`. A step's rows are laid out by the composed layout
(:class:`PaddedLayouts` by default: the rows padded to their longest window; the router's and the
block caches' layouts lay them out packed, padded to a bucket, or as a cached span), each
:class:`Forward` then runs the same way: the policies plan it (what it feeds, under which graph
key it may replay: ``policy.Policy.plan``), its statistics are charged (here and only here), and
its device work - inputs, the layer loop with the policies' layer hooks, the NaN/inf watch, the
window logits, guidance and, when the step's token choice can join it, the choice - runs through
the graphs (``graphs.Graphs``): eagerly at its first sight, captured at the second, replayed after.

Step 0 may cut the windows inside its forward (Seer, after its probe layer: the runner narrows
the forward and the later layers run on the survivors) or from its logits; the runner applies
the new lengths to the windows and returns the cut with the logits, for the scheduler to plan.

The prefix KV cache runs the prompt (text and image) once (:meth:`ModelRunner.prefill`), attending
only to itself; every step then runs the window alone against the cached keys/values. It is exact
for a model trained with a prefix-LM mask and an approximation otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from .adapter import PackedLayout, PaddedLayout, PrefixKV, Taps
from .batch import BatchState
from .finite_check import FiniteCheck
from .graphs import Graphs
from .profiling import prange


@dataclass
class Cut:
    """New window lengths decided during a forward (``lengths``: request -> positions kept);
    ``narrow_logits``: the forward's logits are cut to the longest window left."""

    lengths: dict[int, int]
    narrow_logits: bool = False


@dataclass
class Forward:
    """One forward pass of some requests, from its plan to its logits.

    rows: the requests (global indices, ascending); index: the same as an int64 device tensor;
    step: the denoising step; width: window positions laid out per row (the longest window of
    ``rows``, or a bucket). ``feed_prompt``: without a prefix cache, whether the prompt rows are
    fed (a policy may clear it in ``plan``). Charged on the host when planned: ``positions`` (one
    layer's positions, padding included), ``lengths`` (each row's window positions) and
    ``prompt_fed`` (the requests' own prompt positions computed too).
    Set when laid out: ``hidden``, ``layout``, ``prefix`` (a prefix KV cache), ``offset`` (prompt
    positions before the window in ``hidden``), ``rope``, ``cfg`` (the unconditional copy
    appended), ``first_state`` (Dream, a window fed without its prompt: the state predicting
    window position 0).
    How a layout runs it: ``kind`` and ``detail`` (its graph key's own part), ``keyed`` (False:
    always eager), ``bucket`` (a bucket unit: replayed under this key whatever its rows, its
    inputs written by ``prepare`` outside the unit), ``build`` / ``head`` (device work laying
    out the inputs and giving the window logits ``[R, W, V]``; None: the padded forward's),
    ``keep`` (the window logits kept: the live part of a bucket's width), ``hooks`` (whether the
    policies see it), ``layer_hook`` (the layout's own layer hook). ``cut``: the windows cut during it.
    """

    rows: list[int]
    index: torch.Tensor | None
    step: int
    width: int
    feed_prompt: bool = True
    positions: int = 0
    lengths: list[int] = field(default_factory=list)
    prompt_fed: bool = False
    hidden: torch.Tensor | None = None
    layout: PaddedLayout | PackedLayout | None = None
    prefix: PrefixKV | None = None
    offset: int = 0
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    cfg: bool = False
    first_state: torch.Tensor | None = None
    kind: str = "padded"
    detail: tuple = ()
    keyed: bool = True
    bucket: Hashable | None = None
    prepare: Callable[[], None] | None = None
    build: Callable[[Forward], None] | None = None
    head: Callable[[Forward], torch.Tensor] | None = None
    keep: int | None = None
    hooks: bool = True
    layer_hook: object | None = None
    cut: Cut | None = None


def padded_forward(state: BatchState, rows: list[int], step: int, width: int | None = None) -> Forward:
    """A forward of ``rows`` padded to ``width`` window positions (default: their longest window)."""
    width = state.window.longest(rows) if width is None else width
    return Forward(rows, state.row_index(rows), step, width)


@dataclass(frozen=True)
class StepChoice:
    """A step's token choice as a graph can hold it with the forward (``commit.CommitRule.choice``).

    detail: what the host decided for it (counts, blocks, ...), part of the unit's graph key.
    choose: ``choose(logits [R, W, V]) -> result``: device work only, commits the chosen tokens
        into the windows; its result tensor is what the unit returns.
    commit: ``commit(result)``: the host's bookkeeping after the unit ran or replayed.
    """

    detail: tuple
    choose: Callable[[torch.Tensor], torch.Tensor]
    commit: Callable[[torch.Tensor], None]


class PaddedLayouts:
    """The default layout: a step's rows padded to their longest window, one forward."""

    name = "padded"
    fuses_choice = True

    def forwards(self, state: BatchState, rows: list[int], step: int) -> list[Forward]:
        return [padded_forward(state, rows, step)]

    def merge(self, state: BatchState, rows: list[int], forwards: list[Forward], logits: list[torch.Tensor]):
        return logits[0]

    def report(self) -> dict:
        return {}

    def release(self) -> None:
        pass


def add_unconditional_copy(fwd: Forward, mask_embed: torch.Tensor) -> None:
    """Classifier-free guidance: ``fwd``'s rows followed by their unconditional copy (every prompt
    position, pads too, replaced by ``mask_embed``, as LLaDA's generator does); ``fwd.cfg`` set."""
    uncond = fwd.hidden.clone()
    uncond[:, : fwd.offset] = mask_embed
    fwd.hidden = torch.cat([fwd.hidden, uncond], dim=0)
    layout = fwd.layout
    fwd.layout = PaddedLayout(torch.cat([layout.positions] * 2),
                              None if layout.key_mask is None else torch.cat([layout.key_mask] * 2))
    fwd.cfg = True


def combine_guidance(logits: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """``[2B, ...]`` logits (conditional rows, then their unconditional copies) -> ``[B, ...]``:
    ``uncond + (cfg_scale + 1) * (cond - uncond)``."""
    cond, uncond = logits.chunk(2, dim=0)
    return uncond + (cfg_scale + 1) * (cond - uncond)


class ModelRunner:
    """Runs the forwards of one ``generate`` call (module docstring) on ``model`` for ``state``:
    ``policies`` in their composed order, ``layouts`` (how a step's rows are laid out), ``graphs``."""

    def __init__(self, model, state: BatchState, *, policies: Sequence = (), layouts=None,
                 graphs: Graphs, check_finite: bool = True) -> None:
        self.model, self.state = model, state
        self.policies = tuple(policies)
        self.layouts = layouts if layouts is not None else PaddedLayouts()
        self.graphs = graphs
        self.num_layers = int(model.num_layers)
        self.logits_shift = int(model.logits_shift)
        self.finite = FiniteCheck(self.num_layers, state.device) if check_finite else None
        self.mask_embed = None
        self._bucket = None  # the bucket whose graphs are held
        state.graph_counters = graphs.counters  # for the observers (measurements), read only

    # -- set-up ------------------------------------------------------------------------------------
    def embed_prompt(self, attention_mask: torch.Tensor | None, images) -> None:
        """The prompts (and images) embedded, and the positions of prompt and window."""
        state = self.state
        t0 = time.perf_counter()
        with prange("embed"):
            embeds, mask = self.model.embed_prompt(state.input_ids, attention_mask, images)
        state.stats.add_time("embed", time.perf_counter() - t0)
        state.set_prompt(embeds, mask, positions=None)
        state.positions = self.model.position_ids(state.full_mask(), state.prompt_len + state.width,
                                                  state.batch_size, state.device)
        if state.gen.cfg_scale > 0:
            self.mask_embed = self.model.embed(torch.tensor([state.token_ids.mask], device=state.device))[0]

    def prefill(self) -> None:
        """The prompt's KV cache, computed once (``state.prefix``); LaViDa-Dream's first window
        token from the prefill's last logits."""
        state = self.state
        t0 = time.perf_counter()
        with prange("prefill"):
            state.prefix, hidden = self.model.prefill(state.prompt_embeds, state.prompt_mask,
                                                      state.positions[:, : state.prompt_len])
        if state.prefix.key_mask is not None:  # the real prefix tokens' count is known here: no read later
            state.prefix.real_index = torch.nonzero_static(state.prefix.key_mask.reshape(-1),
                                                           size=sum(state.prompt_lengths)).squeeze(1)
        state.stats.nfe += 1
        charged = state.batch_size * state.prompt_len * self.num_layers
        state.stats.positions_computed += charged
        state.stats.positions_computed_dense += charged
        for b in range(state.batch_size):
            state.positions_per_request[b] += state.prompt_lengths[b] * self.num_layers
        if state.rules.first_token_from_prefill:
            logits = self.model.head(hidden[:, -1:])
            state.tokens[:, 0] = logits[:, 0].argmax(dim=-1)
            state.first_masked = 1
        state.stats.add_time("prefill", time.perf_counter() - t0)

    # -- a step's forwards -------------------------------------------------------------------------
    def run(self, rows: list[int], step: int, choice: StepChoice | None = None) -> tuple:
        """The step's forward(s) of ``rows``: ``(logits [R, W', V], None, cut)``, or with ``choice``
        (when the layout runs one forward the choice can join) ``(None, result, None)`` once the
        choice ran inside the forward's unit. A forward that cannot be replayed returns its
        logits, the choice left to the caller."""
        forwards = self.layouts.forwards(self.state, rows, step)
        if choice is not None and len(forwards) == 1 and self.layouts.fuses_choice:
            return self._run(forwards[0], choice)
        logits = [self._run(fwd)[0] for fwd in forwards]
        cut = next((fwd.cut for fwd in forwards if fwd.cut is not None), None)
        return self.layouts.merge(self.state, rows, forwards, logits), None, cut

    def _run(self, fwd: Forward, choice: StepChoice | None = None) -> tuple:
        parts = self._plan(fwd)
        self.charge(fwd)
        if fwd.prepare is not None:
            fwd.prepare()
        if fwd.bucket is not None:
            return self._run_bucket(fwd, choice)
        key = None
        if parts is not None and fwd.keyed and self.graphs.backend is not None:
            key = (fwd.kind, *fwd.detail, *(choice.detail if choice else ()), tuple(fwd.rows),
                   self.state.window.lengths_of(fwd.rows), fwd.width, fwd.feed_prompt, *parts)
        if key is None or choice is None:
            with prange("forward"):
                logits = self.graphs.run(key, lambda: self._compute(fwd))
            return self._finish(fwd, logits), None, fwd.cut
        with prange("forward"):
            result = self.graphs.run(key, lambda: choice.choose(self._compute(fwd)))
        self._after_forward(fwd)
        return None, result, None

    def _run_bucket(self, fwd: Forward, choice: StepChoice | None) -> tuple:
        """A bucket unit (its inputs in persistent buffers): replayed under its bucket alone; a
        token choice reads its static logits in a unit of its own, keyed by the capture."""
        rows, graphs, longest = fwd.rows, self.graphs, max(fwd.lengths)
        if fwd.bucket != self._bucket:  # one bucket's graphs at a time, as its layout keeps one's buffers
            graphs.drop(lambda key: key[0] in ("bucket", "bucket+chosen"))
            self._bucket = fwd.bucket
        logits = graphs.run(("bucket", fwd.bucket), lambda: self._compute(fwd))[: len(rows), :longest]
        if choice is None:
            return logits.clone(), None, None
        capture = graphs.capture_id(("bucket", fwd.bucket))
        key = None if capture is None else ("bucket+chosen", *choice.detail, tuple(rows),
                                            self.state.window.lengths_of(rows), fwd.bucket, capture)
        with prange("sample"):
            return None, graphs.run(key, lambda: choice.choose(logits)), None

    def _plan(self, fwd: Forward) -> list | None:
        """Every policy's plan of ``fwd`` (its graph-key parts, None when one cannot replay it);
        a padded forward's charge, decided on the host once the policies said what it feeds."""
        parts: list | None = []
        if fwd.hooks:
            for p in self.policies:
                part = p.plan(self.state, fwd)
                if part is None:
                    parts = None
                elif parts is not None:
                    parts.append(part)
        if fwd.build is None:
            state = self.state
            offset = 0 if state.prefix_cache or not fwd.feed_prompt else state.prompt_len
            fwd.positions = len(fwd.rows) * (offset + fwd.width) * (2 if state.gen.cfg_scale > 0 else 1)
            fwd.lengths = list(state.window.lengths_of(fwd.rows))
            fwd.prompt_fed = offset > 0
        return parts

    def _finish(self, fwd: Forward, logits: torch.Tensor) -> torch.Tensor:
        """The host's part after a forward ran or replayed: the policies' logits hooks (a cut among
        them: applied here), then their bookkeeping."""
        if fwd.hooks:
            for p in self.policies:
                cut = p.on_logits(self.state, fwd, logits)
                if cut is not None:
                    self.apply_cut(cut, fwd)
                    if cut.narrow_logits:
                        logits = logits[:, : self.state.window.longest()]
        self._after_forward(fwd)
        return logits

    def _after_forward(self, fwd: Forward) -> None:
        if fwd.hooks:
            for p in self.policies:
                p.after_forward(self.state, fwd)

    def charge(self, fwd: Forward, layers: int | None = None, sign: int = 1) -> None:
        """The statistics of ``fwd`` over ``layers`` layers (default: all, and one forward pass):
        ``positions`` per layer, each request its window (and its prompt when fed); a policy that
        computes fewer rows than it was given says so when the call reports
        (``Policy.saved_positions``)."""
        state, n = self.state, self.num_layers if layers is None else layers
        state.stats.positions_computed += sign * fwd.positions * n
        state.stats.positions_computed_dense += sign * fwd.positions * n
        for r, length in zip(fwd.rows, fwd.lengths):
            state.positions_per_request[r] += sign * (length + (state.prompt_lengths[r] if fwd.prompt_fed else 0)) * n
        if layers is None:
            state.stats.nfe += 1

    # -- the device work of one forward ------------------------------------------------------------
    def _compute(self, fwd: Forward) -> torch.Tensor:
        """Lay out, every layer, the window logits (checked, guidance applied)."""
        if fwd.build is None:
            self.lay_out(fwd)
        else:
            fwd.build(fwd)
        self.run_layers(fwd)
        logits = self.window_logits(fwd) if fwd.head is None else fwd.head(fwd)
        if self.finite is not None:
            self.finite.logits(logits)
        if fwd.cfg:
            logits = combine_guidance(logits, self.state.gen.cfg_scale)
        return logits if fwd.keep is None else logits[:, : fwd.keep]

    def lay_out(self, fwd: Forward) -> None:
        """Embeddings, layout and prefix of a padded forward over the first ``fwd.width`` window
        positions of ``fwd.rows``, the prompt in front unless the prefix cache holds it or the
        forward does not feed it; with classifier-free guidance the unconditional copy appended."""
        state, index, width = self.state, fwd.index, fwd.width
        live = state.window.live_mask(index, width)
        emb = self.model.embed(state.tokens[index, :width])
        all_live = min(fwd.lengths) >= width  # decided on the host: no read
        if state.prefix_cache or not fwd.feed_prompt:
            prefix, key_mask = None, None if all_live else live
            if state.prefix_cache:
                prefix = state.prefix_rows(fwd.rows)
                if prefix.key_mask is not None or not all_live:
                    key_mask = torch.cat([state.prompt_keys(prefix.key_mask, len(fwd.rows)), live], dim=1)
            fwd.hidden, fwd.prefix, fwd.offset = emb, prefix, 0
            fwd.layout = PaddedLayout(state.positions[index, state.prompt_len: state.prompt_len + width], key_mask)
        else:
            pmask = None if state.prompt_mask is None else state.prompt_mask[index]
            key_mask = None
            if pmask is not None or not all_live:
                key_mask = torch.cat([state.prompt_keys(pmask, len(fwd.rows)), live], dim=1)
            fwd.hidden = torch.cat([state.prompt_embeds[index], emb], dim=1)
            fwd.prefix, fwd.offset = None, state.prompt_len
            fwd.layout = PaddedLayout(state.positions[index, : state.prompt_len + width], key_mask)
        if state.gen.cfg_scale > 0:
            add_unconditional_copy(fwd, self.mask_embed)

    def run_layers(self, fwd: Forward) -> None:
        """The layer loop with the layer hooks of the policies (``Policy.layers``) and the layout."""
        hooks = [h for h in (p.layers(self.state, fwd) for p in self.policies) if h is not None] if fwd.hooks else []
        if fwd.layer_hook is not None:
            hooks.append(fwd.layer_hook)
        for h in hooks:
            h.before(fwd)
        if fwd.rope is None:
            fwd.rope = self.model.rope(fwd.layout.positions)
        model, finite = self.model, self.finite
        with prange("layers"):
            for i in range(self.num_layers):
                taps = Taps()
                for h in hooks:
                    h.taps(i, taps)
                fwd.hidden = model.layer(i, fwd.hidden, fwd.layout, rope=fwd.rope, prefix=fwd.prefix,
                                         taps=taps if taps.requested else None)
                cut = None
                for h in hooks:
                    cut = h.after(i, fwd, taps) or cut
                if cut is not None:
                    self.apply_cut(cut, fwd, after_layer=i)
                if finite is not None:
                    finite.layer(i, fwd.hidden)
            if finite is not None:
                finite.end_layers()
        for h in hooks:
            h.end(fwd)

    def apply_cut(self, cut: Cut, fwd: Forward, *, after_layer: int | None = None) -> None:
        """The windows take ``cut``'s lengths; inside the layer loop (after ``after_layer``) the
        forward is narrowed to them (the later layers run, and are charged, on the survivors)."""
        for b, n in cut.lengths.items():
            self.state.window.set(b, n)
        fwd.cut = cut if fwd.cut is None else Cut({**fwd.cut.lengths, **cut.lengths}, fwd.cut.narrow_logits
                                                  or cut.narrow_logits)
        if after_layer is not None:
            self._narrow(fwd, after_layer)

    def _narrow(self, fwd: Forward, after_layer: int) -> None:
        """Re-lay a padded forward to its rows' current (shorter) windows after ``after_layer`` ran
        on the old width; the later layers are charged for the narrower layout."""
        state = self.state
        width = state.window.longest(fwd.rows)
        keep = fwd.offset + width
        later = self.num_layers - after_layer - 1
        self.charge(fwd, later, sign=-1)
        fwd.hidden = fwd.hidden[:, :keep]
        cos, sin = fwd.rope
        fwd.rope = (cos[:, :keep], sin[:, :keep])
        live = state.window.live_mask(fwd.index, width)
        rows = len(fwd.rows)
        key_mask = fwd.layout.key_mask
        lead = key_mask[:rows, : key_mask.shape[1] - fwd.width] if key_mask is not None else state.prompt_keys(
            None, rows)  # prompt keys (cached or not) first
        fwd.lengths = list(state.window.lengths_of(fwd.rows))
        all_keys = min(fwd.lengths) >= width and all(state.prompt_lengths[r] == state.prompt_len for r in fwd.rows)
        key_mask = torch.cat([lead, live], dim=1)
        if fwd.cfg:
            key_mask = torch.cat([key_mask, key_mask])
        fwd.layout = PaddedLayout(fwd.layout.positions[:, :keep], None if all_keys else key_mask)
        fwd.width = width
        fwd.positions = fwd.hidden.shape[0] * fwd.hidden.shape[1]
        self.charge(fwd, later)

    def window_logits(self, fwd: Forward) -> torch.Tensor:
        """Logits of the window's positions, shifted for Dream (the state at i predicts i+1): with
        the prompt fed, position j reads the state at j - 1 (the prompt's last for j = 0); a window
        fed alone reads its own j - 1, position 0 the state before the window (``first_state``,
        DyLLM) or, with a prefix cache, its own."""
        hidden, offset, width = fwd.hidden, fwd.offset, fwd.width
        if fwd.first_state is not None:
            return self.model.head(torch.cat([fwd.first_state[:, None], hidden[:, : width - 1]], dim=1))
        if self.logits_shift == 0:
            return self.model.head(hidden[:, offset: offset + width])
        if offset > 0:
            return self.model.head(hidden[:, offset - 1: offset + width - 1])
        raw = self.model.head(hidden[:, :width])
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    # -- the call's end ------------------------------------------------------------------------------
    def end_step(self, step: int) -> None:
        if self.finite is not None:
            self.finite.end_step(step)

    def report(self) -> dict:
        out = dict(self.layouts.report())
        if self.graphs.backend is not None:
            out["graphs"] = self.graphs.counters.as_dict()
        return out

    def release(self) -> None:
        """Every graph of the call released, the layouts' buffers and caches let go."""
        self.graphs.clear()
        self.layouts.release()
