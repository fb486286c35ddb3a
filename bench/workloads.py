"""Workloads shared by the CPU benchmarks and the GPU check (no pytest import: the GPU machine
installs the package without the dev extras)."""

from __future__ import annotations

import random


def answer_lengths(n: int, *, window: int, seed: int = 0) -> list[int]:
    """``n`` answer lengths for serving benchmarks: 60% short (1-8 tokens), 35% long (9-30),
    5% that fill the ``window`` (the window sizes of SPEC.md §1.6 put most answers far below it)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(rng.randint(1, 8) if u < 0.6 else rng.randint(9, 30) if u < 0.95 else window)
    return out
