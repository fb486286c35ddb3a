"""The response window of one ``generate`` call: how many positions each request keeps.

Every request starts with the full window of ``width`` (``gen_length``) positions. Seer cuts a
window at step 0 (to ``L*``) and its guard may extend it again; nothing else changes a length.
:class:`WindowState` is the only place the lengths live: a host list (what schedules and the
router read) and a device int32 tensor (what masks and kernels read), the device copy updated
only when a length changes. Positions at or past a request's length are dead: never computed
again, and reported as EOS padding.
"""

from __future__ import annotations

import torch


class WindowState:
    """Per-request window lengths: ``lengths`` on the host, :meth:`device_lengths` on the device.

    ``cut_pending`` is True from the moment a policy announces it will cut the windows inside
    step 0 (Seer) until it has: policies that need settled lengths (the router) wait for it.
    ``version`` counts the changes, so a cache keyed on it knows when to rebuild.
    """

    def __init__(self, batch_size: int, width: int, device: torch.device) -> None:
        self.width = width
        self.device = device
        self._host = [width] * batch_size
        self._device = torch.full((batch_size,), width, dtype=torch.int32, device=device)
        self._device_stale = False
        self.version = 0
        self.cut_pending = False

    def __len__(self) -> int:
        return len(self._host)

    def __getitem__(self, b: int) -> int:
        return self._host[b]

    @property
    def lengths(self) -> list[int]:
        """A copy of every request's length (host ints)."""
        return list(self._host)

    def longest(self, rows: list[int] | None = None) -> int:
        """The longest window among ``rows`` (default: every request)."""
        return max(self._host) if rows is None else max(self._host[r] for r in rows)

    def set(self, b: int, length: int) -> None:
        """Request ``b`` keeps ``length`` positions, ``1 <= length <= width``."""
        if not 1 <= length <= self.width:
            raise ValueError(f"a window keeps 1..{self.width} positions, got {length} for request {b}")
        if self._host[b] != length:
            self._host[b] = length
            self._device_stale = True
            self.version += 1

    def device_lengths(self) -> torch.Tensor:
        """int32 ``[B]`` on the device (uploaded once after each change)."""
        if self._device_stale:
            self._device = torch.tensor(self._host, dtype=torch.int32, device=self.device)
            self._device_stale = False
        return self._device

    def live_mask(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """bool ``[R, width]``: position j of request ``rows[r]`` (int64 device index) is live."""
        positions = torch.arange(width, device=self.device)
        return positions[None, :] < self.device_lengths().index_select(0, rows)[:, None]
