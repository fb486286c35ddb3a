"""LLaDA's rule (``generate.py``; MMaDA's ``mmu_generate``; LaViDa-LLaDA): semi-autoregressive
blocks, a fixed number of commits per step inside the current block, chosen by low-confidence,
random, margin or entropy remasking (``sampling.llada_step``: Gumbel-max in float64)."""

from __future__ import annotations

import torch

from ..batch import BatchState
from ..plans import StepPlan, llada_plan
from ..runner import StepChoice
from ..sampling import llada_step
from .base import CommitRule


def llada_choose(state: BatchState, rows: list[int], step: int, logits: torch.Tensor, *,
                 candidates: list[int] | None = None) -> torch.Tensor:
    """Commit the step's tokens into ``state.tokens`` (device work only) and return the new
    windows ``[R, W]``: each row's count of its plan, or with ``gen.threshold`` every position of
    the block reaching it and the most confident one (``candidates``: masked positions left in
    each row's block, for the reference tie-break)."""
    g = state.gen
    width = logits.shape[1]
    masked = state.masked(rows, width)
    index = state.row_index(rows)
    plans = [state.plans[r] for r in rows]
    block_end = state.device_tensor([p.block_ends[step] for p in plans])
    pad, full_len = state.reference_layout(rows, width)
    block_start = None if g.threshold is None else state.device_tensor([p.block_starts[step] for p in plans])
    new = llada_step(logits, state.tokens[index, :width], masked, block_end,
                     None if g.threshold is not None else [p.counts[step] for p in plans], gen=g,
                     token_ids=state.token_ids, rows=rows, softmax_fp64=state.rules.softmax_fp64, pad=pad,
                     rand=state.rand, full_len=full_len, candidates=candidates, block_start=block_start)
    state.tokens[index, :width] = new
    return new


class LLaDARule(CommitRule):
    """A fixed count per step in the current block (module docstring). The host knows what each
    step commits (``min(count, masks left in the block)``): nothing is read back."""

    name = "llada"

    def plan(self, state: BatchState, b: int, stop: int, *, start: int = 0) -> StepPlan:
        return llada_plan(stop, state.gen, start=start, first_mask=state.first_masked)

    def choice(self, state: BatchState, rows: list[int], step: int) -> StepChoice | None:
        """Greedy steps (no temperature, no random remasking): the choice is a function of the
        logits and the plans' counts and blocks alone."""
        if state.gen.temperature > 0 or state.gen.remasking == "random":
            return None
        plans = [state.plans[r] for r in rows]
        counts = tuple(p.counts[step] for p in plans)
        blocks = tuple((p.block_starts[step], p.block_ends[step]) for p in plans)
        return StepChoice(("llada", counts, blocks), lambda logits: llada_choose(state, rows, step, logits),
                          lambda _: self._count(state, rows, step))

    def commit(self, state: BatchState, rows: list[int], step: int, logits: torch.Tensor) -> None:
        llada_choose(state, rows, step, logits)
        self._count(state, rows, step)

    @staticmethod
    def _count(state: BatchState, rows: list[int], step: int) -> None:
        for r in rows:
            state.window.masks.commit(r, state.plans[r].block_starts[step], state.plans[r].counts[step])
