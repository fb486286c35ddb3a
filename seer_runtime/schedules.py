"""How many masked positions a denoising step commits ("transfer counts").

* :func:`uniform_counts` - LLaDA's ``get_num_transfer_tokens``: an even split of a block's masks
  over its steps, the first ``count % steps`` steps getting one more.
* :func:`scheduled_counts` - LaViDa's ``get_num_transfer_tokens_sch``: the integer increments of
  a noise schedule sigma(t) over ``linspace(0, 1, steps + 1)``, at least one token per step,
  the surplus taken back from the front, then reversed. ``shift`` maps t -> s t / (1 + (s-1) t);
  ``cosine`` is 1 - (1 + cos(pi t)) / 2; ``logit_normal`` is the normal CDF of logit(t).
* :func:`dream_count` - Dream's ``int(masks * (1 - s / t))`` on ``linspace(1, eps, steps + 1)``.

All arithmetic is done in the dtypes the references use (int64 counts, float32 schedules), so
the counts are identical to theirs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

SCHEDULES = ("uniform", "shift", "cosine", "logit_normal")


def uniform_counts(mask_count: int, steps: int) -> list[int]:
    """Even split of ``mask_count`` over ``steps`` (front-loaded remainder)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    base, remainder = divmod(mask_count, steps)
    return [base + (1 if i < remainder else 0) for i in range(steps)]


def _sigmas(schedule: str, t: torch.Tensor, shift: float) -> torch.Tensor:
    if schedule == "shift":
        return shift * t / (1 + (shift - 1) * t)
    if schedule == "cosine":
        return 1 - 0.5 * (1 + torch.cos(math.pi * t))
    if schedule == "logit_normal":
        return 0.5 * (1 + torch.erf(torch.log(t / (1 - t)) / math.sqrt(2.0)))
    if schedule == "uniform":
        return t
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def scheduled_counts(mask_count: int, steps: int, schedule: str, *, shift: float = 3.0) -> list[int]:
    """LaViDa's scheduled transfer counts; ``min(steps, mask_count)`` entries, each >= 1.

    Returns an empty list when there is nothing to transfer.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    steps = int(min(steps, mask_count))
    if steps == 0:
        return []
    t = torch.linspace(0, 1, steps + 1)
    sigmas = _sigmas(schedule, t, shift)
    sample = (sigmas * mask_count).to(torch.int64)
    sample = (sample[1:] - sample[:-1]).clamp(min=1)
    delta = int(sample.sum()) - mask_count
    j = 0
    while delta > 0:  # take the surplus back, from the front, never below one per step
        j %= len(sample)
        if sample[j] == 1:
            j += 1
            continue
        sample[j] -= 1
        delta -= 1
        j += 1
    return sample.flip(0).tolist()


def dream_timesteps(steps: int, eps: float) -> torch.Tensor:
    """Dream's ``linspace(1, eps, steps + 1)`` (float32): step i uses t = ts[i], s = ts[i+1]."""
    return torch.linspace(1, eps, steps + 1)


_TRANSFER_FACTORS: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, np.generic]] = {}


def _transfer_factor(t: torch.Tensor, s: torch.Tensor) -> np.generic:
    """``1 - s / t`` as a numpy scalar of its torch dtype, computed once per pair of tensors (the
    plans of a schedule share theirs: ``plans._timestep_pairs``; an entry holds its tensors, so
    their ids are not reused while it is kept)."""
    key = (id(t), id(s))
    hit = _TRANSFER_FACTORS.get(key)
    if hit is not None and hit[0] is t and hit[1] is s:
        return hit[2]
    if len(_TRANSFER_FACTORS) >= 4096:
        _TRANSFER_FACTORS.clear()
    factor = (1 - s / t).numpy()[()]
    _TRANSFER_FACTORS[key] = (t, s, factor)
    return factor


_DREAM_COUNTS: dict[tuple[torch.Tensor, torch.Tensor, int], int] = {}


def transfer_probability(t: torch.Tensor, s: torch.Tensor) -> float:
    """Dream ``origin``'s probability that a masked position is committed at the step ``(t, s)``:
    ``1 - s / t`` in the schedule's dtype (computed once per pair: no torch op per step)."""
    return float(_transfer_factor(t, s))


def dream_count(mask_count: int, t: torch.Tensor, s: torch.Tensor, last: bool) -> int:
    """Dream's transfer count for one row: ``int(masks * (1 - s / t))`` with ``masks`` a float32
    tensor as Dream has it, everything at the last step. The product is taken in numpy scalars of
    the same dtypes (IEEE arithmetic, the same promotion: the same bits), with no torch op per
    row and step, once per ``(t, s, masks)``: later calls look it up (the key holds the tensors,
    which hash by identity, so an entry is never served for other tensors)."""
    if last:
        return int(mask_count)
    key = (t, s, mask_count)
    count = _DREAM_COUNTS.get(key)
    if count is None:
        if len(_DREAM_COUNTS) >= 65536:
            _DREAM_COUNTS.clear()
        count = _DREAM_COUNTS[key] = int(np.float32(mask_count) * _transfer_factor(t, s))
    return count
