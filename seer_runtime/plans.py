"""Step plans: which block each denoising step works in and how many tokens it commits.

* :class:`DecodingRules` - which reference generator a model's decoding follows (LLaDA's
  ``generate``, Dream's ``diffusion_generate``, or LaViDa's versions of them) and what that
  changes, named by behaviour;
* :class:`StepPlan` - one request's schedule, one entry per step (Seer cuts and extends it);
* :func:`llada_plan` - semi-autoregressive blocks, steps spread evenly over them;
* :func:`dream_plan` - Dream's one global schedule ``linspace(1, eps, steps + 1)``;
* :func:`threshold_step` - threshold decoding's plan, one step at a time (the engine plans the
  next one from the masks each block has left).

Counts come from ``schedules`` (LLaDA's even split, LaViDa's noise schedules, Dream's rule).
A window shorter than ``gen_length`` (Seer's cut) keeps the configured tokens-per-step rate.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from .config import GenerationConfig
from .schedules import dream_timesteps, scheduled_counts, uniform_counts


@dataclass(frozen=True)
class DecodingRules:
    """The reference a model's decoding follows: ``family`` "llada" (LLaDA, MMaDA's
    ``mmu_generate``, LaViDa-LLaDA) or "dream" (Dream, LaViDa-Dream), with LaViDa's changes
    when ``lavida`` (the multimodal models)."""

    family: str
    lavida: bool

    @classmethod
    def of(cls, model) -> DecodingRules:
        if model.family not in ("llada", "dream"):
            raise ValueError(f"model family {model.family!r} is not supported by the engine")
        return cls(model.family, bool(model.is_multimodal))

    @property
    def name(self) -> str:
        return f"lavida_{self.family}" if self.lavida else self.family

    @property
    def softmax_fp64(self) -> bool:
        """LaViDa computes the confidence softmax in float64."""
        return self.lavida

    @property
    def skips_finished_blocks(self) -> bool:
        """LaViDa skips a step whose block has no mask left."""
        return self.lavida

    @property
    def first_token_from_prefill(self) -> bool:
        """LaViDa-Dream takes the first response token from the prefill's last logits."""
        return self.lavida and self.family == "dream"

    @property
    def ranks_masked_only(self) -> bool:
        """LaViDa-Dream ranks the masked positions alone (Dream ranks prompt + window)."""
        return self.lavida and self.family == "dream"


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


def steps_per_block(gen: GenerationConfig) -> int:
    """Steps for one full block, the family's rule (LaViDa: gen_length / blocks x step_ratio)."""
    base = (gen.steps if gen.steps is not None else gen.gen_length) // gen.num_blocks
    if gen.step_ratio is not None:
        base = int(base * gen.step_ratio)
    if base < 1:
        raise ValueError(f"steps: {base} steps per block after step_ratio; need at least 1")
    return base


def llada_plan(stop: int, gen: GenerationConfig, *, start: int = 0, first_mask: int = 0) -> StepPlan:
    """Block-wise plan for window positions ``[start, stop)`` (``stop <= gen_length``).

    Blocks follow the configured grid of ``block_length`` positions. A block cut short (Seer)
    holding m of its positions gets ceil(m x steps_per_block / block_length) steps, so the
    tokens-per-step rate of the full configuration is kept.
    """
    spb = steps_per_block(gen)
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


@functools.lru_cache(maxsize=64)
def _timestep_pairs(steps: int, eps: float) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """Dream's ``(t, s)`` of each step of ``dream_timesteps(steps, eps)``, made once per schedule:
    every request's plan shares these tensors (read only), so what a step derives from them is
    computed once (``schedules.dream_count``)."""
    timesteps = dream_timesteps(steps, eps)
    return tuple((timesteps[i], timesteps[i + 1]) for i in range(steps))


def dream_plan(window: int, gen: GenerationConfig, rules: DecodingRules, *, masks: int, start: int = 0,
               positions: int | None = None) -> StepPlan:
    """Dream's single global schedule over positions ``[start, window)`` holding ``masks`` masks.

    With fewer than ``gen_length`` positions to decode (``positions``, default ``window``; Seer)
    the step count keeps the configured rate: ``ceil(positions x steps / gen_length)``.
    """
    steps = gen.steps if gen.steps is not None else gen.gen_length
    if rules.lavida:
        steps = min(steps, gen.gen_length)
    # LaViDa-Dream builds its timesteps before step_ratio changes the step count, and keeps them
    schedule = steps
    if gen.step_ratio is not None:
        steps = int(gen.gen_length * gen.step_ratio)
    positions = window if positions is None else positions
    if positions < gen.gen_length:
        steps = max(1, math.ceil(positions * steps / gen.gen_length))
    if steps < 1:
        raise ValueError("steps: the configuration leaves no denoising step")
    if not rules.lavida or schedule < steps:
        schedule = steps
    if gen.schedule is not None and gen.alg != "origin":
        counts = scheduled_counts(masks, steps, gen.schedule, shift=gen.schedule_shift)
        counts = counts + [0] * (steps - len(counts))
    else:
        counts = [None] * steps
    ts = list(_timestep_pairs(schedule, gen.eps)[:steps])
    return StepPlan([start] * steps, [window] * steps, counts, ts, [i == steps - 1 for i in range(steps)])


def threshold_step(start: int, end: int) -> StepPlan:
    """One step of threshold decoding in the block ``[start, end)``: how many tokens it commits
    is decided by their confidences (``GenerationConfig.threshold``), not by the plan."""
    return StepPlan([start], [end], [None], [None], [False])
