"""Is an accuracy difference between two decodings of the same requests more than noise?

Two configurations answering the same requests are paired: what matters is the requests whose
verdict flips (right with the baseline and wrong with the other, or the reverse), not the two
accuracies apart. :func:`compare_answers` counts the flips and tests them with McNemar's exact
test (the two-sided binomial test of the discordant pairs at one half): with ``b`` right-to-wrong
and ``c`` wrong-to-right flips, ``p = min(1, 2 * P[X <= min(b, c)])`` for ``X ~ Binomial(b + c, 1/2)``
(1 when nothing flips). ``p > 0.05`` says the difference is within noise at that sample size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: below this p-value a difference is reported as more than noise
ALPHA = 0.05


def mcnemar_exact(right_to_wrong: int, wrong_to_right: int) -> float:
    """McNemar's exact two-sided p-value for ``right_to_wrong`` and ``wrong_to_right`` discordant pairs."""
    for name, value in (("right_to_wrong", right_to_wrong), ("wrong_to_right", wrong_to_right)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    n = right_to_wrong + wrong_to_right
    if n == 0:
        return 1.0
    k = min(right_to_wrong, wrong_to_right)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


@dataclass(frozen=True)
class PairedComparison:
    """Two decodings of the same ``requests``: their accuracies, the flips and McNemar's p-value."""

    requests: int
    baseline_accuracy: float
    accuracy: float
    right_to_wrong: int
    wrong_to_right: int
    p_value: float

    @property
    def within_noise(self) -> bool:
        return self.p_value > ALPHA

    def words(self) -> str:
        """One sentence a person reads: the difference, the flips, and whether it is noise."""
        diff = 100 * (self.accuracy - self.baseline_accuracy)
        flips = f"{self.right_to_wrong} right->wrong, {self.wrong_to_right} wrong->right"
        if self.right_to_wrong == self.wrong_to_right == 0:
            return f"the same verdict on all {self.requests} requests"
        verdict = ("within noise" if self.within_noise else "more than noise") + f" (McNemar p = {self.p_value:.3g}"
        return f"{diff:+.1f} points on {self.requests} requests ({flips}): {verdict}, n = {self.requests})"

    def as_dict(self) -> dict:
        return {"requests": self.requests, "baseline_accuracy": self.baseline_accuracy, "accuracy": self.accuracy,
                "right_to_wrong": self.right_to_wrong, "wrong_to_right": self.wrong_to_right,
                "p_value": self.p_value, "within_noise": self.within_noise}


def compare_answers(baseline: Sequence[bool], other: Sequence[bool]) -> PairedComparison:
    """The paired comparison of per-request verdicts (True: right) of two decodings, in the same order."""
    if len(baseline) != len(other):
        raise ValueError(f"the verdicts must be paired: {len(baseline)} baseline against {len(other)}")
    if not baseline:
        raise ValueError("no verdicts to compare")
    b = sum(1 for x, y in zip(baseline, other) if x and not y)
    c = sum(1 for x, y in zip(baseline, other) if y and not x)
    n = len(baseline)
    return PairedComparison(n, sum(map(bool, baseline)) / n, sum(map(bool, other)) / n, b, c, mcnemar_exact(b, c))
