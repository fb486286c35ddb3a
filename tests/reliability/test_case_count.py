"""The README reports the number of distinct bad inputs rejected by name: keep it at 60 or more."""

from __future__ import annotations

import pytest

from .count_cases import enumerated

pytestmark = pytest.mark.reliability


def test_at_least_sixty_distinct_bad_inputs_are_rejected():
    counts = enumerated()
    rejected = sum(counts.values())
    assert rejected >= 60, counts
