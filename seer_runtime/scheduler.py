"""The scheduler of one ``generate`` call: which requests step next, with which plan, and when
a request is done.

Where a step is decided: :meth:`Scheduler.step`. Its active rows are the requests with a step of
their plan left (LaViDa skips a step whose block has no mask left); the commit rule offers the
step's token choice in a form a graph can hold (``commit.CommitRule.choice``) and the model runner
runs the forward(s), with the choice inside when it can (``runner.ModelRunner.run``); a cut of
the windows found during the forward is planned here, then the rule commits the tokens. After the
forward the step makes its one device->host read: the rule's masks left and what each policy
asks for, together (``batch.read_to_host``); the policies' window changes (Seer's guard: extend,
re-decode) are applied here, and the rule may plan further steps (threshold decoding).

Where a request ends: when its plan has no step left, or, with ``GenerationConfig.early_stop``,
on the step that commits one of its end tokens with every earlier window position committed
(:meth:`Scheduler.answer_complete`, read with the step's one read): its plan is cut there, no
window change or rule re-plans it, and it leaves the batch's forwards.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .batch import BatchState, first_true, is_end_token, read_to_host
from .commit import CommitRule
from .profiling import prange
from .runner import Cut, ModelRunner
from .window import Extend, Redecode


class Scheduler:
    """The step loop of one call over ``state`` (module docstring)."""

    def __init__(self, state: BatchState, runner: ModelRunner, rule: CommitRule, *, policies: Sequence = (),
                 progress: bool = False) -> None:
        self.state, self.runner, self.rule = state, runner, rule
        self.policies = tuple(policies)
        self.progress = progress
        self._completing: list[int] | None = None  # the rows whose answer_complete the step reads
        state.plans = [rule.plan(state, b, state.width) for b in range(state.batch_size)]
        state.window.cut_pending = any(p.cuts_at_step0 for p in self.policies)

    def run(self) -> None:
        """Every step, until no request has one left and no policy asks for more. The progress
        bar counts denoising steps against the longest plan, which a cut or an early stop
        shortens and Seer's guard or threshold decoding lengthens; it ends full."""
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self._planned_steps(), desc="denoising steps", unit="step", leave=False)
        step = 0
        while self.step(step):
            step += 1
            if bar is not None:
                bar.total = max(step, self._planned_steps())
                bar.update(1)
        if bar is not None:
            bar.total = bar.n = max(bar.n, 1)
            bar.refresh()
            bar.close()

    def _planned_steps(self) -> int:
        return max(p.steps for p in self.state.plans)

    def release(self) -> None:
        """The call is over (returned or raised): its graphs, layouts' buffers, caches and the
        policies' state let go (not at Python's next cyclic collection)."""
        self.runner.release()
        self.state.release()
        for p in self.policies:
            p.release()

    def active_rows(self, step: int) -> list[int]:
        state = self.state
        rows, skips_finished, masks = [], state.rules.skips_finished_blocks, state.window.masks
        for b, plan in enumerate(state.plans):
            if step >= plan.steps:
                continue
            if skips_finished and not masks.left(b, plan.block_starts[step], plan.block_ends[step]):
                continue
            rows.append(b)
        return rows

    def step(self, step: int) -> bool:
        """Run denoising step ``step``; False when no request had a step left and nothing asks for more."""
        state = self.state
        with prange("step"):
            ran = not all(step >= p.steps for p in state.plans)
            if ran:
                rows = self.active_rows(step)
                if rows:
                    state.window.device_lengths()  # refreshed here, outside any captured forward
                    self._forward_and_commit(rows, step)
                    state.window.cut_pending = False  # step 0 has cut what it cuts
                    for r in rows:
                        state.steps_done[r] += 1
                    if state.gen.early_stop:
                        self._completing = rows
                    self.runner.end_step(step)
            values = self.read(step)
            self.rule.after_read(state, step, values)
            self.end_complete_answers(step, values)
            changed = False
            for p in self.policies:
                changed |= self.apply(p.after_step(state, step, values), step)
            more = self.rule.after_step(state, step)
        return ran or changed or more

    def _forward_and_commit(self, rows: list[int], step: int) -> None:
        state, rule = self.state, self.rule
        t0 = time.perf_counter()
        choice = rule.choice(state, rows, step) if self.runner.graphs.backend is not None else None
        logits, chosen, cut = self.runner.run(rows, step, choice)
        if chosen is not None:
            choice.commit(chosen)
            state.stats.add_time("forward", time.perf_counter() - t0)  # the choice included
            return
        t1 = time.perf_counter()
        if cut is not None:
            self.plan_cut(cut)
        with prange("sample"), prange(f"commit/{rule.name}"):
            rule.commit(state, rows, step, logits)
        state.stats.add_time("forward", t1 - t0)
        state.stats.add_time("sample", time.perf_counter() - t1)

    def read(self, step: int) -> dict[str, list[int]]:
        """The one device->host read of a step: the rule's counts and what each policy asks for
        (``Policy.step_reads``), concatenated and read together; nothing when nobody asks."""
        wanted = dict(self.rule.step_reads(self.state) or {})
        if self._completing is not None:
            wanted["answer_complete"] = self.answer_complete(self._completing)
        for p in self.policies:
            for name, value in (p.step_reads(self.state, step) or {}).items():
                if name in wanted:
                    raise ValueError(f"step value {name!r} is asked for twice")
                wanted[name] = value
        return dict(zip(wanted, read_to_host(list(wanted.values())))) if wanted else {}

    # -- early stop --------------------------------------------------------------------------------
    def answer_complete(self, rows: list[int]) -> torch.Tensor:
        """bool ``[R]`` on the device: row ``rows[r]``'s live window holds an end token before its
        first masked position (every position before the end token is committed, so no later
        step can change the answer)."""
        state = self.state
        index = state.row_index(rows)
        width = state.window.longest(rows)
        window = state.tokens[index, :width]
        live = state.window.live_mask(index, width)
        first_mask = first_true((window == state.token_ids.mask) & live)
        return first_true(is_end_token(window, state.token_ids.end_ids) & live) < first_mask

    def end_complete_answers(self, step: int, values: dict[str, list[int]]) -> None:
        """Early stop: the requests whose answer the step completed end after it (module docstring)."""
        rows, self._completing = self._completing, None
        if rows is None:
            return
        state = self.state
        for b, complete in zip(rows, values["answer_complete"]):
            if complete:
                state.steps_saved[b] = self.rule.steps_left(state, b, step)
                state.plans[b] = state.plans[b].keep_first(step + 1)
                state.ended.add(b)

    # -- window changes ----------------------------------------------------------------------------
    def plan_cut(self, cut: Cut) -> None:
        """Windows cut during a forward (their lengths already set): each plans its shorter window."""
        for b in cut.lengths:
            self.state.plans[b] = self.rule.plan(self.state, b, self.state.window[b])

    def apply(self, changes: list[Extend | Redecode], step: int) -> bool:
        """Window changes from step ``step`` on; True when one changed a plan. A request early stop
        ended keeps its window (its answer is complete)."""
        changed = False
        for change in changes:
            if change.b in self.state.ended:
                continue
            changed |= self.redecode(change.b, step) if isinstance(change, Redecode) else self.extend(
                change.b, change.length, step)
        return changed

    def extend(self, b: int, length: int, step: int) -> bool:
        """Give request ``b`` the masked positions ``[window, length)`` (at most the full window)
        from step ``step + 1`` on; False when that adds none."""
        state = self.state
        old, length = state.window[b], min(state.width, length)
        if length <= old:
            return False
        old_masks = state.window.masks.left(b, 0, old)
        state.window.set(b, length)
        state.plans[b] = self.rule.extended_plan(state, b, old, step, old_masks=old_masks)
        return True

    def redecode(self, b: int, step: int) -> bool:
        """Decode request ``b`` again on the full window from step ``step + 1`` on."""
        state = self.state
        state.tokens[b, state.first_masked:] = state.token_ids.mask
        state.window.reset(b)
        state.plans[b] = state.plans[b].keep_first(step + 1).then(self.rule.plan(state, b, state.width))
        return True
