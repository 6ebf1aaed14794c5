"""hybrid.train.bench.report: ranks and Spearman's rank correlation against hand-computed values."""
from __future__ import annotations

import math

import pytest

from hybrid.train.bench.report import ranks, spearman


def test_spearman_against_hand_computed_values():
    assert ranks([3.0, 1.0, 2.0, 1.0]) == [4.0, 1.5, 3.0, 1.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = rank differences (0, 0, 1, -1, 0): ρ = 1 − 6·Σd² / (n(n²−1)) = 1 − 12/120
    assert spearman([1, 2, 3, 4, 5], [1, 2, 4, 3, 5]) == pytest.approx(0.9)
    assert math.isnan(spearman([1, 1], [1, 2]))
