"""The decoding engine: one ``generate`` for every model family, batched.

The engine owns the response window, the step schedule, the layer loop and sampling; a model
is driven only through its adapter surface (``model_adapters.decoder.DiffusionDecoder``:
``embed_prompt``, ``embed``, ``layer``, ``head``, ``prefill``, ``position_ids``, ``token_ids``,
``logits_shift``). Seer and DyLLM are policies called at fixed points of the loop.

Reference behaviour per model (``reference/MODELS.md``):

* ``llada`` (LLaDA, MMaDA ``mmu_generate``): all-mask window after the left-padded prompt;
  semi-autoregressive blocks; steps spread evenly over blocks; each step a full forward
  (position i predicts token i); Gumbel-max in float64; low_confidence / random remasking;
  CFG; ``logits_eos_inf`` and ``confidence_eos_eot_inf``. Equal token for token to
  ML-GSAI/LLaDA ``generate.py`` (tie_break="reference", rng="global").
* ``dream``: shifted logits (the state at i predicts i+1), one global schedule
  ``linspace(1, eps, steps + 1)``, ``alg`` origin / maskgit_plus / topk_margin / entropy,
  ``alg_temp``, temperature, top-p, top-k, as ``diffusion_generate``.
* ``lavida_llada`` / ``lavida_dream``: as above plus LaViDa's changes: steps =
  ``gen_length`` (x ``step_ratio``), schedules shift / cosine / logit_normal, margin and
  entropy remasking, steps whose block has no mask left skipped, softmax in float64, and
  the prefix KV cache; LaViDa-Dream takes the first response token from the prefill logits.

What the prefix KV cache approximates: with the cache the prompt (text and image) is run
once, attending only to itself, and every step runs the response window alone, attending
to the cached prompt keys/values and to itself. Without it, every step recomputes the prompt
and the prompt attends to the current response tokens too. So the cache is exact for a model
trained with a prefix-LM mask and an approximation otherwise (LaViDa reports CIDEr 110.2 ->
107.8 on COCO for 3.3x lower latency). With ``prefix_cache=False`` the engine recomputes
everything at every step (tests check this equals a plain full forward).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .config import DREAM_ALGS, GenerationConfig
from .layout import PaddedLayout, PrefixKV
from .profiling import prange
from .sampling import NEG_INF, RandomSource, dream_sample_tokens, llada_step, select_topk
from .schedules import dream_count, dream_timesteps, scheduled_counts, uniform_counts

IMAGE_TOKEN_INDEX = -200
_REQUIRED = ("embed_prompt", "embed", "layer", "head", "prefill", "position_ids", "token_ids", "logits_shift",
             "num_layers", "vocab_size", "family")


# ------------------------------------------------------------------------------------ outputs
@dataclass
class GenerationStats:
    """Counts and timings of one ``generate`` call.

    nfe: forward passes of the model (a CFG pair counts once; the prefill counts once).
    tokens_computed: positions processed by the transformer, summed over forward passes and
        layers, padding included (what the hardware paid for).
    tokens_computed_per_request: the same per request, its own real positions only.
    steps: denoising steps each request went through.
    time_s: wall time per phase (embed, prefill, forward, sample, seer, total); on CUDA these
        are host times (no synchronisation is added for them).
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


def first_end_positions(window: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Index of the first token in ``end_ids`` per row of ``window [B, W]``, -1 when absent."""
    is_end = torch.zeros_like(window, dtype=torch.bool)
    for t in end_ids:
        is_end |= window == t
    idx = torch.arange(window.shape[1], device=window.device).expand_as(window)
    first = torch.where(is_end, idx, torch.full_like(idx, window.shape[1])).min(dim=1).values
    return torch.where(first == window.shape[1], torch.full_like(first, -1), first)


# ------------------------------------------------------------------------------------ validation
def _flavor(model) -> str:
    family = model.family
    multimodal = bool(getattr(model, "is_multimodal", False))
    if family == "llada":
        return "lavida_llada" if multimodal else "llada"
    if family == "dream":
        return "lavida_dream" if multimodal else "dream"
    raise ValueError(f"model family {family!r} is not supported by the engine")


def validate_request(model, input_ids, attention_mask, images, gen) -> None:
    """Raise ``TypeError``/``ValueError`` naming the offending argument."""
    missing = [name for name in _REQUIRED if not hasattr(model, name)]
    if missing:
        raise TypeError(f"model does not implement the adapter surface (missing {missing}); "
                        "load it with model_adapters.load_model or build_model")
    if not isinstance(gen, GenerationConfig):
        raise TypeError(f"gen must be a GenerationConfig, got {type(gen).__name__}")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype != torch.long:
        raise TypeError(f"input_ids must be int64, got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D [batch, prompt_len], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids is an empty batch (0 requests)")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids has prompts of length 0")
    if input_ids.device != model.device:
        raise ValueError(f"input_ids is on {input_ids.device} but the model is on {model.device}")
    real = torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must be a tensor shaped like input_ids {tuple(input_ids.shape)}")
        if attention_mask.device != input_ids.device:
            raise ValueError(f"attention_mask is on {attention_mask.device}, input_ids on {input_ids.device}")
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must contain only 0 and 1")
        real = attention_mask.bool()
        if not bool(real.any(dim=1).all()):
            raise ValueError("attention_mask has a request with no real token")
        if bool((real[:, :-1] & ~real[:, 1:]).any()):
            raise ValueError("attention_mask must be left padding (zeros only before a request's tokens)")
    multimodal = bool(getattr(model, "is_multimodal", False))
    ids = input_ids[real]
    allowed = (ids >= 0) & (ids < model.vocab_size)
    if multimodal:
        allowed |= ids == IMAGE_TOKEN_INDEX
    if not bool(allowed.all()):
        bad = ids[~allowed][:5].tolist()
        raise ValueError(f"input_ids has token ids outside the vocabulary [0, {model.vocab_size}): {bad}")
    pad_ids = input_ids[~real]
    if pad_ids.numel() and not bool(((pad_ids >= 0) & (pad_ids < model.vocab_size)).all()):
        raise ValueError("input_ids has padding ids outside the vocabulary")
    if bool((ids == model.token_ids.mask).any()):
        raise ValueError(f"input_ids contains the mask id {model.token_ids.mask} inside a prompt")
    if images is not None:
        if not multimodal:
            raise ValueError(f"images were given, but {type(model).__name__} is a text-only model")
        if len(images) != input_ids.shape[0]:
            raise ValueError(f"images must have one entry per request ({input_ids.shape[0]}), got {len(images)}")
    flavor = _flavor(model)
    if model.family == "dream":
        if gen.cfg_scale > 0:
            raise ValueError("cfg_scale: Dream's diffusion_generate has no classifier-free guidance")
        if gen.block_length not in (None, gen.gen_length):
            raise ValueError("block_length: Dream decodes the whole window with one schedule (no blocks)")
        if gen.logits_eos_inf or gen.confidence_eos_eot_inf:
            raise ValueError("logits_eos_inf / confidence_eos_eot_inf are LLaDA options")
        if gen.remasking != "low_confidence":
            raise ValueError("remasking is an LLaDA-family option; Dream uses alg")
    else:
        if gen.alg != "origin" or gen.alg_temp is not None or gen.top_p is not None or gen.top_k is not None:
            raise ValueError("alg / alg_temp / top_p / top_k are Dream options; the LLaDA family uses remasking")
        if flavor == "llada" and gen.remasking in ("margin", "entropy"):
            pass  # LaViDa's strategies, accepted for every LLaDA-family model
    if gen.alg not in DREAM_ALGS:
        raise ValueError(f"alg must be one of {DREAM_ALGS}")


# ------------------------------------------------------------------------------------ plans
@dataclass
class StepPlan:
    """One request's schedule, one entry per denoising step.

    block_starts / block_ends: the current block ``[start, end)`` (no position at or past
    ``end`` may be committed); counts: tokens to commit (None: Dream's rule, from the masks
    left and the step's (t, s)); ts: Dream's (t, s) per step; last: Dream's final step flag.
    Seer shortens and extends plans, so a plan is a list that can be cut and appended to.
    """

    block_starts: list[int] = field(default_factory=list)
    block_ends: list[int] = field(default_factory=list)
    counts: list[int | None] = field(default_factory=list)
    ts: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)
    last: list[bool] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.block_ends)

    def keep_first(self, n: int) -> StepPlan:
        return StepPlan(self.block_starts[:n], self.block_ends[:n], self.counts[:n], self.ts[:n], self.last[:n])

    def then(self, other: StepPlan) -> StepPlan:
        return StepPlan(self.block_starts + other.block_starts, self.block_ends + other.block_ends,
                        self.counts + other.counts, self.ts + other.ts, self.last + other.last)


def steps_per_block(gen: GenerationConfig, flavor: str) -> int:
    """Steps for one full block, the family's rule (LaViDa: gen_length / blocks x step_ratio)."""
    base = (gen.steps if gen.steps is not None else gen.gen_length) // gen.num_blocks
    if gen.step_ratio is not None:
        base = int(base * gen.step_ratio)
    if base < 1:
        raise ValueError(f"steps: {base} steps per block after step_ratio; need at least 1")
    return base


def llada_plan(stop: int, gen: GenerationConfig, flavor: str, *, start: int = 0, first_mask: int = 0) -> StepPlan:
    """Block-wise plan for window positions ``[start, stop)`` (``stop <= gen_length``).

    Blocks follow the configured grid of ``block_length`` positions. A block cut short (Seer)
    holding m of its positions gets ceil(m x steps_per_block / block_length) steps, so the
    tokens-per-step rate of the full configuration is kept.
    """
    spb = steps_per_block(gen, flavor)
    block = gen.block
    plan = StepPlan()
    for grid_start in range(0, stop, block):
        lo, hi = max(grid_start, start), min(grid_start + block, stop)
        if lo >= hi:
            continue
        masks = hi - max(lo, first_mask)
        steps = spb if hi - lo == block else max(1, math.ceil((hi - lo) * spb / block))
        if gen.schedule is None:
            per = uniform_counts(masks, steps)
        else:
            per = scheduled_counts(masks, steps, gen.schedule, shift=gen.schedule_shift)
            per = per + [0] * (steps - len(per))  # LaViDa would index past its list: skip instead
        plan = plan.then(StepPlan([grid_start] * steps, [hi] * steps, per, [None] * steps, [False] * steps))
    return plan


def dream_plan(window: int, gen: GenerationConfig, flavor: str, *, masks: int, start: int = 0,
               positions: int | None = None) -> StepPlan:
    """Dream's single global schedule over positions ``[start, window)`` holding ``masks`` masks.

    With fewer than ``gen_length`` positions to decode (``positions``, default ``window``; Seer)
    the step count keeps the configured rate: ``ceil(positions x steps / gen_length)``.
    """
    steps = gen.steps if gen.steps is not None else gen.gen_length
    if flavor == "lavida_dream":
        steps = min(steps, gen.gen_length)
    # LaViDa-Dream builds its timesteps before step_ratio changes the step count, and keeps them
    timesteps = dream_timesteps(steps, gen.eps)
    if gen.step_ratio is not None:
        steps = int(gen.gen_length * gen.step_ratio)
    positions = window if positions is None else positions
    if positions < gen.gen_length:
        steps = max(1, math.ceil(positions * steps / gen.gen_length))
    if steps < 1:
        raise ValueError("steps: the configuration leaves no denoising step")
    if flavor != "lavida_dream" or len(timesteps) < steps + 1:
        timesteps = dream_timesteps(steps, gen.eps)
    if gen.schedule is not None and gen.alg != "origin":
        counts = scheduled_counts(masks, steps, gen.schedule, shift=gen.schedule_shift)
        counts = counts + [0] * (steps - len(counts))
    else:
        counts = [None] * steps
    ts = [(timesteps[i], timesteps[i + 1]) for i in range(steps)]
    return StepPlan([start] * steps, [window] * steps, counts, ts, [i == steps - 1 for i in range(steps)])


# ------------------------------------------------------------------------------------ the run
class DecodeRun:
    """State of one ``generate`` call. Policies (Seer, DyLLM) hook into :meth:`run_layers`."""

    def __init__(self, model, input_ids, attention_mask, images, gen: GenerationConfig, *, progress=False):
        self.model, self.gen, self.progress = model, gen, progress
        self.flavor = _flavor(model)
        self.ids = model.token_ids
        self.device = input_ids.device
        self.input_ids = input_ids
        self.stats = GenerationStats()
        self.B = input_ids.shape[0]
        self.W = gen.gen_length
        self.use_cache = gen.prefix_cache if gen.prefix_cache is not None else bool(
            getattr(model, "is_multimodal", False))
        self.shift = int(model.logits_shift)
        self.layers = int(model.num_layers)
        self.softmax_fp64 = self.flavor.startswith("lavida")
        if gen.rng == "per_request":
            base = 0 if gen.seed is None else gen.seed
            gens = [torch.Generator().manual_seed(base + b) for b in range(self.B)]
            self.rand = RandomSource("per_request", gens)
        else:
            if gen.seed is not None:
                torch.manual_seed(gen.seed)
            self.rand = RandomSource("global")

        t0 = time.perf_counter()
        with prange("embed"):
            self.prompt_embeds, pmask = model.embed_prompt(input_ids, attention_mask, images)
        self.stats.add_time("embed", time.perf_counter() - t0)
        self.Lp = self.prompt_embeds.shape[1]
        self.prompt_mask = None if pmask is None else pmask.bool()
        full_mask = None
        if self.prompt_mask is not None:
            full_mask = torch.cat([self.prompt_mask.long(),
                                   torch.ones(self.B, self.W, dtype=torch.long, device=self.device)], dim=1)
        self.positions = model.position_ids(full_mask, self.Lp + self.W, self.B, self.device)
        self.prompt_real = (self.prompt_mask.sum(1) if self.prompt_mask is not None
                            else torch.full((self.B,), self.Lp, device=self.device)).tolist()
        # the response window, all masks; wlen[b] positions of row b are live (Seer shortens it)
        self.x = torch.full((self.B, self.W), self.ids.mask, dtype=torch.long, device=self.device)
        self.wlen = [self.W] * self.B
        self.per_request_tokens = [0] * self.B
        self.steps_done = [0] * self.B
        self.prefix: PrefixKV | None = None
        self.first_mask = 0
        if self.use_cache:
            self._prefill()
        if gen.cfg_scale > 0:
            self.mask_embed = model.embed(torch.tensor([self.ids.mask], device=self.device))[0]
        self.plans = [self.make_plan(b, self.W) for b in range(self.B)]

    # -- set-up -------------------------------------------------------------------------------
    def _prefill(self) -> None:
        t0 = time.perf_counter()
        with prange("prefill"):
            self.prefix, hidden = self.model.prefill(self.prompt_embeds, self.prompt_mask, self.positions[:, : self.Lp])
        self.stats.nfe += 1
        self.stats.tokens_computed += self.B * self.Lp * self.layers
        for b in range(self.B):
            self.per_request_tokens[b] += self.prompt_real[b] * self.layers
        if self.flavor == "lavida_dream":
            # LaViDa-Dream: the prefill's last position predicts the first response token.
            logits = self.model.head(hidden[:, -1:])
            self.x[:, 0] = logits[:, 0].argmax(dim=-1)
            self.first_mask = 1
        self.stats.add_time("prefill", time.perf_counter() - t0)

    def make_plan(self, b: int, window: int, *, start: int = 0) -> StepPlan:
        """A fresh plan for the masks of row ``b`` in window positions ``[start, window)``."""
        if self.model.family == "llada":
            return llada_plan(window, self.gen, self.flavor, start=start, first_mask=self.first_mask)
        masks = int((self.x[b, start:window] == self.ids.mask).sum())
        return dream_plan(window, self.gen, self.flavor, masks=masks, start=start,
                          positions=window if start == 0 else window - start)

    # -- forward ------------------------------------------------------------------------------
    def window_inputs(self, rows: list[int], wmax: int):
        """Embeddings, layout and prefix for a forward of ``rows`` over their first ``wmax`` positions."""
        idx = torch.tensor(rows, device=self.device)
        win = self.x[idx, :wmax]
        live = torch.arange(wmax, device=self.device)[None, :] < torch.tensor(
            [self.wlen[r] for r in rows], device=self.device)[:, None]
        emb = self.model.embed(win)
        all_live = bool(live.all())
        if self.use_cache:
            prefix = self.prefix if len(rows) == self.B else self.prefix.select(idx)
            pmask = prefix.key_mask
            if pmask is None and all_live:
                key_mask = None
            else:
                pm = pmask if pmask is not None else torch.ones(
                    len(rows), self.Lp, dtype=torch.bool, device=self.device)
                key_mask = torch.cat([pm, live], dim=1)
            layout = PaddedLayout(self.positions[idx, self.Lp: self.Lp + wmax], key_mask)
            return emb, layout, prefix, 0
        pe = self.prompt_embeds[idx]
        hidden = torch.cat([pe, emb], dim=1)
        pmask = None if self.prompt_mask is None else self.prompt_mask[idx]
        if pmask is None and all_live:
            key_mask = None
        else:
            pm = pmask if pmask is not None else torch.ones(
                len(rows), self.Lp, dtype=torch.bool, device=self.device)
            key_mask = torch.cat([pm, live], dim=1)
        layout = PaddedLayout(self.positions[idx, : self.Lp + wmax], key_mask)
        return hidden, layout, None, self.Lp

    def run_layers(self, hidden, layout, prefix, *, rows: list[int], step: int):
        """The layer loop: every layer through :meth:`run_layer`."""
        rope = self.model.rope(layout.positions)
        for i in range(self.layers):
            hidden = self.run_layer(i, hidden, layout, rope=rope, prefix=prefix, rows=rows, step=step)
        return hidden

    def run_layer(self, i, hidden, layout, *, rope, prefix, rows: list[int], step: int, taps=None):
        """One layer of one forward; the per-layer fixed point that policies (DyLLM) override.

        hidden [R, L, D]: R = len(rows) rows (twice that under classifier-free guidance), L =
        offset + window positions; taps: requests from another policy (Seer's probe)."""
        return self.model.layer(i, hidden, layout, rope=rope, prefix=prefix, taps=taps)

    def on_cut(self, rows: list[int], offset: int, new_wmax: int) -> None:
        """Called inside step 0 when Seer shortens the windows to ``new_wmax`` positions after
        some layers already ran on the full window (policies holding per-layer state slice it)."""

    def window_logits(self, hidden, offset: int, wmax: int) -> torch.Tensor:
        """Logits of the window's positions, shifted for Dream (the state at i predicts i+1)."""
        if self.shift == 0:
            return self.model.head(hidden[:, offset: offset + wmax])
        if offset > 0:  # full sequence: position j reads the state at j - 1 (the prompt's last for j = 0)
            return self.model.head(hidden[:, offset - 1: offset + wmax - 1])
        raw = self.model.head(hidden[:, :wmax])  # window only (prefix cache): Dream shifts within it
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)

    def count_tokens(self, rows: list[int], hidden: torch.Tensor, layout: PaddedLayout, offset: int) -> None:
        self.stats.tokens_computed += hidden.shape[0] * hidden.shape[1] * self.layers
        for r in rows:
            own = self.wlen[r] + (self.prompt_real[r] if offset else 0)
            self.per_request_tokens[r] += own * self.layers

    def guidance_inputs(self, hidden, layout, offset):
        """Classifier-free guidance: append the unconditional copy (every prompt position masked)."""
        if self.gen.cfg_scale <= 0:
            return hidden, layout, False
        uncond = hidden.clone()
        uncond[:, :offset] = self.mask_embed  # LLaDA masks every prompt position (pads too)
        hidden = torch.cat([hidden, uncond], dim=0)
        layout = PaddedLayout(torch.cat([layout.positions] * 2),
                              None if layout.key_mask is None else torch.cat([layout.key_mask] * 2))
        return hidden, layout, True

    def combine_guidance(self, logits, cfg: bool):
        if not cfg:
            return logits
        cond, un = logits.chunk(2, dim=0)
        return un + (self.gen.cfg_scale + 1) * (cond - un)

    def forward(self, rows: list[int], step: int, *, wmax: int | None = None) -> torch.Tensor:
        """Logits ``[R, wmax, V]`` of the windows of ``rows`` (padded layout, windows padded to
        ``wmax``, default the longest live window; positions past a row's window are masked)."""
        wmax = max(self.wlen[r] for r in rows) if wmax is None else wmax
        hidden, layout, prefix, offset = self.window_inputs(rows, wmax)
        hidden, layout, cfg = self.guidance_inputs(hidden, layout, offset)
        self.count_tokens(rows, hidden, layout, offset)
        with prange("forward"):
            hidden = self.run_layers(hidden, layout, prefix, rows=rows, step=step)
            logits = self.window_logits(hidden, offset, wmax)
        self.stats.nfe += 1
        return self.combine_guidance(logits, cfg)

    # -- sampling -----------------------------------------------------------------------------
    def live_masks(self, rows: list[int], wmax: int) -> torch.Tensor:
        idx = torch.tensor(rows, device=self.device)
        live = torch.arange(wmax, device=self.device)[None, :] < torch.tensor(
            [self.wlen[r] for r in rows], device=self.device)[:, None]
        return (self.x[idx, :wmax] == self.ids.mask) & live

    def reference_layout(self, rows: list[int], wmax: int) -> tuple[int, int | None]:
        """(pad, full_len) of the reference's per-row vectors, valid while every row is decoded."""
        pad = 0 if self.use_cache else self.Lp
        if len(rows) != self.B or wmax != self.W:
            return pad, None
        return pad, pad + self.W

    def sample(self, rows: list[int], logits: torch.Tensor, step: int) -> None:
        if self.model.family == "llada":
            self._sample_llada(rows, logits, step)
        else:
            self._sample_dream(rows, logits, step)

    def _sample_llada(self, rows, logits, step) -> None:
        g = self.gen
        wmax = logits.shape[1]
        masked = self.live_masks(rows, wmax)
        idx = torch.tensor(rows, device=self.device)
        block_end = torch.tensor([self.plans[r].block_ends[step] for r in rows], device=self.device)
        counts = [self.plans[r].counts[step] for r in rows]
        pad, full_len = self.reference_layout(rows, wmax)
        new = llada_step(
            logits, self.x[idx, :wmax], masked, block_end, counts, rows=rows, temperature=g.temperature,
            remasking=g.remasking, eos_id=self.ids.eos, eot_id=self.ids.eot, logits_eos_inf=g.logits_eos_inf,
            confidence_eos_eot_inf=g.confidence_eos_eot_inf, softmax_fp64=self.softmax_fp64,
            tie_break=g.tie_break, pad=pad, rand=self.rand, full_len=full_len,
        )
        self.x[idx, :wmax] = new

    def _sample_dream(self, rows, logits, step) -> None:
        g = self.gen
        wmax = logits.shape[1]
        masked = self.live_masks(rows, wmax)
        idx = torch.tensor(rows, device=self.device)
        window = self.x[idx, :wmax].clone()
        item_rows = masked.nonzero()[:, 0]
        mask_logits = logits[masked]
        if g.alg == "origin":
            probs_t = []
            for r in rows:
                plan = self.plans[r]
                t, s = plan.ts[step]
                probs_t.append(torch.tensor(1.0) if plan.last[step] else 1 - s / t)
            p_transfer = torch.stack([torch.as_tensor(p, dtype=torch.float32) for p in probs_t]).to(self.device)
            draws = self._uniform_items(rows, masked, item_rows)
            transfer = draws < p_transfer[item_rows]
            x0 = torch.full((mask_logits.shape[0],), self.ids.mask, dtype=torch.long, device=self.device)
            if bool(transfer.any()):
                _, tokens = dream_sample_tokens(mask_logits[transfer], temperature=g.temperature, top_p=g.top_p,
                                                top_k=g.top_k, confidence="prob", rand=self.rand,
                                                item_rows=item_rows[transfer], row_ids=rows)
                x0[transfer] = tokens
            window[masked] = x0
            self.x[idx, :wmax] = window
            return
        kind = {"maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}[g.alg]
        conf, x0 = dream_sample_tokens(mask_logits, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                                       confidence=kind, rand=self.rand, item_rows=item_rows, row_ids=rows)
        counts = []
        for local, r in enumerate(rows):
            plan = self.plans[r]
            k = plan.counts[step]
            if k is None:
                t, s = plan.ts[step]
                k = dream_count(int(masked[local].sum()), t, s, plan.last[step])
            counts.append(min(int(k), int(masked[local].sum())))
        full_conf = torch.full(masked.shape, NEG_INF, dtype=logits.dtype, device=self.device)
        full_conf[masked] = conf.to(logits.dtype)
        candidate = window.clone()
        candidate[masked] = x0
        pad, _ = self.reference_layout(rows, wmax)
        compact = self.flavor == "lavida_dream"  # LaViDa-Dream ranks the masked positions only
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
                for local in range(len(rows)):
                    window[local, sel[local]] = candidate[local, sel[local]]
            self.x[idx, :wmax] = window
            return
        for local, r in enumerate(rows):
            k = counts[local]
            if k <= 0:
                continue
            positions = masked[local].nonzero().flatten()
            vec = full_conf[local, positions] if compact else full_conf[local]
            if g.alg_temp is not None and g.alg_temp > 0:
                weights = torch.softmax(vec / g.alg_temp, dim=-1)
                if not compact and pad:
                    weights = torch.cat([weights.new_zeros(pad), weights])
                pick = self.rand.multinomial(weights, k, r) - (0 if compact else pad)
            else:
                pick = select_topk(vec, k, tie_break=g.tie_break, pad=0 if compact else pad)
            sel = positions[pick] if compact else pick
            window[local, sel] = candidate[local, sel]
        self.x[idx, :wmax] = window

    def _uniform_items(self, rows, masked, item_rows) -> torch.Tensor:
        """Dream origin's ``torch.rand`` over the flattened masked positions (row-major)."""
        if self.rand.mode == "global":
            return torch.rand(int(masked.sum()), device=self.device)
        out = torch.empty(int(masked.sum()), device=self.device)
        for local, r in enumerate(rows):
            sel = (item_rows == local).nonzero().flatten()
            out[sel] = self.rand.uniform([r], (sel.numel(),), device=self.device)[0]
        return out

    # -- the loop -----------------------------------------------------------------------------
    def active_rows(self, step: int) -> list[int]:
        rows = []
        for b in range(self.B):
            plan = self.plans[b]
            if step >= plan.steps:
                continue
            if self.flavor.startswith("lavida"):
                # LaViDa skips a step whose block has no mask left
                if not bool((self.x[b, plan.block_starts[step]: plan.block_ends[step]] == self.ids.mask).any()):
                    continue
            rows.append(b)
        return rows

    def step(self, step: int) -> bool:
        """Run denoising step ``step``; False when no request has steps left."""
        if all(step >= p.steps for p in self.plans):
            return False
        rows = self.active_rows(step)
        if rows:
            with prange("step"):
                t0 = time.perf_counter()
                logits = self.forward(rows, step)
                t1 = time.perf_counter()
                with prange("sample"):
                    self.sample(rows, logits, step)
                t2 = time.perf_counter()
            self.stats.add_time("forward", t1 - t0)
            self.stats.add_time("sample", t2 - t1)
            for r in rows:
                self.steps_done[r] += 1
        return True

    def decode(self) -> None:
        total = max(p.steps for p in self.plans)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, desc="denoising", unit="step", leave=False)
        step = 0
        while self.step(step):
            step += 1
            if bar is not None:
                bar.total = max(bar.total, max(p.steps for p in self.plans))
                bar.update(1)
        if bar is not None:
            bar.close()

    def output(self) -> GenerationOutput:
        window = self.x.clone()
        for b in range(self.B):
            if self.wlen[b] < self.W:  # a cut suffix is reported as EOS padding
                window[b, self.wlen[b]:] = self.ids.eos
        self.stats.tokens_computed_per_request = list(self.per_request_tokens)
        self.stats.steps = list(self.steps_done)
        if hasattr(self, "seer_stats"):
            self.stats.extra["seer"] = self.seer_stats()
        if hasattr(self, "router_report"):
            self.stats.extra["router"] = self.router_report()
            if self.graph_report() is not None:
                self.stats.extra["graphs"] = self.graph_report()
        sequences = torch.cat([self.input_ids, window], dim=1)
        return GenerationOutput(sequences, window, first_end_positions(window, self.ids.end_ids), self.stats,
                                self.ids.end_ids)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    images=None,
    gen: GenerationConfig | None = None,
    seer=None,
    dyllm=None,
    router=None,
    graphs="auto",
    progress: bool = False,
) -> GenerationOutput:
    """Decode a batch of requests with a masked-diffusion model.

    model: any ``model_adapters`` model (LLaDA, MMaDA, Dream, LaViDa-LLaDA, LaViDa-Dream).
    input_ids: int64 ``[B, L]``, left-padded prompts (LaViDa: with ``<image>`` placeholders -200;
        MMaDA: image token ids already in the sequence, see ``model_adapters.mmada_mmu_input_ids``).
    attention_mask: ``[B, L]`` of 0/1 (left padding), or None.
    images: LaViDa only: one entry per request (None, an ``ImageInput`` or a list of them).
    gen: the decoding configuration (default ``GenerationConfig()``).
    seer: a ``SeerConfig`` to cut each request's window at step 0 (``seer_runtime.seer``).
    dyllm: a ``DyLLMConfig`` for saliency-gated sparse steps (``seer_runtime.dyllm``).
    router: a ``RouterConfig`` (or True for defaults sized to the window): after Seer's cut every
        step runs through the Padding-Waste-Ratio router (static / varlen / eager per group);
        None pads the batch to its longest surviving window.
    graphs: how routed static groups replay: "auto" (CUDA graphs on a CUDA device, the same
        buffers eagerly elsewhere), None (plain eager), or a graph backend object.
    """
    gen = gen if gen is not None else GenerationConfig()
    validate_request(model, input_ids, attention_mask, images, gen)
    t0 = time.perf_counter()
    with prange("generate"):
        run_cls = DecodeRun
        if seer is not None or dyllm is not None or router is not None:
            from .policies import build_run

            run = build_run(model, input_ids, attention_mask, images, gen, seer=seer, dyllm=dyllm, router=router,
                            graphs=graphs, progress=progress)
        else:
            run = run_cls(model, input_ids, attention_mask, images, gen, progress=progress)
        run.decode()
        out = run.output()
    out.stats.add_time("total", time.perf_counter() - t0)
    return out
