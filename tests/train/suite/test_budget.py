"""hybrid.train.suite.budget: overrides and their description, the --seeds list."""
from __future__ import annotations

import pytest

from hybrid.train.suite import Budget, parse_int_list


def test_budget_override_and_describe():
    b = Budget(name="x", models=("a", "b"), steps=10, seq_len=32, seeds=(0, 1, 2), lrs=(1e-3, 3e-3))
    o = b.override(steps=5, seq_len=16, seeds=(4,), models=("b",), known_models=("a", "b"))
    assert (o.steps, o.seq_len, o.seeds, o.models) == (5, 16, (4,), ("b",))
    assert b.override() == b
    text = o.describe()
    assert text.startswith("budget 'x':") and "steps       5" in text and "seeds       4" in text
    with pytest.raises(ValueError, match=r"models: expected names from \['a', 'b'\], got \['c'\]"):
        b.override(models=("c",), known_models=("a", "b"))
    with pytest.raises(ValueError, match=r"steps: expected a positive int, got 0"):
        b.override(steps=0)


def test_parse_seeds():
    assert parse_int_list("0,1, 2") == (0, 1, 2)
    with pytest.raises(ValueError, match=r"--seeds: expected comma-separated integers"):
        parse_int_list("a,b")
