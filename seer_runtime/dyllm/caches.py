"""DyLLM's per-layer caches: each request's rotated keys, values, attention context (before the
output projection) and FFN output (before the residual), over its cached prompt positions and
its window (:class:`DyLLMCaches`)."""

from __future__ import annotations

import torch

KINDS = ("keys", "values", "contexts", "ffn_outputs")


class DyLLMCaches:
    """Every layer's caches ``[B, cached_prompt + capacity, ...]`` of each kind (``KINDS``), made
    at the first dense forward; ``generation`` counts their reallocations (graphs read them by
    address, so a graph key holds it)."""

    def __init__(self, layers: int, *, cached_prompt: int, capacity: int) -> None:
        self.cached_prompt, self.capacity = cached_prompt, capacity  # prompt positions, window positions
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.contexts: list[torch.Tensor | None] = [None] * layers
        self.ffn_outputs: list[torch.Tensor | None] = [None] * layers
        self.generation = 0
        self._flat: dict[tuple[str, int], torch.Tensor] = {}  # flat views of this generation's caches
        self._flat_generation = 0

    def fit(self, capacity: int) -> bool:
        """Resize every cache to ``capacity`` window positions (Seer's cut shrinks, its guard
        grows); True when they changed."""
        if capacity == self.capacity:
            return False
        keep = self.cached_prompt + min(capacity, self.capacity)
        self.generation += 1
        for kind in KINDS:
            caches = getattr(self, kind)
            for i, t in enumerate(caches):
                if t is None:
                    continue
                new = t.new_zeros((t.shape[0], self.cached_prompt + capacity, *t.shape[2:]))
                new[:, :keep] = t[:, :keep]
                caches[i] = new
        self.capacity = capacity
        return True

    def layer(self, kind: str, i: int, like: torch.Tensor, batch: int) -> torch.Tensor:
        """Layer ``i``'s cache ``kind``, made like ``like`` (``[R, L, ...]``) for ``batch`` requests
        at its first use."""
        caches = getattr(self, kind)
        if caches[i] is None:
            caches[i] = like.new_zeros((batch, self.cached_prompt + self.capacity, *like.shape[2:]))
            self.generation += 1
        return caches[i]

    def flat(self, kind: str, i: int) -> torch.Tensor:
        """Layer ``i``'s cache ``kind`` as ``[B * Lc, ...]``: a view, made once per generation (the
        sparse layers read and write the caches through these every step)."""
        if self._flat_generation != self.generation:
            self._flat.clear()
            self._flat_generation = self.generation
        view = self._flat.get((kind, i))
        if view is None:
            cache = getattr(self, kind)[i]
            view = self._flat[(kind, i)] = cache.view(-1, *cache.shape[2:])
        return view

    def release(self) -> None:
        for kind in KINDS:
            caches = getattr(self, kind)
            caches[:] = [None] * len(caches)
        self._flat.clear()  # views hold the caches' memory too
