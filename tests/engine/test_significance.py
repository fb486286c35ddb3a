"""McNemar's exact test of paired verdicts (seer_runtime.significance), against hand counts."""

from __future__ import annotations

import math

import pytest

from seer_runtime.significance import compare_answers, mcnemar_exact


def test_exact_p_values_equal_the_binomial_tails():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0  # balanced flips: no evidence
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 2**6)  # 6 flips one way: p = 2 * 0.5^6 = 0.03125
    assert mcnemar_exact(5, 1) == pytest.approx(2 * (1 + 6) / 2**6)
    n, k = 57, 20
    assert mcnemar_exact(k, n - k) == pytest.approx(2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
    with pytest.raises(ValueError, match="right_to_wrong must be an int >= 0"):
        mcnemar_exact(-1, 2)


def test_a_comparison_counts_the_flips_and_says_whether_they_are_noise():
    base = [True] * 60 + [False] * 4
    other = [True] * 57 + [False] * 3 + [False] * 3 + [True]
    c = compare_answers(base, other)
    assert (c.right_to_wrong, c.wrong_to_right, c.requests) == (3, 1, 64)
    assert c.within_noise and "within noise" in c.words() and "3 right->wrong, 1 wrong->right" in c.words()
    c = compare_answers([True] * 10, [False] * 8 + [True] * 2)
    assert not c.within_noise and "more than noise" in c.words()
    assert compare_answers([True, False], [True, False]).words() == "the same verdict on all 2 requests"
    with pytest.raises(ValueError, match="paired"):
        compare_answers([True], [True, False])
