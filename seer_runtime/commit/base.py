"""The commit rules' interface (:class:`CommitRule`), and what several rules share."""

from __future__ import annotations

import torch

from ..batch import BatchState
from ..plans import StepPlan
from ..runner import StepChoice


class CommitRule:
    """The interface of a commit rule (module docstring); ``name`` says which."""

    name = "rule"

    def plan(self, state: BatchState, b: int, stop: int, *, start: int = 0) -> StepPlan:
        """A fresh plan for the masks of request ``b`` in window positions ``[start, stop)``."""
        raise NotImplementedError

    def extended_plan(self, state: BatchState, b: int, old: int, step: int, *, old_masks: int) -> StepPlan:
        """Request ``b``'s plan after its window grew from ``old`` positions (Seer's guard) at
        ``step``; ``old_masks``: the masks its old window still had."""
        region = self.plan(state, b, state.window[b], start=old)
        plan = state.plans[b] if old_masks else state.plans[b].keep_first(step + 1)  # a done window's idle steps go
        return plan.then(region)

    def choice(self, state: BatchState, rows: list[int], step: int) -> StepChoice | None:
        """The step's choice as device work with fixed shapes (a graph can hold it), or None."""
        return None

    def commit(self, state: BatchState, rows: list[int], step: int, logits: torch.Tensor) -> None:
        """Choose and commit the step's tokens from the window logits ``[R, W, V]`` (eagerly)."""
        raise NotImplementedError

    def step_reads(self, state: BatchState) -> dict[str, torch.Tensor] | None:
        """Device counts the host needs after the step (read with the step's one read)."""
        return None

    def after_read(self, state: BatchState, step: int, values: dict[str, list[int]]) -> None:
        """The step's read is in ``values``: the host's counts brought up to date."""

    def after_step(self, state: BatchState, step: int) -> bool:
        """The step is over; True when the rule itself plans more steps (threshold decoding).
        A request in ``state.ended`` (early stop) is never planned again."""
        return False

    def steps_left(self, state: BatchState, b: int, step: int) -> int:
        """The steps request ``b``'s plan holds after step ``step`` (what ending it there saves)."""
        return max(0, state.plans[b].steps - step - 1)


def masks_left(state: BatchState, rows: list[int], window: torch.Tensor) -> torch.Tensor:
    """int64 ``[R]``: masked positions left in each of ``rows``' live windows (``window [R, W]``)."""
    live = state.window.live_mask(state.row_index(rows), window.shape[1])
    return ((window == state.token_ids.mask) & live).sum(dim=1)
