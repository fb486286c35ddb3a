"""The response window of one ``generate`` call: how many positions each request keeps, and
how many of them are still masked.

Every request starts with the full window of ``width`` (``gen_length``) positions. Seer cuts a
window at step 0 (to ``L*``) and its guard may extend it again; nothing else changes a length.
:class:`WindowState` is the only place the lengths live: a host list (what schedules and the
router read) and a device int32 tensor (what masks and kernels read), the device copy updated
only when a length changes. Positions at or past a request's length are dead: never computed
again, never written, and reported as EOS padding. :class:`MaskCounts` (``WindowState.masks``)
follows the masked positions per block on the host, so that deciding a step never reads tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class WindowState:
    """Per-request window lengths: ``lengths`` on the host, :meth:`device_lengths` on the device.

    ``cut_pending`` is True from the moment a policy announces it will cut the windows inside
    step 0 (Seer) until it has: policies that need settled lengths (the router) wait for it.
    ``version`` counts the changes, so a cache keyed on it knows when to rebuild.
    """

    def __init__(self, batch_size: int, width: int, device: torch.device, *, block: int | None = None,
                 first_masked: int = 0) -> None:
        self.width = width
        self.device = device
        self._host = [width] * batch_size
        self._device = torch.full((batch_size,), width, dtype=torch.int32, device=device)
        self._device_stale = False
        self.version = 0
        self.cut_pending = False
        self.masks = MaskCounts(batch_size, width, block or width, first_masked)

    def __len__(self) -> int:
        return len(self._host)

    def __getitem__(self, b: int) -> int:
        return self._host[b]

    @property
    def lengths(self) -> list[int]:
        """A copy of every request's length (host ints)."""
        return list(self._host)

    def lengths_of(self, rows: list[int]) -> tuple[int, ...]:
        """The lengths of ``rows``' windows as a tuple (a key part: the host decides on them)."""
        return tuple(map(self._host.__getitem__, rows))

    def longest(self, rows: list[int] | None = None) -> int:
        """The longest window among ``rows`` (default: every request)."""
        return max(self._host) if rows is None else max(map(self._host.__getitem__, rows))

    def set(self, b: int, length: int) -> None:
        """Request ``b`` keeps ``length`` positions, ``1 <= length <= width``."""
        if not 1 <= length <= self.width:
            raise ValueError(f"a window keeps 1..{self.width} positions, got {length} for request {b}")
        if self._host[b] != length:
            self.masks.resize(b, self._host[b], length)
            self._host[b] = length
            self._device_stale = True
            self.version += 1

    def reset(self, b: int) -> None:
        """Request ``b`` is decoded again: the full window, every position masked (but pre-filled ones)."""
        self.set(b, self.width)
        self.masks.reset(b, self.width)

    def device_lengths(self) -> torch.Tensor:
        """int32 ``[B]`` on the device: always the same tensor (graphs read it by address),
        updated in place after a change by a copy the host does not wait for."""
        if self._device_stale:
            host = torch.tensor(self._host, dtype=torch.int32, pin_memory=self._device.is_cuda)
            self._device.copy_(host, non_blocking=True)
            self._device_stale = False
        return self._device

    def live_mask(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """bool ``[R, width]``: position j of request ``rows[r]`` (int64 device index) is live."""
        positions = torch.arange(width, device=self.device)
        return positions[None, :] < self.device_lengths().index_select(0, rows)[:, None]


class MaskCounts:
    """How many masked positions each request has left in each block of its live window, kept
    on the host so that no step has to read the tokens to know it.

    Blocks follow the grid of ``block`` positions (Dream: one block, the whole window). Every
    change of the tokens or the windows goes through it: :meth:`commit` (a step committed up to
    ``k`` masks in a block), :meth:`resize` (a window cut or extended: the positions it gains or
    loses are masks, since a dead position is never written), :meth:`reset` (a request decoded
    again from its first masked position).
    """

    def __init__(self, batch_size: int, width: int, block: int, first_masked: int) -> None:
        self.width, self.block, self.first_masked = width, block, first_masked
        self.pending = False  # a Dream step's counts are on the device, read at the end of the step
        self._cells = (width + block - 1) // block
        self._counts = [self._full(width) for _ in range(batch_size)]

    def _full(self, length: int) -> list[int]:
        counts = [max(0, min(length, (c + 1) * self.block) - c * self.block) for c in range(self._cells)]
        if self.first_masked and length:
            counts[0] -= self.first_masked  # pre-filled positions (LaViDa-Dream's first token)
        return counts

    def left(self, b: int, start: int = 0, stop: int | None = None) -> int:
        """Masks of request ``b`` in the blocks covering ``[start, stop)`` (block-aligned ``start``)."""
        stop = self.width if stop is None else stop
        first, last = start // self.block, (stop - 1) // self.block
        return sum(self._counts[b][first: last + 1]) if stop > start else 0

    def window_left(self, rows: list[int]) -> list[int]:
        """Masks left in each of ``rows``' whole windows (``left(b)`` per row, in one call)."""
        if self._cells == 1:
            return [self._counts[b][0] for b in rows]
        return [sum(self._counts[b]) for b in rows]

    def commit(self, b: int, block_start: int, k: int) -> int:
        """A step asked for ``k`` commits in the block starting at ``block_start``: returns how many
        it made (``min(k, masks left there)``)."""
        cell = block_start // self.block
        done = min(int(k), self._counts[b][cell])
        self._counts[b][cell] -= done
        return done

    def set_left(self, b: int, n: int) -> None:
        """Request ``b`` has ``n`` masks left, as counted on the device (one block: Dream). While
        such counts are on their way to the host, :attr:`pending` is True."""
        if self._cells != 1:
            raise ValueError("set_left counts a whole window; this one has several blocks")
        self._counts[b][0] = int(n)

    def set_window_left(self, rows: list[int], counts: list[int]) -> None:
        """:meth:`set_left` for each of ``rows`` (one block: Dream), ``counts`` in the same order."""
        if self._cells != 1:
            raise ValueError("set_window_left counts a whole window; this one has several blocks")
        if len(rows) != len(counts):
            raise ValueError(f"counts: one per row ({len(rows)}), got {len(counts)}")
        for b, n in zip(rows, counts):
            self._counts[b][0] = int(n)

    def set_block_left(self, b: int, block_start: int, n: int) -> None:
        """Request ``b`` has ``n`` masks left in the block starting at ``block_start``, as counted
        on the device (a threshold step commits a number the host cannot know)."""
        self._counts[b][block_start // self.block] = int(n)

    def resize(self, b: int, old: int, new: int) -> None:
        """Request ``b``'s window went from ``old`` to ``new`` live positions."""
        lo, hi, sign = (new, old, -1) if new < old else (old, new, 1)
        for pos in range(lo, hi):
            if pos >= self.first_masked:
                self._counts[b][pos // self.block] += sign

    def reset(self, b: int, length: int) -> None:
        """Request ``b`` is all masks again over ``length`` positions (its pre-filled ones kept)."""
        self._counts[b] = self._full(length)


class Extend(NamedTuple):
    """Request ``b`` gets masked positions up to ``length`` (at most the full window) from the
    next step on (Seer's over-truncation guard, or a premature cut re-extended)."""

    b: int
    length: int


class Redecode(NamedTuple):
    """Request ``b`` is decoded again on the full window from the next step on."""

    b: int
