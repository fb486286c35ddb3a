"""Dream's rule (``diffusion_generate``; LaViDa-Dream): one global schedule ``linspace(1, eps,
steps + 1)``; each step commits ``int(masks * (1 - s / t))`` positions (the last step: all), by
``origin`` (each masked position with probability ``1 - s / t``) or ranked by a confidence
(``maskgit_plus``: probability, ``topk_margin``, ``entropy``), optionally drawn with ``alg_temp``.

The count depends on the masks left, which a step's commits change on the device (a position
may be given the mask id again): each step's masks left are read with the step's one read. A
greedy ranked step with fixed shapes is one graph unit with the forward (:meth:`DreamRule.choice`);
with ``tie_break="stable"`` each row's count comes from a buffer written only when it changes, so
one graph serves every step of a layout.
"""

from __future__ import annotations

import torch

from ..batch import BatchState
from ..plans import StepPlan, dream_plan
from ..runner import StepChoice
from ..sampling import NEG_INF, dream_sample_tokens, pad_front, select_topk
from ..schedules import dream_count, transfer_probability
from .base import CommitRule, masks_left

#: the confidence ``dream_sample_tokens`` ranks by, per Dream ``alg`` that ranks (not ``origin``)
DREAM_CONFIDENCE = {"maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}


def masked_items(state: BatchState, rows: list[int], masked: torch.Tensor):
    """The masked positions of ``rows``, row-major (their number per row known on the host: no
    read): ``(per_row counts, row starts, item rows, item positions)``."""
    per_row = [state.window.masks.left(r) for r in rows]
    starts = [sum(per_row[:i]) for i in range(len(rows))]
    where = torch.nonzero_static(masked, size=sum(per_row))
    return per_row, starts, where[:, 0], where[:, 1]


class DreamRule(CommitRule):
    """Dream's algorithms (module docstring)."""

    name = "dream"

    def __init__(self, state: BatchState) -> None:
        self._pending: tuple[list[int], torch.Tensor] | None = None  # the masks left, read at the step's end
        self._row_counts: torch.Tensor | None = None  # tie_break="stable": each row's count (int64 [B])
        self._row_counts_written: tuple[int, ...] | None = None

    def plan(self, state: BatchState, b: int, stop: int, *, start: int = 0) -> StepPlan:
        return dream_plan(stop, state.gen, state.rules, masks=state.window.masks.left(b, start, stop), start=start,
                          positions=stop if start == 0 else stop - start)

    def extended_plan(self, state: BatchState, b: int, old: int, step: int, *, old_masks: int) -> StepPlan:
        """One global schedule: every mask left planned again (Dream's last step commits all)."""
        masks = state.window.masks.left(b)
        return state.plans[b].keep_first(step + 1).then(
            dream_plan(state.window[b], state.gen, state.rules, masks=masks, positions=masks))

    def counts(self, state: BatchState, rows: list[int], step: int, per_row: list[int]) -> list[int]:
        """Positions each row commits at ``step``, ``per_row`` its masks left."""
        counts = []
        for r, left in zip(rows, per_row):
            plan = state.plans[r]
            k = plan.counts[step]
            if k is None:
                t, s = plan.ts[step]
                k = dream_count(left, t, s, plan.last[step])
            counts.append(min(int(k), left))
        return counts

    # -- the step's masks left, read at its end ---------------------------------------------------
    def _read_later(self, state: BatchState, rows: list[int], left: torch.Tensor) -> None:
        self._pending = (rows, left)
        state.window.masks.pending = True

    def step_reads(self, state: BatchState) -> dict[str, torch.Tensor] | None:
        return None if self._pending is None else {"masks_left": self._pending[1]}

    def after_read(self, state: BatchState, step: int, values: dict[str, list[int]]) -> None:
        if self._pending is not None:
            state.window.masks.set_window_left(self._pending[0], values["masks_left"])
            self._pending = None
            state.window.masks.pending = False

    # -- a choice with fixed shapes ---------------------------------------------------------------
    def choice(self, state: BatchState, rows: list[int], step: int) -> StepChoice | None:
        """Greedy tokens ranked by confidence (not ``origin``, no ``alg_temp`` draw) and either the
        leftmost among equals (``tie_break="stable"``: any counts, one sort of each whole row) or
        ``torch.topk``'s ties over the whole row (a family that ranks every position) with the same
        count for every row; None otherwise (:meth:`commit` runs)."""
        g = state.gen
        if (g.temperature > 0 or g.alg == "origin" or (g.alg_temp is not None and g.alg_temp > 0)
                or (g.tie_break != "stable" and state.rules.ranks_masked_only)):
            return None
        counts = self.counts(state, rows, step, state.window.masks.window_left(rows))
        k = counts[0]
        if g.tie_break != "stable" and any(c != k for c in counts):
            return None  # topk per row, each with its own ties
        if g.tie_break == "stable":
            k = None  # each row's count, from the buffer
            written = tuple(counts)
            if self._row_counts is None:
                self._row_counts = torch.zeros(state.batch_size, dtype=torch.long, device=state.device)
            if written != self._row_counts_written:
                self._row_counts[: len(rows)].copy_(state.device_tensor(counts))
                self._row_counts_written = written
        return StepChoice(("dream", "per-row" if k is None else k), lambda logits: self._choose(state, rows, logits, k),
                          lambda left: self._read_later(state, rows, left))

    def _choose(self, state: BatchState, rows: list[int], logits: torch.Tensor, k: int | None) -> torch.Tensor:
        """Commit the ``k`` most confident masked positions of each row into ``state.tokens`` with
        fixed shapes (device work only: every position's token and confidence, the masked ones
        ranked; what :meth:`commit` commits, bitwise, where :meth:`choice` allows). ``k`` None:
        row ``i`` commits ``self._row_counts[i]``, ranked by one stable sort of the row. Returns each
        row's masks left (int64 ``[R]``)."""
        g = state.gen
        R, width = logits.shape[0], logits.shape[1]
        index = state.row_index(rows)
        window = state.tokens[index, :width]
        if k is None or k > 0:
            masked = state.masked(rows, width)
            conf, x0 = dream_sample_tokens(logits.reshape(R * width, -1), temperature=0.0, top_p=g.top_p,
                                           top_k=g.top_k, confidence=DREAM_CONFIDENCE[g.alg], rand=state.rand,
                                           item_counts=[width] * R, row_ids=rows)
            full_conf = torch.where(masked, conf.view(R, width).to(logits.dtype), NEG_INF)
            candidate = torch.where(masked, x0.view(R, width), window)
            if k is None:  # each row's own count: the positions whose rank in the row is below it
                order = torch.sort(full_conf, dim=1, descending=True, stable=True).indices
                rank = torch.empty_like(order).scatter_(
                    1, order, torch.arange(width, device=order.device).expand(R, width))
                window = torch.where(rank < self._row_counts[:R, None], candidate, window)
            else:  # Dream ranks the whole [B, prompt + window] confidence matrix in one call
                pad, _ = state.reference_layout(rows, width)
                sel = torch.topk(pad_front(full_conf, pad), k, dim=-1).indices - pad
                window = window.scatter(1, sel, candidate.gather(1, sel))
            state.tokens[index, :width] = window
        return masks_left(state, rows, window)

    # -- eagerly ----------------------------------------------------------------------------------
    def commit(self, state: BatchState, rows: list[int], step: int, logits: torch.Tensor) -> None:
        width = logits.shape[1]
        index = state.row_index(rows)
        window = state.tokens[index, :width].clone()
        per_row, starts, item_rows, item_pos = masked_items(state, rows, state.masked(rows, width))
        mask_logits = logits[item_rows, item_pos]
        if state.gen.alg == "origin":
            x0 = self._origin(state, rows, step, mask_logits, per_row, starts, item_rows)
            window[item_rows, item_pos] = x0
        else:
            self._ranked(state, rows, step, window, mask_logits, per_row, starts, item_rows, item_pos)
        state.tokens[index, :width] = window
        self._read_later(state, rows, masks_left(state, rows, window))

    def _origin(self, state, rows, step, mask_logits, per_row, starts, item_rows) -> torch.Tensor:
        """``origin``: each masked position transfers with probability ``1 - s / t`` (all at the last
        step); returns the masked positions' new tokens (the mask id where none transfers)."""
        g = state.gen
        p_transfer = state.upload([1.0 if state.plans[r].last[step] else transfer_probability(*state.plans[r].ts[step])
                                   for r in rows], torch.float32)
        transfer = self._uniform_items(state, rows, per_row, starts) < p_transfer[item_rows]
        x0 = torch.full((mask_logits.shape[0],), state.token_ids.mask, dtype=torch.long, device=state.device)
        if g.temperature > 0:
            # the reference draws for the transferred positions alone: their number is read
            transferred = torch.zeros(len(rows), dtype=torch.long, device=state.device).index_add_(
                0, item_rows, transfer.long()).tolist()
            if sum(transferred):
                chosen = torch.nonzero_static(transfer, size=sum(transferred)).flatten()
                _, tokens = dream_sample_tokens(mask_logits[chosen], temperature=g.temperature, top_p=g.top_p,
                                                top_k=g.top_k, confidence="prob", rand=state.rand,
                                                item_counts=transferred, row_ids=rows)
                x0[chosen] = tokens
            return x0
        # greedy: every masked position's choice, kept where it transfers (no draw, no read)
        _, tokens = dream_sample_tokens(mask_logits, temperature=0.0, top_p=g.top_p, top_k=g.top_k, confidence="prob",
                                        rand=state.rand, item_counts=per_row, row_ids=rows)
        return torch.where(transfer, tokens, x0)

    @staticmethod
    def _uniform_items(state: BatchState, rows: list[int], per_row: list[int], starts: list[int]) -> torch.Tensor:
        """``torch.rand`` over the flattened masked positions (row-major)."""
        total = sum(per_row)
        if state.rand.mode == "global":
            return torch.rand(total, device=state.device)
        out = torch.empty(total, device=state.device)
        for r, n, start in zip(rows, per_row, starts):
            out[start: start + n] = state.rand.uniform([r], (n,), device=state.device)[0]
        return out

    def _ranked(self, state, rows, step, window, mask_logits, per_row, starts, item_rows, item_pos) -> None:
        """A ranked algorithm: each row's count of its most confident masked positions (or drawn
        with ``alg_temp``), committed into ``window`` in place."""
        g = state.gen
        conf, x0 = dream_sample_tokens(mask_logits, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                                       confidence=DREAM_CONFIDENCE[g.alg], rand=state.rand, item_counts=per_row,
                                       row_ids=rows)
        counts = self.counts(state, rows, step, per_row)
        full_conf = torch.full(window.shape, NEG_INF, dtype=mask_logits.dtype, device=state.device)
        full_conf[item_rows, item_pos] = conf.to(mask_logits.dtype)
        candidate = window.clone()
        candidate[item_rows, item_pos] = x0
        pad, _ = state.reference_layout(rows, window.shape[1])
        compact = state.rules.ranks_masked_only
        sampled = g.alg_temp is not None and g.alg_temp > 0
        if not compact and len(set(counts)) == 1 and (g.tie_break == "reference"
                                                      or (sampled and state.rand.mode == "global")):
            if counts[0] > 0:  # Dream ranks the whole [B, prompt + window] confidence matrix in one call
                vec = pad_front(full_conf, pad)
                if sampled:
                    sel = torch.multinomial(torch.softmax(vec / g.alg_temp, dim=-1), num_samples=counts[0]) - pad
                else:
                    sel = torch.topk(vec, counts[0], dim=-1).indices - pad
                window.scatter_(1, sel, candidate.gather(1, sel))
            return
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
                pick = state.rand.multinomial(weights, k, r) - (0 if compact else pad)
            else:
                pick = select_topk(vec, k, tie_break=g.tie_break, pad=0 if compact else pad)
            sel = positions[pick] if compact else pick
            window[local, sel] = candidate[local, sel]
