"""Workloads shared by the CPU benchmarks and the GPU check (no pytest import: the GPU machine
installs the package without the dev extras): answer lengths, and a policy that cuts to them."""

from __future__ import annotations

import random

from seer_runtime.policy import Policy
from seer_runtime.runner import Cut


def answer_lengths(n: int, *, window: int, seed: int = 0) -> list[int]:
    """``n`` answer lengths for serving benchmarks: 60% short (1-8 tokens), 35% long (9-30),
    5% that fill the ``window`` (the window sizes of SPEC.md §1.6 put most answers far below it)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(rng.randint(1, 8) if u < 0.6 else rng.randint(9, 30) if u < 0.95 else window)
    return out


class OracleCut(Policy):
    """Cut every request's window to a given length before step 0, as Seer would with a perfect
    probe (random-weight models have no answer end to find): the serving benchmarks' workload.

    keep_len: one length per request, each in ``[1, gen_length]``; no guard (the lengths are the
    truth)."""

    name = "oracle_cut"

    def __init__(self, keep_len: list[int]) -> None:
        self.keep_len = [int(n) for n in keep_len]

    def start(self, state, model) -> Cut:
        if len(self.keep_len) != state.batch_size:
            raise ValueError(f"keep_len has {len(self.keep_len)} lengths for {state.batch_size} requests")
        for b, n in enumerate(self.keep_len):
            if not 1 <= n <= state.width:
                raise ValueError(f"keep_len[{b}] = {n} must lie in [1, {state.width}]")
        return Cut(dict(enumerate(self.keep_len)))
