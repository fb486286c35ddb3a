"""Accuracy with its uncertainty: one configuration's verdicts against the baseline's on the same
requests, and the one rule every command uses to call two accuracies equal.

A difference of a few answers on a few dozen requests is not evidence either way, so ``seer demo``,
``seer calibrate`` and ``seer calibrate-dyllm`` report beside each accuracy the paired flips against
the baseline (right->wrong, wrong->right) and McNemar's exact two-sided p-value
(:mod:`seer_runtime.significance`), and say in words whether the difference is noise.

**Equal accuracy** (:func:`keeps_accuracy`; the demo's recommendation, the calibrations' choices
and their confirmations): a configuration keeps the baseline's accuracy when

* its accuracy is at most ``max_drop`` below the baseline's (default :data:`MAX_DROP`, one point),
  and
* its flips are not a significant loss: McNemar's p > 0.05, or more wrong->right than
  right->wrong flips (a significant gain is not a loss).

On 64 requests one answer is 1.6 points, so there "within one point" means no net answer lost;
on 500 requests it allows five.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..significance import ALPHA, PairedComparison, compare_answers

#: the accuracy a configuration may lose against the baseline and still count as equal (one point)
MAX_DROP = 0.01


def right_answers(requests: Sequence, answers: Sequence[list[int]],
                  score: Callable[[list, list], float]) -> list[bool]:
    """Per-request verdicts (True: right) of ``answers`` under ``score``, the workload's aggregate
    scorer ``(requests, answers) -> accuracy`` applied to each request alone (it returns 1.0 for a
    right answer, 0.0 for a wrong one). A request ``score`` cannot judge (NaN: no reference) is a
    ``ValueError``: the caller gives such requests a reference first (the baseline's answer)."""
    if len(requests) != len(answers):
        raise ValueError(f"{len(requests)} requests but {len(answers)} answers")
    verdicts = []
    for i, (request, answer) in enumerate(zip(requests, answers)):
        value = float(score([request], [answer]))
        if math.isnan(value):
            raise ValueError(f"request {i} has no reference answer to be scored against")
        verdicts.append(value >= 0.5)
    return verdicts


def keeps_accuracy(cmp: PairedComparison, max_drop: float = MAX_DROP) -> bool:
    """The module's rule: at most ``max_drop`` below the baseline and no significant loss."""
    significant_loss = cmp.p_value <= ALPHA and cmp.right_to_wrong > cmp.wrong_to_right
    return cmp.accuracy >= cmp.baseline_accuracy - max_drop - 1e-12 and not significant_loss


def verdict(cmp: PairedComparison) -> str:
    """A few words: ``same verdicts``, ``within noise (p=0.62)``, ``worse (p=0.031)`` or ``better (...)``."""
    if cmp.right_to_wrong == cmp.wrong_to_right == 0:
        return "same verdicts"
    if cmp.within_noise:
        return f"within noise (p={cmp.p_value:.2g})"
    return f"{'worse' if cmp.right_to_wrong > cmp.wrong_to_right else 'better'} (p={cmp.p_value:.2g})"


def paired_figures(baseline_right: Sequence[bool], right: Sequence[bool], *, max_drop: float = MAX_DROP) -> dict:
    """The JSON figures of one configuration against the baseline on the same requests:
    ``right_to_wrong``, ``wrong_to_right``, ``p_value`` (McNemar, exact, two-sided), ``within_noise``
    (p > 0.05), ``verdict`` (:func:`verdict`) and ``keeps_accuracy`` (:func:`keeps_accuracy`)."""
    cmp = compare_answers(list(baseline_right), list(right))
    return {"right_to_wrong": cmp.right_to_wrong, "wrong_to_right": cmp.wrong_to_right, "p_value": cmp.p_value,
            "within_noise": cmp.within_noise, "verdict": verdict(cmp),
            "keeps_accuracy": keeps_accuracy(cmp, max_drop)}


def comparison(baseline_right: Sequence[bool], right: Sequence[bool]) -> PairedComparison:
    """:func:`seer_runtime.significance.compare_answers` (re-exported for the calibrations)."""
    return compare_answers(list(baseline_right), list(right))
