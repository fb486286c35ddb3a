"""The denoising loop of one ``generate`` call (:class:`DecodeRun`), for every model family.

The engine owns the response windows, the step plans, the layer loop and sampling; it drives a
model only through the adapter contract (``adapter.DiffusionAdapter``) and calls its policies
(``policy.DecodePolicy``) at the fixed points listed there. One step: pick the active rows, run
their forward (a policy's ``execute``, or :meth:`DecodeRun.forward`: the rows padded to their
longest window), commit tokens (``sampling``), then ``after_step``.

Reference behaviour per family (``reference/MODELS.md``; ``plans.DecodingRules``): LLaDA and
MMaDA as ML-GSAI/LLaDA's ``generate.py`` (blocks, Gumbel-max in float64, low_confidence /
random remasking, CFG, the EOS knobs); Dream as ``diffusion_generate`` (shifted logits, one
global schedule, origin / maskgit_plus / topk_margin / entropy); LaViDa-LLaDA and LaViDa-Dream
with LaViDa's changes (schedules, margin / entropy remasking, finished blocks skipped, float64
softmax, the prefix KV cache, LaViDa-Dream's first token from the prefill).

The prefix KV cache runs the prompt (text and image) once, attending only to itself; every step
then runs the window alone against the cached keys/values. It is exact for a model trained with
a prefix-LM mask and an approximation otherwise; without it every step recomputes everything.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .adapter import PackedLayout, PaddedLayout, PrefixKV, Taps
from .config import GenerationConfig
from .finite_check import FiniteCheck
from .plans import DecodingRules, StepPlan, dream_plan, llada_plan, threshold_step
from .profiling import prange
from .sampling import NEG_INF, RandomSource, dream_sample_tokens, llada_step, select_topk, threshold_picks
from .schedules import dream_count
from .step_graphs import ForwardGraphs, resolve_backend
from .window import WindowState


# ------------------------------------------------------------------------------------ outputs
@dataclass(frozen=True)
class StepChoice:
    """A step's token choice as a graph can hold it with the forward (``DecodeRun.step_choice``).

    detail: what the host decided for it (counts, blocks, ...), part of the forward's graph key.
    choose: ``choose(logits [R, W, V]) -> result``: device work only, commits the chosen tokens
        into the run's windows; its result tensor is what the unit returns.
    commit: ``commit(result)``: the host's bookkeeping after the unit ran or replayed.
    """

    detail: tuple
    choose: Callable[[torch.Tensor], torch.Tensor]
    commit: Callable[[torch.Tensor], None]


@dataclass
class GenerationStats:
    """Counts and timings of one ``generate`` call.

    nfe: forward passes of the model (a CFG pair counts once; the prefill counts once).
    tokens_computed: positions processed by the transformer, summed over forward passes and
        layers, padding included (what the hardware paid for).
    tokens_computed_per_request: the same per request, its own real positions only.
    steps: denoising steps each request went through.
    time_s: wall time per phase (embed, prefill, forward, sample, total); on CUDA these are
        host times (no synchronisation is added for them).
    extra: the policies' reports (``seer``, ``dyllm``, ``router``, ``graphs``).
    """

    nfe: int = 0
    tokens_computed: int = 0
    tokens_computed_per_request: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    time_s: dict[str, float] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def add_time(self, phase: str, seconds: float) -> None:
        self.time_s[phase] = self.time_s.get(phase, 0.0) + seconds

    @property
    def engine_overhead_s(self) -> float:
        """Time of the call outside model forwards and prefill (sampling, bookkeeping)."""
        model = self.time_s.get("forward", 0.0) + self.time_s.get("prefill", 0.0) + self.time_s.get("embed", 0.0)
        return self.time_s.get("total", 0.0) - model


@dataclass
class GenerationOutput:
    """sequences: ``[B, L + gen_length]`` = the prompt ids as given (left padding, image
    placeholders) followed by the response window, the layout LLaDA's generate.py returns.
    responses: ``[B, gen_length]`` the window. end_positions: ``[B]`` index in the window of the
    first EOS or end-of-turn token, -1 when there is none.
    """

    sequences: torch.Tensor
    responses: torch.Tensor
    end_positions: torch.Tensor
    stats: GenerationStats
    end_ids: tuple[int, ...] = ()

    def answer_ids(self, i: int) -> list[int]:
        """Request ``i``'s answer: the window up to (not including) its first EOS / end-of-turn."""
        end = int(self.end_positions[i])
        row = self.responses[i].tolist()
        return row if end < 0 else row[:end]


#: the confidence ``dream_sample_tokens`` ranks by, per Dream ``alg`` that ranks (not ``origin``)
DREAM_CONFIDENCE = {"maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}


def first_end_positions(window: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Index of the first token in ``end_ids`` per row of ``window [B, W]``, -1 when absent."""
    is_end = torch.zeros_like(window, dtype=torch.bool)
    for t in end_ids:
        is_end |= window == t
    idx = torch.arange(window.shape[1], device=window.device).expand_as(window)
    first = torch.where(is_end, idx, torch.full_like(idx, window.shape[1])).min(dim=1).values
    return torch.where(first == window.shape[1], torch.full_like(first, -1), first)


def read_to_host(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Integer (or bool) device tensors as host int lists, in one read: flattened, concatenated
    and copied once (on CUDA through pinned memory, the only wait being the stream reaching it)."""
    parts = [t if t.dim() == 1 and t.dtype == torch.int64 else t.reshape(-1).to(torch.int64) for t in tensors]
    flat = parts[0] if len(parts) == 1 else torch.cat(parts)
    if flat.is_cuda:
        host = torch.empty(flat.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        torch.cuda.current_stream(flat.device).synchronize()
        values = host.tolist()
    else:
        values = flat.tolist()
    out, start = [], 0
    for t in tensors:
        out.append(values[start: start + t.numel()])
        start += t.numel()
    return out


# ------------------------------------------------------------------------------------ one forward
@dataclass
class Forward:
    """One forward pass of some requests, from its plan to its logits.

    rows: the requests (global indices, ascending); index: the same as an int64 device tensor
    (None for a captured graph's forward, whose rows are buffer slots);
    step: the denoising step; width: window positions laid out per row (the longest window of
    ``rows``, or a serving bucket). ``feed_prompt``: without a prefix cache, whether the prompt
    rows are fed (a policy may clear it in ``plan_forward``). Inputs, set when laid out:
    ``hidden``, ``layout``, ``prefix`` (a prefix KV cache), ``offset`` (prompt positions before
    the window in ``hidden``), ``rope`` (cos/sin of ``layout.positions``), ``cfg`` (the batch
    holds the unconditional copy too). ``lengths``: each row's window length when laid out.
    ``positions``: positions one layer computes (padding included), what the statistics charge
    per layer; ``prompt_fed``: the requests' own prompt positions are computed too.
    ``first_state``: when set, the hidden state that predicts window position 0 (Dream's shift,
    for a window fed without its prompt). ``hooks``: whether the layer loop calls the policies
    (False inside a captured CUDA graph, which replays tensor work only).
    """

    rows: list[int]
    index: torch.Tensor | None
    step: int
    width: int
    feed_prompt: bool = True
    hidden: torch.Tensor | None = None
    layout: PaddedLayout | PackedLayout | None = None
    prefix: PrefixKV | None = None
    offset: int = 0
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    cfg: bool = False
    lengths: list[int] = field(default_factory=list)
    positions: int = 0
    prompt_fed: bool = False
    first_state: torch.Tensor | None = None
    hooks: bool = True


# ------------------------------------------------------------------------------------ the run
class DecodeRun:
    """State of one ``generate`` call (``generation.generate`` builds and drives it).

    Public state the policies read and change: ``model``, ``gen``, ``rules``, ``token_ids``,
    ``batch_size``, ``width`` (``gen_length``), ``prompt_len`` (padded prompt positions, image
    features included), ``prompt_lengths`` (each request's real ones), ``prefix_cache``,
    ``logits_shift``, ``num_layers``, ``tokens`` (the windows' current ids, ``[B, width]``),
    ``window`` (:class:`WindowState`), ``plans`` (one :class:`StepPlan` per request),
    ``first_masked`` (the first window position denoising decodes: 1 for LaViDa-Dream), ``prefix``
    (the prompt's KV cache), ``positions`` (``[B, prompt_len + width]``), ``prompt_mask``,
    ``stats``.
    """

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, images,
                 gen: GenerationConfig, *, policies: Sequence = (), progress: bool = False, graphs="auto",
                 request_seeds: Sequence[int] | None = None):
        self.model, self.gen, self.progress = model, gen, progress
        self.policies = tuple(policies)
        self.rules = DecodingRules.of(model)
        self.token_ids = model.token_ids
        self.device = input_ids.device
        self.input_ids = input_ids
        self.stats = GenerationStats()
        self.batch_size = input_ids.shape[0]
        self.width = gen.gen_length
        self.prefix_cache = gen.prefix_cache if gen.prefix_cache is not None else bool(model.is_multimodal)
        self.logits_shift = int(model.logits_shift)
        self.num_layers = int(model.num_layers)
        if gen.rng == "per_request":  # one generator per request, on the run's device (no host round trip)
            base = 0 if gen.seed is None else gen.seed
            seeds = request_seeds if request_seeds is not None else [base + b for b in range(self.batch_size)]
            generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
            self.rand = RandomSource("per_request", generators)
        else:
            if gen.seed is not None:
                torch.manual_seed(gen.seed)
            self.rand = RandomSource("global")

        t0 = time.perf_counter()
        with prange("embed"):
            self.prompt_embeds, prompt_mask = model.embed_prompt(input_ids, attention_mask, images)
        self.stats.add_time("embed", time.perf_counter() - t0)
        self.prompt_len = self.prompt_embeds.shape[1]
        self.prompt_mask = None if prompt_mask is None else prompt_mask.bool()
        full_mask = None
        if self.prompt_mask is not None:
            full_mask = torch.cat([self.prompt_mask.long(), torch.ones(self.batch_size, self.width, dtype=torch.long,
                                                                       device=self.device)], dim=1)
        self.positions = model.position_ids(full_mask, self.prompt_len + self.width, self.batch_size, self.device)
        self.prompt_lengths = (self.prompt_mask.sum(1) if self.prompt_mask is not None
                               else torch.full((self.batch_size,), self.prompt_len, device=self.device)).tolist()
        self.tokens = torch.full((self.batch_size, self.width), self.token_ids.mask, dtype=torch.long,
                                 device=self.device)
        self.tokens_per_request = [0] * self.batch_size
        self.steps_done = [0] * self.batch_size
        self.prefix: PrefixKV | None = None
        self.first_masked = 0
        self._device_tensors: dict[tuple, torch.Tensor] = {}
        self._prefix_rows: tuple[tuple, PrefixKV] | None = None
        # masks left after a step, read at its end: (rows, counts, block starts) of the blocks a
        # threshold step worked in, or with block starts None of the whole window (Dream)
        self._masks_read: tuple[list[int], torch.Tensor, list[int] | None] | None = None
        # a Dream step's commit count per row with tie_break="stable" (int64 [B], made at the first
        # such step; its graph reads them here) and what was last written (:meth:`step_choice`)
        self._dream_row_counts: torch.Tensor | None = None
        self._dream_row_counts_written: tuple[int, ...] | None = None
        self.graphs = ForwardGraphs(resolve_backend(graphs, self.device))
        self._charges: dict[tuple, tuple[int, int, list[int]]] = {}  # per graph key: what a forward charges
        self.step_values: dict[str, list[int]] = {}
        if self.prefix_cache:
            self._prefill()
        self.window = WindowState(self.batch_size, self.width, self.device, block=gen.block,
                                  first_masked=self.first_masked)
        if gen.cfg_scale > 0:
            self.mask_embed = model.embed(torch.tensor([self.token_ids.mask], device=self.device))[0]
        self.plans = [self.make_plan(b, self.width) for b in range(self.batch_size)]
        # the reference's top-1 among equal confidences needs how many positions it ranked
        self._threshold_needs_candidates = gen.threshold is not None and gen.tie_break == "reference"
        self.finite = FiniteCheck(model.num_layers, self.device) if gen.check_finite else None

    # -- set-up -------------------------------------------------------------------------------
    def _prefill(self) -> None:
        t0 = time.perf_counter()
        with prange("prefill"):
            self.prefix, hidden = self.model.prefill(self.prompt_embeds, self.prompt_mask,
                                                     self.positions[:, : self.prompt_len])
        if self.prefix.key_mask is not None:  # the real prefix tokens' count is known here: no read later
            self.prefix.real_index = torch.nonzero_static(self.prefix.key_mask.reshape(-1),
                                                          size=sum(self.prompt_lengths)).squeeze(1)
        self.stats.nfe += 1
        self.stats.tokens_computed += self.batch_size * self.prompt_len * self.num_layers
        for b in range(self.batch_size):
            self.tokens_per_request[b] += self.prompt_lengths[b] * self.num_layers
        if self.rules.first_token_from_prefill:
            logits = self.model.head(hidden[:, -1:])
            self.tokens[:, 0] = logits[:, 0].argmax(dim=-1)
            self.first_masked = 1
        self.stats.add_time("prefill", time.perf_counter() - t0)

    def make_plan(self, b: int, window: int, *, start: int = 0) -> StepPlan:
        """A fresh plan for the masks of request ``b`` in window positions ``[start, window)``.
        With a threshold the plan is one step at a time: the first block holding a mask
        (:meth:`next_block`), planned again after every step (:meth:`replan_by_threshold`)."""
        if self.gen.threshold is not None:
            block = self.next_block(b, start, window)
            return StepPlan() if block is None else threshold_step(*block)
        if self.rules.family == "llada":
            return llada_plan(window, self.gen, start=start, first_mask=self.first_masked)
        masks = self.window.masks.left(b, start, window)
        return dream_plan(window, self.gen, self.rules, masks=masks, start=start,
                          positions=window if start == 0 else window - start)

    def next_block(self, b: int, start: int = 0, stop: int | None = None) -> tuple[int, int] | None:
        """``(start, end)`` of the first block of request ``b``'s live window (from ``start``) that
        still holds a mask, on the block grid (Dream: the whole window); None when none does."""
        stop = self.window[b] if stop is None else stop
        block = self.gen.block
        for grid_start in range(start - start % block, stop, block):
            lo, hi = max(grid_start, start), min(grid_start + block, stop)
            if lo < hi and self.window.masks.left(b, grid_start, hi):
                return lo, hi
        return None

    def replan_by_threshold(self, step: int) -> None:
        """Threshold decoding: after ``step``, each request's next step works in the first block of
        its window that still holds a mask (none: the request is done)."""
        for b in range(self.batch_size):
            head = self.plans[b].keep_first(step + 1)
            block = self.next_block(b)
            self.plans[b] = head if block is None else head.then(threshold_step(*block))

    def prefix_rows(self, rows: list[int]) -> PrefixKV:
        """The prompt cache of ``rows``: the whole cache for every request, else a copy of their
        rows, made once per distinct set of rows (the last one is kept)."""
        if len(rows) == self.batch_size:
            return self.prefix
        key = tuple(rows)
        if self._prefix_rows is None or self._prefix_rows[0] != key:
            real = sum(self.prompt_lengths[r] for r in rows)
            self._prefix_rows = (key, self.prefix.select(self.row_index(rows), real_tokens=real))
        return self._prefix_rows[1]

    def row_index(self, rows: list[int]) -> torch.Tensor:
        """``rows`` as an int64 device tensor, built once per distinct set of rows."""
        return self.device_tensor(rows)

    def device_tensor(self, values: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        """Host ints as a device tensor, uploaded once per distinct value list (index lists, block
        ends; through pinned memory, a copy the host does not wait for) and reused by every step
        that needs the same one."""
        key = (dtype, *values)
        t = self._device_tensors.get(key)
        if t is None:
            if len(self._device_tensors) >= 256:  # the lists change rarely; keep the table small
                self._device_tensors.clear()
            t = self._device_tensors[key] = self.upload(values, dtype)
        return t

    # -- one forward --------------------------------------------------------------------------
    def forward(self, rows: list[int], step: int, *, width: int | None = None) -> torch.Tensor:
        """Logits ``[R, W', V]`` of the windows of ``rows``, padded to ``width`` positions
        (default the longest window of ``rows``; positions past a row's window are masked)."""
        fwd = self.plan_padded(rows, step, width)
        with prange("forward"):
            logits = self.run_keyed(self.forward_key(fwd, "padded"), rows, lambda: self.compute_padded(fwd))
        return self.finish_forward(fwd, logits)

    def plan_padded(self, rows: list[int], step: int, width: int | None = None) -> Forward:
        """A padded forward of ``rows`` at ``step``, planned by every policy (``plan_forward``)."""
        fwd = Forward(rows, self.row_index(rows), step, self.window.longest(rows) if width is None else width)
        for p in self.policies:
            p.plan_forward(self, fwd)
        return fwd

    def compute_padded(self, fwd: Forward) -> torch.Tensor:
        """A planned padded forward's device work: layout, layers, window logits (guidance applied)."""
        self.lay_out(fwd)
        self.run_forward(fwd)
        return self.combine_guidance(self.check_logits(self.window_logits(fwd)), fwd.cfg)

    def check_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` join the NaN/inf watch (``GenerationConfig.check_finite``); returned as they are."""
        if self.finite is not None:
            self.finite.logits(logits)
        return logits

    def forward_and_sample(self, rows: list[int], step: int) -> bool:
        """The step's forward and its token choice as one graph unit, when the choice is a
        function of the logits and the plan alone (:meth:`step_choice`): the padded forward, or
        the first policy that runs forwards and takes the choice into its own graph unit
        (:meth:`~seer_runtime.policy.DecodePolicy.execute_and_choose`). False: not this step
        (the caller runs the forward and the sampling apart)."""
        if self.graphs.backend is None:
            return False
        choice = self.step_choice(rows, step)
        if choice is None:
            return False
        if any(p.runs_forwards for p in self.policies):
            for p in self.policies:
                if p.runs_forwards:
                    return p.execute_and_choose(self, rows, step, choice)
        fwd = self.plan_padded(rows, step)
        key = self.forward_key(fwd, "padded+chosen", *choice.detail)
        if key is None:
            logits = self.run_keyed(None, rows, lambda: self.compute_padded(fwd))
            self.sample(rows, self.finish_forward(fwd, logits), step)
            return True
        with prange("forward"):
            result = self.run_keyed(key, rows, lambda: choice.choose(self.compute_padded(fwd)))
        self.chosen_forward(fwd)
        choice.commit(result)
        return True

    def chosen_forward(self, fwd: Forward) -> None:
        """The host's part after a forward whose graph key holds the step's choice ran or
        replayed: ``after_forward`` (its logits stayed inside the unit: a keyed forward's
        ``on_logits`` would not have changed them, :meth:`~seer_runtime.policy.DecodePolicy.graph_key`)."""
        for p in self.policies:
            p.after_forward(self, fwd)

    def step_choice(self, rows: list[int], step: int) -> StepChoice | None:
        """The token choice of ``rows`` at ``step`` as device work with fixed shapes, when it is a
        function of the logits and the host's plan alone: LLaDA greedy (no temperature, no random
        remasking), Dream as :meth:`_dream_static_counts` allows; None otherwise. With
        ``tie_break="stable"`` a Dream step reads its rows' counts from a buffer written here (only
        when they change), so its graph key holds no count: one graph serves every step of a
        layout, rows committing different numbers of positions included."""
        g = self.gen
        if self.rules.family != "llada":
            counts = self._dream_static_counts(rows, step)
            if counts is None:
                return None
            k = counts[0]
            if g.tie_break == "stable":
                k = None  # each row's count, from the buffer
                written = tuple(counts)
                if self._dream_row_counts is None:
                    self._dream_row_counts = torch.zeros(self.batch_size, dtype=torch.long, device=self.device)
                if written != self._dream_row_counts_written:
                    self._dream_row_counts[: len(rows)].copy_(self.device_tensor(counts))
                    self._dream_row_counts_written = written

            def dream_left(left: torch.Tensor) -> None:  # the masks left are read at the step's end
                self._masks_read = (rows, left, None)
                self.window.masks.pending = True

            return StepChoice(("dream", "per-row" if k is None else k),
                              lambda logits: self._choose_dream(rows, logits, k), dream_left)
        if g.temperature > 0 or g.remasking == "random":
            return None
        plans = [self.plans[r] for r in rows]
        counts = tuple(p.counts[step] for p in plans)
        blocks = tuple((p.block_starts[step], p.block_ends[step]) for p in plans)
        candidates = self._block_candidates(rows, step) if self._threshold_needs_candidates else None
        return StepChoice(("llada", counts, blocks, None if candidates is None else tuple(candidates)),
                          lambda logits: self._choose_llada(rows, logits, step),
                          lambda chosen: self._count_llada_commits(rows, step, chosen))

    def finish_forward(self, fwd: Forward, logits: torch.Tensor) -> torch.Tensor:
        """The host's part after a forward ran (or replayed): ``on_logits``, then ``after_forward``."""
        for p in self.policies:
            logits = p.on_logits(self, fwd, logits)
        for p in self.policies:
            p.after_forward(self, fwd)
        return logits

    # -- graphs of forwards -----------------------------------------------------------------------
    def forward_key(self, fwd: Forward, kind: str, *detail) -> tuple | None:
        """The graph key of a planned forward (``step_graphs``): what the host decided for it
        (its kind and ``detail``, rows, window lengths, width, whether it feeds the prompt) and
        every policy's :meth:`~seer_runtime.policy.DecodePolicy.graph_key`; None (run eagerly)
        without a graph backend or when a policy's hooks cannot be replayed for it."""
        if self.graphs.backend is None:
            return None
        parts = []
        for p in self.policies:
            part = p.graph_key(self, fwd)
            if part is None:
                return None
            parts.append(part)
        return (kind, *detail, tuple(fwd.rows), self.window.lengths_of(fwd.rows), fwd.width, fwd.feed_prompt, *parts)

    def run_keyed(self, key: tuple | None, rows: list[int], compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``compute()`` (a forward's device work: it lays the forward out, runs it and charges
        its statistics) through the forward graphs under ``key``. A replay runs no Python, so the
        statistics the key's first forward charged are charged again."""
        if key is None:
            return self.graphs.run(None, compute)
        before = None  # the statistics just before compute() runs (a replay does not run it)

        def call() -> torch.Tensor:
            nonlocal before
            before = (self.stats.tokens_computed, self.stats.nfe, [self.tokens_per_request[r] for r in rows])
            return compute()

        out = self.graphs.run(key, call)
        if before is not None:
            self._charges[key] = (self.stats.tokens_computed - before[0], self.stats.nfe - before[1],
                                  [self.tokens_per_request[r] - n for r, n in zip(rows, before[2])])
        else:
            tokens, nfe, per_request = self._charges[key]
            self.stats.tokens_computed += tokens
            self.stats.nfe += nfe
            for r, n in zip(rows, per_request):
                self.tokens_per_request[r] += n
        return out

    def lay_out(self, fwd: Forward) -> None:
        """Embeddings, layout and prefix of a padded forward over the first ``fwd.width`` window
        positions of ``fwd.rows``, the prompt in front unless the prefix cache holds it or the
        forward does not feed it; with classifier-free guidance the unconditional copy appended."""
        index, width = fwd.index, fwd.width
        live = self.window.live_mask(index, width)
        emb = self.model.embed(self.tokens[index, :width])
        all_live = min(self.window[r] for r in fwd.rows) >= width  # decided on the host: no read
        fwd.lengths = [self.window[r] for r in fwd.rows]
        if self.prefix_cache or not fwd.feed_prompt:
            prefix = None
            key_mask = None if all_live else live
            if self.prefix_cache:
                prefix = self.prefix_rows(fwd.rows)
                if prefix.key_mask is not None or not all_live:
                    key_mask = torch.cat([self._prompt_keys(prefix.key_mask, len(fwd.rows)), live], dim=1)
            fwd.hidden, fwd.prefix, fwd.offset = emb, prefix, 0
            fwd.layout = PaddedLayout(self.positions[index, self.prompt_len: self.prompt_len + width], key_mask)
        else:
            pmask = None if self.prompt_mask is None else self.prompt_mask[index]
            key_mask = None
            if pmask is not None or not all_live:
                key_mask = torch.cat([self._prompt_keys(pmask, len(fwd.rows)), live], dim=1)
            fwd.hidden = torch.cat([self.prompt_embeds[index], emb], dim=1)
            fwd.prefix, fwd.offset = None, self.prompt_len
            fwd.layout = PaddedLayout(self.positions[index, : self.prompt_len + width], key_mask)
        fwd.positions = fwd.hidden.shape[0] * fwd.hidden.shape[1]
        fwd.prompt_fed = fwd.offset > 0
        if self.gen.cfg_scale > 0:
            self._add_guidance(fwd)

    def _prompt_keys(self, mask: torch.Tensor | None, rows: int) -> torch.Tensor:
        return mask if mask is not None else torch.ones(rows, self.prompt_len, dtype=torch.bool, device=self.device)

    def _add_guidance(self, fwd: Forward) -> None:
        """Classifier-free guidance: append the unconditional copy (every prompt position masked)."""
        uncond = fwd.hidden.clone()
        uncond[:, : fwd.offset] = self.mask_embed  # LLaDA masks every prompt position (pads too)
        fwd.hidden = torch.cat([fwd.hidden, uncond], dim=0)
        layout = fwd.layout
        fwd.layout = PaddedLayout(torch.cat([layout.positions] * 2),
                                  None if layout.key_mask is None else torch.cat([layout.key_mask] * 2))
        fwd.positions *= 2
        fwd.cfg = True

    def combine_guidance(self, logits: torch.Tensor, cfg: bool) -> torch.Tensor:
        if not cfg:
            return logits
        cond, uncond = logits.chunk(2, dim=0)
        return uncond + (self.gen.cfg_scale + 1) * (cond - uncond)

    def run_forward(self, fwd: Forward) -> torch.Tensor:
        """A laid-out forward through every layer: charges its positions, calls the policies
        before and after the layer loop, and returns (and leaves in ``fwd.hidden``) the final
        hidden state."""
        self.stats.tokens_computed += fwd.positions * self.num_layers
        for r, n in zip(fwd.rows, fwd.lengths):
            self.tokens_per_request[r] += (n + (self.prompt_lengths[r] if fwd.prompt_fed else 0)) * self.num_layers
        for p in self.policies:
            p.before_layers(self, fwd)
        if fwd.rope is None:
            fwd.rope = self.model.rope(fwd.layout.positions)
        self.run_layers(fwd)
        for p in self.policies:
            p.after_layers(self, fwd)
        self.stats.nfe += 1
        return fwd.hidden

    def run_layers(self, fwd: Forward) -> None:
        """The layer loop: each layer with the taps the policies ask for, then ``after_layer``."""
        model, policies = self.model, self.policies if fwd.hooks else ()
        with prange("layers"):
            for i in range(self.num_layers):
                taps = Taps()
                for p in policies:
                    p.layer_taps(self, fwd, i, taps)
                fwd.hidden = model.layer(i, fwd.hidden, fwd.layout, rope=fwd.rope, prefix=fwd.prefix,
                                         taps=taps if taps.requested else None)
                for p in policies:
                    p.after_layer(self, fwd, i, taps)
                if self.finite is not None:
                    self.finite.layer(i, fwd.hidden)
            if self.finite is not None:
                self.finite.end_layers()

    def narrow_forward(self, fwd: Forward, after_layer: int) -> None:
        """Re-lay a padded forward to its rows' current (shorter) windows after ``after_layer``
        ran on the old width (Seer's cut inside step 0); the later layers are charged for the
        narrower layout."""
        width = self.window.longest(fwd.rows)
        keep = fwd.offset + width
        old_positions, old_lengths = fwd.positions, fwd.lengths
        fwd.hidden = fwd.hidden[:, :keep]
        cos, sin = fwd.rope
        fwd.rope = (cos[:, :keep], sin[:, :keep])
        live = self.window.live_mask(fwd.index, width)
        rows = len(fwd.rows)
        key_mask = fwd.layout.key_mask
        lead = key_mask[:rows, : key_mask.shape[1] - fwd.width] if key_mask is not None else torch.ones(
            rows, self.prompt_len, dtype=torch.bool, device=self.device)  # prompt keys (cached or not) first
        all_keys = (min(self.window[r] for r in fwd.rows) >= width  # decided on the host: no read
                    and all(self.prompt_lengths[r] == self.prompt_len for r in fwd.rows))
        key_mask = torch.cat([lead, live], dim=1)
        if fwd.cfg:
            key_mask = torch.cat([key_mask, key_mask])
        key_mask = None if all_keys else key_mask
        fwd.layout = PaddedLayout(fwd.layout.positions[:, :keep], key_mask)
        fwd.width = width
        fwd.positions = fwd.hidden.shape[0] * fwd.hidden.shape[1]
        fwd.lengths = [self.window[r] for r in fwd.rows]
        later = self.num_layers - after_layer - 1
        self.stats.tokens_computed -= (old_positions - fwd.positions) * later
        for r, old, new in zip(fwd.rows, old_lengths, fwd.lengths):
            self.tokens_per_request[r] -= (old - new) * later

    def window_logits(self, fwd: Forward) -> torch.Tensor:
        """Logits of the window's positions, shifted for Dream (the state at i predicts i+1)."""
        hidden, offset, width = fwd.hidden, fwd.offset, fwd.width
        if fwd.first_state is not None:
            return self.model.head(torch.cat([fwd.first_state[:, None], hidden[:, : width - 1]], dim=1))
        if self.logits_shift == 0:
            return self.model.head(hidden[:, offset: offset + width])
        if offset > 0:  # full sequence: position j reads the state at j - 1 (the prompt's last for j = 0)
            return self.model.head(hidden[:, offset - 1: offset + width - 1])
        raw = self.model.head(hidden[:, :width])  # window only (prefix cache): Dream shifts within it
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    # -- sampling -----------------------------------------------------------------------------
    def masked(self, rows: list[int], width: int) -> torch.Tensor:
        """bool ``[R, width]``: still masked and inside the request's window."""
        index = self.row_index(rows)
        return (self.tokens[index, :width] == self.token_ids.mask) & self.window.live_mask(index, width)

    def reference_layout(self, rows: list[int], width: int) -> tuple[int, int | None]:
        """(pad, full_len) of the reference's per-row vectors, valid while every row is decoded."""
        pad = 0 if self.prefix_cache else self.prompt_len
        if len(rows) != self.batch_size or width != self.width:
            return pad, None
        return pad, pad + self.width

    def _dream_counts(self, rows: list[int], step: int, per_row: list[int]) -> list[int]:
        """Positions each row commits at ``step`` (Dream's rule), ``per_row`` its masks left."""
        counts, plans = [], self.plans
        for r, left in zip(rows, per_row):
            plan = plans[r]
            k = plan.counts[step]
            if k is None:
                t, s = plan.ts[step]
                k = dream_count(left, t, s, plan.last[step])
            counts.append(min(int(k), left))
        return counts

    def _dream_static_counts(self, rows: list[int], step: int) -> list[int] | None:
        """Each row's commit count at ``step`` when Dream's choice of tokens is a function of the
        logits and those counts alone, with fixed shapes: greedy tokens (no temperature, no
        ``alg_temp`` draw), ranked by confidence (not ``origin``), no threshold, and either the
        leftmost among equals (``tie_break="stable"``: any counts, one sort of each whole row) or
        ``torch.topk``'s ties over the whole row (a family that ranks every position) with the
        same count for every row; None otherwise (:meth:`_sample_dream` runs)."""
        g = self.gen
        if (g.temperature > 0 or g.alg == "origin" or g.threshold is not None
                or (g.alg_temp is not None and g.alg_temp > 0)
                or (g.tie_break != "stable" and self.rules.ranks_masked_only)):
            return None
        counts = self._dream_counts(rows, step, self.window.masks.window_left(rows))
        if g.tie_break != "stable" and any(c != counts[0] for c in counts):
            return None  # topk per row, each with its own ties
        return counts

    def _choose_dream(self, rows: list[int], logits: torch.Tensor, k: int | None) -> torch.Tensor:
        """Commit Dream's ``k`` most confident masked positions of each row into ``self.tokens``
        with fixed shapes (device work only: every position's token and confidence, the masked
        ones ranked; what :meth:`_sample_dream` commits, bitwise, where
        :meth:`_dream_static_counts` allows: every op works per row). ``k`` None
        (``tie_break="stable"``): row ``i`` commits ``self._dream_row_counts[i]`` (written by
        :meth:`step_choice`), its positions ranked by one stable sort of the row. Scoring every position
        rather than the masked ones costs ``R x width`` rows of the vocabulary each step where
        the eager path's cost shrinks with the masks left. Returns each row's masks left (int64
        ``[R]``)."""
        g = self.gen
        R, width = logits.shape[0], logits.shape[1]
        index = self.row_index(rows)
        window = self.tokens[index, :width]
        if k is None or k > 0:
            masked = self.masked(rows, width)
            kind = DREAM_CONFIDENCE[g.alg]
            conf, x0 = dream_sample_tokens(logits.reshape(R * width, -1), temperature=0.0, top_p=g.top_p,
                                           top_k=g.top_k, confidence=kind, rand=self.rand, item_counts=[width] * R,
                                           row_ids=rows)
            full_conf = torch.where(masked, conf.view(R, width).to(logits.dtype), NEG_INF)
            candidate = torch.where(masked, x0.view(R, width), window)
            if k is None:  # each row's own count: the positions whose rank in the row is below it
                order = torch.sort(full_conf, dim=1, descending=True, stable=True).indices
                rank = torch.empty_like(order).scatter_(
                    1, order, torch.arange(width, device=order.device).expand(R, width))
                window = torch.where(rank < self._dream_row_counts[:R, None], candidate, window)
            else:  # Dream ranks the whole [B, prompt + window] confidence matrix in one call
                pad, _ = self.reference_layout(rows, width)
                vec = torch.cat([full_conf.new_full((R, pad), NEG_INF), full_conf], dim=1) if pad else full_conf
                sel = torch.topk(vec, k, dim=-1).indices - pad
                window = window.scatter(1, sel, candidate.gather(1, sel))
            self.tokens[index, :width] = window
        return ((window == self.token_ids.mask) & self.window.live_mask(index, width)).sum(dim=1)

    def sample(self, rows: list[int], logits: torch.Tensor, step: int) -> None:
        if self.rules.family == "llada":
            self._sample_llada(rows, logits, step)
        else:
            self._sample_dream(rows, logits, step)

    def _sample_llada(self, rows, logits, step) -> None:
        self._count_llada_commits(rows, step, self._choose_llada(rows, logits, step))

    def _block_candidates(self, rows: list[int], step: int) -> list[int]:
        """Masked positions left in each row's current block (host counts)."""
        return [self.window.masks.left(r, self.plans[r].block_starts[step], self.plans[r].block_ends[step])
                for r in rows]

    def _count_llada_commits(self, rows: list[int], step: int, chosen: torch.Tensor) -> None:
        """A fixed count commits its number, or every mask its block has left (known on the host);
        with a threshold ``chosen`` is each row's masks left in its block, read at the step's end."""
        if self.gen.threshold is None:
            for r in rows:
                self.window.masks.commit(r, self.plans[r].block_starts[step], self.plans[r].counts[step])
            return
        self._masks_read = (rows, chosen, [self.plans[r].block_starts[step] for r in rows])
        self.window.masks.pending = True

    def _choose_llada(self, rows: list[int], logits: torch.Tensor, step: int) -> torch.Tensor:
        """Commit this step's tokens into ``self.tokens`` (device work only). Returns the new
        windows, or with a threshold each row's masks left in its block (int64 ``[R]``)."""
        g = self.gen
        width = logits.shape[1]
        masked = self.masked(rows, width)
        index = self.row_index(rows)
        block_end = self.device_tensor([self.plans[r].block_ends[step] for r in rows])
        counts = [self.plans[r].counts[step] for r in rows]
        pad, full_len = self.reference_layout(rows, width)
        candidates = self._block_candidates(rows, step) if self._threshold_needs_candidates else None
        block_start = (None if g.threshold is None
                       else self.device_tensor([self.plans[r].block_starts[step] for r in rows]))
        new = llada_step(
            logits, self.tokens[index, :width], masked, block_end, None if g.threshold is not None else counts,
            rows=rows, temperature=g.temperature, remasking=g.remasking, eos_id=self.token_ids.eos,
            eot_id=self.token_ids.eot, logits_eos_inf=g.logits_eos_inf, confidence_eos_eot_inf=g.confidence_eos_eot_inf,
            softmax_fp64=self.rules.softmax_fp64, tie_break=g.tie_break, pad=pad, rand=self.rand, full_len=full_len,
            threshold=g.threshold, candidates=candidates, block_start=block_start,
        )
        self.tokens[index, :width] = new
        if g.threshold is None:
            return new
        positions = torch.arange(width, device=self.device)
        in_block = (positions[None, :] >= block_start[:, None]) & (positions[None, :] < block_end[:, None])
        return ((new == self.token_ids.mask) & in_block).sum(dim=1)

    def _sample_dream(self, rows, logits, step) -> None:
        g = self.gen
        width = logits.shape[1]
        masked = self.masked(rows, width)
        index = self.row_index(rows)
        window = self.tokens[index, :width].clone()
        # the masked positions, row-major; their number per row is known on the host (no read)
        per_row = [self.window.masks.left(r) for r in rows]
        starts = [sum(per_row[:i]) for i in range(len(rows))]
        where = torch.nonzero_static(masked, size=sum(per_row))
        item_rows, item_pos = where[:, 0], where[:, 1]
        mask_logits = logits[item_rows, item_pos]
        if g.alg == "origin":
            p_transfer = self.upload([1.0 if self.plans[r].last[step] else float(1 - self.plans[r].ts[step][1]
                                                                                / self.plans[r].ts[step][0])
                                      for r in rows], torch.float32)
            draws = self._uniform_items(rows, per_row, starts)
            transfer = draws < p_transfer[item_rows]
            x0 = torch.full((mask_logits.shape[0],), self.token_ids.mask, dtype=torch.long, device=self.device)
            if g.temperature > 0:
                # the reference draws for the transferred positions alone: their number is read
                transferred = torch.zeros(len(rows), dtype=torch.long, device=self.device).index_add_(
                    0, item_rows, transfer.long()).tolist()
                if sum(transferred):
                    chosen = torch.nonzero_static(transfer, size=sum(transferred)).flatten()
                    _, tokens = dream_sample_tokens(mask_logits[chosen], temperature=g.temperature, top_p=g.top_p,
                                                    top_k=g.top_k, confidence="prob", rand=self.rand,
                                                    item_counts=transferred, row_ids=rows)
                    x0[chosen] = tokens
            else:  # greedy: every masked position's choice, kept where it transfers (no draw, no read)
                _, tokens = dream_sample_tokens(mask_logits, temperature=0.0, top_p=g.top_p, top_k=g.top_k,
                                                confidence="prob", rand=self.rand, item_counts=per_row, row_ids=rows)
                x0 = torch.where(transfer, tokens, x0)
            window[item_rows, item_pos] = x0
            self.tokens[index, :width] = window
            self._count_masks(rows, window)
            return
        if g.threshold is not None:  # every masked position whose probability reaches it, at least one
            conf, x0 = dream_sample_tokens(mask_logits, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                                           confidence="prob", rand=self.rand, item_counts=per_row, row_ids=rows)
            full_conf = torch.full(masked.shape, NEG_INF, dtype=logits.dtype, device=self.device)
            full_conf[item_rows, item_pos] = conf.to(logits.dtype)
            candidate = window.clone()
            candidate[item_rows, item_pos] = x0
            pad, _ = self.reference_layout(rows, width)
            picks = threshold_picks(full_conf, g.threshold, tie_break=g.tie_break, pad=pad, candidates=per_row)
            self.tokens[index, :width] = window = torch.where(picks, candidate, window)
            self._count_masks(rows, window)
            return
        kind = DREAM_CONFIDENCE[g.alg]
        conf, x0 = dream_sample_tokens(mask_logits, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                                       confidence=kind, rand=self.rand, item_counts=per_row, row_ids=rows)
        counts = self._dream_counts(rows, step, per_row)
        full_conf = torch.full(masked.shape, NEG_INF, dtype=logits.dtype, device=self.device)
        full_conf[item_rows, item_pos] = conf.to(logits.dtype)
        candidate = window.clone()
        candidate[item_rows, item_pos] = x0
        pad, _ = self.reference_layout(rows, width)
        compact = self.rules.ranks_masked_only
        same_k = len(set(counts)) == 1
        sampled = g.alg_temp is not None and g.alg_temp > 0
        if not compact and same_k and (g.tie_break == "reference" or (sampled and self.rand.mode == "global")):
            # Dream ranks the whole [B, prompt + window] confidence matrix in one call
            k = counts[0]
            if k > 0:
                vec = full_conf
                if pad:
                    vec = torch.cat([vec.new_full((vec.shape[0], pad), NEG_INF), vec], dim=1)
                if sampled:
                    sel = torch.multinomial(torch.softmax(vec / g.alg_temp, dim=-1), num_samples=k) - pad
                else:
                    sel = torch.topk(vec, k, dim=-1).indices - pad
                window.scatter_(1, sel, candidate.gather(1, sel))
        else:
            for local, r in enumerate(rows):
                k = counts[local]
                if k <= 0:
                    continue
                positions = item_pos[starts[local]: starts[local] + per_row[local]]
                vec = full_conf[local, positions] if compact else full_conf[local]
                if sampled:
                    weights = torch.softmax(vec / g.alg_temp, dim=-1)
                    if not compact and pad:
                        weights = torch.cat([weights.new_zeros(pad), weights])
                    pick = self.rand.multinomial(weights, k, r) - (0 if compact else pad)
                else:
                    pick = select_topk(vec, k, tie_break=g.tie_break, pad=0 if compact else pad)
                sel = positions[pick] if compact else pick
                window[local, sel] = candidate[local, sel]
        self.tokens[index, :width] = window
        self._count_masks(rows, window)

    def _count_masks(self, rows: list[int], window: torch.Tensor) -> None:
        """The masks each row has left after a Dream step, read at the end of the step with
        everything else the host needs (:meth:`read_step_values`): Dream's rule commits a number
        that depends on them (and a position may be given the mask id again)."""
        left = ((window == self.token_ids.mask) & self.window.live_mask(self.row_index(rows), window.shape[1]))
        self._masks_read = (rows, left.sum(dim=1), None)
        self.window.masks.pending = True

    def read_step_values(self, step: int) -> None:
        """The one device->host read of a step: the Dream masks left and what each policy asks
        for (``DecodePolicy.step_reads``), concatenated and read together into
        ``self.step_values`` (name -> list of ints); nothing is read when nobody asks."""
        wanted: dict[str, torch.Tensor] = {}
        if self._masks_read is not None:
            wanted["masks_left"] = self._masks_read[1]
        for p in self.policies:
            for name, value in (p.step_reads(self, step) or {}).items():
                if name in wanted:
                    raise ValueError(f"step value {name!r} is asked for twice")
                wanted[name] = value
        self.step_values = dict(zip(wanted, read_to_host(list(wanted.values())))) if wanted else {}
        if self._masks_read is not None:
            rows, _, block_starts = self._masks_read
            masks = self.window.masks
            if block_starts is None and self.gen.threshold is None:  # Dream: the whole window, no stall to see
                masks.set_window_left(rows, self.step_values["masks_left"])
                self._masks_read = None
                masks.pending = False
                return
            for i, (r, n) in enumerate(zip(rows, self.step_values["masks_left"])):
                if block_starts is None:  # Dream: the whole window
                    before = masks.left(r)
                    masks.set_left(r, n)
                else:  # a threshold step: its block
                    before = masks.left(r, block_starts[i], block_starts[i] + 1)
                    masks.set_block_left(r, block_starts[i], n)
                if self.gen.threshold is not None and n and n == before:
                    self._end_stalled_block(r, None if block_starts is None else block_starts[i], n, step)
            self._masks_read = None
            self.window.masks.pending = False

    def _end_stalled_block(self, b: int, block_start: int | None, left: int, step: int) -> None:
        """A threshold step that left request ``b``'s block with as many masks as before: every
        position it committed got the model's own mask token, so (greedy, no block cache) the
        next forward would see the same tokens and choose the same; Fast-dLLM loops forever
        there. The block (``block_start`` None: the whole window) ends instead, its masks are left
        in the answer and a warning says so."""
        where = "window" if block_start is None else f"block at position {block_start}"
        warnings.warn(f"threshold decoding: request {b} committed only its mask token at step {step}; the {left} "
                      f"masked position(s) left in its {where} stay masked in the answer", RuntimeWarning, stacklevel=3)
        if block_start is None:
            self.window.masks.set_left(b, 0)
        else:
            self.window.masks.set_block_left(b, block_start, 0)

    def _uniform_items(self, rows: list[int], per_row: list[int], starts: list[int]) -> torch.Tensor:
        """Dream origin's ``torch.rand`` over the flattened masked positions (row-major)."""
        total = sum(per_row)
        if self.rand.mode == "global":
            return torch.rand(total, device=self.device)
        out = torch.empty(total, device=self.device)
        for r, n, start in zip(rows, per_row, starts):
            out[start: start + n] = self.rand.uniform([r], (n,), device=self.device)[0]
        return out

    def upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """Host values as a device tensor through pinned memory: a copy the host does not wait for."""
        host = torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda")
        return host.to(self.device, non_blocking=True)

    # -- the loop -----------------------------------------------------------------------------
    def active_rows(self, step: int) -> list[int]:
        rows, skips_finished, masks = [], self.rules.skips_finished_blocks, self.window.masks
        for b, plan in enumerate(self.plans):
            if step >= plan.steps:
                continue
            if skips_finished and not masks.left(b, plan.block_starts[step], plan.block_ends[step]):
                continue
            rows.append(b)
        return rows

    def execute(self, rows: list[int], step: int) -> torch.Tensor:
        """The step's forward(s): the first policy that runs them, else :meth:`forward`."""
        for p in self.policies:
            logits = p.execute(self, rows, step)
            if logits is not None:
                return logits
        return self.forward(rows, step)

    def step(self, step: int) -> bool:
        """Run denoising step ``step``; False when no request had a step left and no policy
        asks for more."""
        with prange("step"):
            ran = not all(step >= p.steps for p in self.plans)
            if ran:
                rows = self.active_rows(step)
                if rows:
                    self.window.device_lengths()  # refreshed here, outside any captured forward
                    t0 = time.perf_counter()
                    if self.forward_and_sample(rows, step):
                        self.stats.add_time("forward", time.perf_counter() - t0)  # sampling included
                    else:
                        logits = self.execute(rows, step)
                        t1 = time.perf_counter()
                        with prange("sample"):
                            self.sample(rows, logits, step)
                        self.stats.add_time("forward", t1 - t0)
                        self.stats.add_time("sample", time.perf_counter() - t1)
                    for r in rows:
                        self.steps_done[r] += 1
                    if self.finite is not None:
                        self.finite.end_step(step)
            self.read_step_values(step)
            more = [p.after_step(self, step) for p in self.policies]
            if self.gen.threshold is not None:
                self.replan_by_threshold(step)
                more.append(any(p.steps > step + 1 for p in self.plans))
        return ran or any(more)

    def decode(self) -> None:
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=max(p.steps for p in self.plans), desc="denoising", unit="step", leave=False)
        step = 0
        while self.step(step):
            step += 1
            if bar is not None:
                bar.total = max(bar.total, max(p.steps for p in self.plans))
                bar.update(1)
        if bar is not None:
            bar.close()

    def release(self) -> None:
        """The call is over: every graph it captured is released, and each policy lets go of
        what it held (``DecodePolicy.release``)."""
        self.graphs.clear()
        self._charges.clear()
        for p in self.policies:
            p.release(self)

    def output(self) -> GenerationOutput:
        window = self.tokens.clone()
        for b in range(self.batch_size):
            if self.window[b] < self.width:  # a cut suffix is reported as EOS padding
                window[b, self.window[b]:] = self.token_ids.eos
        self.stats.tokens_computed_per_request = list(self.tokens_per_request)
        self.stats.steps = list(self.steps_done)
        for p in self.policies:
            self.stats.extra.update(p.report(self) or {})
        sequences = torch.cat([self.input_ids, window], dim=1)
        return GenerationOutput(sequences, window, first_end_positions(window, self.token_ids.end_ids), self.stats,
                                self.token_ids.end_ids)
