"""``python -m hybrid.train.bench.compile_time``: its step runs (the eager way, in this process: the compiled ways
are the same step with a compile in front, too slow for the tests) and its arguments are checked."""
from __future__ import annotations

import argparse

import pytest

from hybrid.train.bench import compile_time


def test_the_eager_way_times_packed_steps_and_builds_no_graph():
    args = argparse.Namespace(way="eager", preset="hybrid", device="cpu", d_model=16, n_layers=3, n_heads=2,
                              vocab_size=64, window=4, seq_len=16, batch=2, steps=3)
    result = compile_time._child(args)
    assert result["graphs"] == 0 and result["layer_types"] == "RRA" and result["device"] == "cpu"
    assert result["first_s"] > 0 and result["second_s"] > 0 and result["step_ms"] > 0


def test_fewer_than_three_steps_are_refused(capsys):
    with pytest.raises(SystemExit):
        compile_time.main(["--steps", "2"])
    assert "--steps: expected at least 3" in capsys.readouterr().err
