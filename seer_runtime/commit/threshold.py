"""Fast-dLLM's parallel decoding (``GenerationConfig.threshold``): a step commits every masked
position of the request's current block whose confidence reaches the threshold, and at least
the most confident one (``sampling.threshold_picks``; ties broken on the device as the reference
breaks them, or the leftmost with ``tie_break="stable"``). The confidence is the family's: LLaDA's
remasking confidence, Dream's chosen-token probability (``alg="maskgit_plus"``).

How many positions a step commits is the model's decision, so a request is planned one step at a
time (:meth:`ThresholdRule.plan`: the first block of its window that still holds a mask) and
planned again after every step from the masks its block has left, read with the step's one read.
A step that leaves a block with as many masks as before committed only the model's own mask
token; greedy, the next forward would choose the same (Fast-dLLM loops forever there): the block
ends instead, its masks left in the answer, and a RuntimeWarning says so.
"""

from __future__ import annotations

import torch

from ..batch import BatchState
from ..config import warn_caller
from ..plans import StepPlan, threshold_step
from ..runner import StepChoice
from ..sampling import NEG_INF, dream_sample_tokens, threshold_picks
from .base import CommitRule, masks_left
from .dream import DreamRule, masked_items
from .llada import llada_choose


class ThresholdRule(CommitRule):
    """Threshold decoding for either family (module docstring)."""

    name = "threshold"

    def __init__(self, state: BatchState) -> None:
        self.family = state.rules.family
        self._family_rule = DreamRule(state) if self.family == "dream" else None  # extension plans
        # the masks left after the step: (rows, counts, block starts: None for Dream's one window)
        self._pending: tuple[list[int], torch.Tensor, list[int] | None] | None = None

    def next_block(self, state: BatchState, b: int, start: int = 0, stop: int | None = None) -> tuple[int, int] | None:
        """``(start, end)`` of the first block of request ``b``'s live window (from ``start``) that
        still holds a mask, on the block grid (Dream: the whole window); None when none does."""
        stop = state.window[b] if stop is None else stop
        block = state.gen.block
        for grid_start in range(start - start % block, stop, block):
            lo, hi = max(grid_start, start), min(grid_start + block, stop)
            if lo < hi and state.window.masks.left(b, grid_start, hi):
                return lo, hi
        return None

    def plan(self, state: BatchState, b: int, stop: int, *, start: int = 0) -> StepPlan:
        block = self.next_block(state, b, start, stop)
        return StepPlan() if block is None else threshold_step(*block)

    def extended_plan(self, state: BatchState, b: int, old: int, step: int, *, old_masks: int) -> StepPlan:
        if self._family_rule is not None:
            return self._family_rule.extended_plan(state, b, old, step, old_masks=old_masks)
        return super().extended_plan(state, b, old, step, old_masks=old_masks)

    def after_step(self, state: BatchState, step: int) -> bool:
        """Each request's next step works in the first block of its window that still holds a
        mask (none: the request is done); True while one has a step left."""
        for b in range(state.batch_size):
            if b in state.ended:
                continue
            head = state.plans[b].keep_first(step + 1)
            block = self.next_block(state, b)
            state.plans[b] = head if block is None else head.then(threshold_step(*block))
        return any(p.steps > step + 1 for p in state.plans)

    def steps_left(self, state: BatchState, b: int, step: int) -> int:
        """The blocks of request ``b``'s live window still holding masks: each needs at least one
        more step (how many is the model's decision)."""
        stop, block = state.window[b], state.gen.block
        return sum(1 for start in range(0, stop, block) if state.window.masks.left(b, start, min(start + block, stop)))

    # -- the choice -------------------------------------------------------------------------------
    def _candidates(self, state: BatchState, rows: list[int], step: int) -> list[int] | None:
        """Masked positions left in each row's current block: the reference tie-break ranks that
        many (as Fast-dLLM's ``get_transfer_index`` asks ``torch.topk`` for)."""
        if state.gen.tie_break != "reference":
            return None
        return [state.window.masks.left(r, state.plans[r].block_starts[step], state.plans[r].block_ends[step])
                for r in rows]

    def choice(self, state: BatchState, rows: list[int], step: int) -> StepChoice | None:
        """The LLaDA family's greedy steps (no temperature, no random remasking); Dream's run eagerly."""
        g = state.gen
        if self.family != "llada" or g.temperature > 0 or g.remasking == "random":
            return None
        candidates = self._candidates(state, rows, step)
        blocks = tuple((state.plans[r].block_starts[step], state.plans[r].block_ends[step]) for r in rows)
        return StepChoice(("threshold", blocks, None if candidates is None else tuple(candidates)),
                          lambda logits: self._choose_llada(state, rows, step, logits, candidates),
                          lambda left: self._read_later(state, rows, left, step))

    def _choose_llada(self, state, rows, step, logits, candidates) -> torch.Tensor:
        """Commit into ``state.tokens``; returns each row's masks left in its block (int64 ``[R]``)."""
        new = llada_choose(state, rows, step, logits, candidates=candidates)
        width = logits.shape[1]
        block_start = state.device_tensor([state.plans[r].block_starts[step] for r in rows])
        block_end = state.device_tensor([state.plans[r].block_ends[step] for r in rows])
        positions = torch.arange(width, device=state.device)
        in_block = (positions[None, :] >= block_start[:, None]) & (positions[None, :] < block_end[:, None])
        return ((new == state.token_ids.mask) & in_block).sum(dim=1)

    def commit(self, state: BatchState, rows: list[int], step: int, logits: torch.Tensor) -> None:
        if self.family == "llada":
            left = self._choose_llada(state, rows, step, logits, self._candidates(state, rows, step))
            self._read_later(state, rows, left, step)
            return
        g = state.gen
        width = logits.shape[1]
        index = state.row_index(rows)
        window = state.tokens[index, :width].clone()
        masked = state.masked(rows, width)
        per_row, _, item_rows, item_pos = masked_items(state, rows, masked)
        conf, x0 = dream_sample_tokens(logits[item_rows, item_pos], temperature=g.temperature, top_p=g.top_p,
                                       top_k=g.top_k, confidence="prob", rand=state.rand, item_counts=per_row,
                                       row_ids=rows)
        full_conf = torch.full(masked.shape, NEG_INF, dtype=logits.dtype, device=state.device)
        full_conf[item_rows, item_pos] = conf.to(logits.dtype)
        candidate = window.clone()
        candidate[item_rows, item_pos] = x0
        pad, _ = state.reference_layout(rows, width)
        picks = threshold_picks(full_conf, g.threshold, tie_break=g.tie_break, pad=pad, candidates=per_row)
        state.tokens[index, :width] = window = torch.where(picks, candidate, window)
        self._read_later(state, rows, masks_left(state, rows, window), None)

    # -- the masks left, read at the step's end ---------------------------------------------------
    def _read_later(self, state: BatchState, rows: list[int], left: torch.Tensor, step: int | None) -> None:
        starts = None if step is None else [state.plans[r].block_starts[step] for r in rows]
        self._pending = (rows, left, starts)
        state.window.masks.pending = True

    def step_reads(self, state: BatchState) -> dict[str, torch.Tensor] | None:
        return None if self._pending is None else {"masks_left": self._pending[1]}

    def after_read(self, state: BatchState, step: int, values: dict[str, list[int]]) -> None:
        if self._pending is None:
            return
        rows, _, block_starts = self._pending
        masks = state.window.masks
        for i, (r, n) in enumerate(zip(rows, values["masks_left"])):
            if block_starts is None:  # Dream: the whole window
                before = masks.left(r)
                masks.set_left(r, n)
            else:
                before = masks.left(r, block_starts[i], block_starts[i] + 1)
                masks.set_block_left(r, block_starts[i], n)
            if n and n == before:
                self._end_stalled_block(state, r, None if block_starts is None else block_starts[i], n, step)
        self._pending = None
        masks.pending = False

    @staticmethod
    def _end_stalled_block(state: BatchState, b: int, block_start: int | None, left: int, step: int) -> None:
        where = "window" if block_start is None else f"block at position {block_start}"
        warn_caller(f"threshold decoding: request {b} committed only its mask token at step {step}; the {left} "
                      f"masked position(s) left in its {where} stay masked in the answer", RuntimeWarning)
        if block_start is None:
            state.window.masks.set_left(b, 0)
        else:
            state.window.masks.set_block_left(b, block_start, 0)
