"""The Transformer's step split by length, and the ceiling it leaves other models (gpu_check/step_split.py): the
fit recovers a known split, keeps executions and batches apart, says when it cannot split, and reaches the
targets table and the report."""
from __future__ import annotations

import random

import pytest

from hybrid.train.bench.gpu_check.report import write_outputs
from hybrid.train.bench.gpu_check.step_split import ceiling_at, ceilings
from hybrid.train.bench.gpu_check.targets import evaluate

TOKENS = 65_536  # a step's tokens, as the models part measures


def row(model, T, per_token_s, execution="eager", batch="padded"):
    return {"section": "models", "model": model, "T": T, "B": TOKENS // T, "execution": execution, "batch": batch,
            "tokens_per_s": 1 / per_token_s, "step_ms": per_token_s * TOKENS * 1e3}


def linear_rows(fixed_s, per_t_s, lengths, hybrid_s=None, **where):
    """The Transformer's rows at ``lengths`` (per token: ``fixed_s + per_t_s · T``) and a hybrid's (``hybrid_s``
    per token at every length)."""
    rows = [row("transformer", T, fixed_s + per_t_s * T, **where) for T in lengths]
    if hybrid_s is not None:
        rows += [row("hybrid", T, hybrid_s, **where) for T in lengths]
    return rows


def test_a_linear_step_is_split_exactly_and_bounds_the_hybrids_ratio():
    rng = random.Random(11)
    fixed, per_t = rng.uniform(1, 2) * 1e-6, rng.uniform(1, 3) * 1e-10  # seconds per token, and per token and T
    hybrid = fixed * rng.uniform(1.05, 1.2)
    lengths = [2048, 8192, 16384, 32768]
    found = ceilings(linear_rows(fixed, per_t, lengths, hybrid) + [{"section": "models", "skipped": "x"}])
    assert [c["T"] for c in found] == lengths
    for c in found:
        transformer = fixed + per_t * c["T"]
        assert c["fixed_ms"] == pytest.approx(fixed * TOKENS * 1e3, rel=1e-9)
        assert c["attention_ms"] == pytest.approx(per_t * c["T"] * TOKENS * 1e3, rel=1e-9)
        assert c["fixed_ms"] + c["attention_ms"] == pytest.approx(c["step_ms"], rel=1e-9)
        assert c["fit_residual"] < 1e-12
        assert c["ceiling"] == pytest.approx(transformer / fixed, rel=1e-9)
        assert c["ratio"] == pytest.approx(transformer / hybrid, rel=1e-12)
        assert c["share_of_ceiling"] == pytest.approx((transformer / hybrid - 1) / (transformer / fixed - 1), rel=1e-9)
        assert c["ratio"] < c["ceiling"]  # a hybrid whose mixers cost something stays under it


def test_the_h100_rows_of_2026_11_27():
    """docs/research/gpu/h100-2026-11-27/results_2.json, eager and padded: 136.57 ms at 8K and 169.87 ms at 16K
    split into 103.27 ms fixed and 33.30 ms of attention per 8K; ceilings 1.32× and 1.64×."""
    rows = [row("transformer", 8192, 0.13657021099999156 / TOKENS),
            row("transformer", 16384, 0.1698714920000839 / TOKENS), row("hybrid", 16384, 0.11650877099998524 / TOKENS)]
    at_16k = ceilings(rows)[1]
    assert at_16k["fixed_ms"] == pytest.approx(2 * 136.57021099999156 - 169.8714920000839, rel=1e-9)
    assert round(at_16k["ceiling"], 2) == 1.64 and round(at_16k["ratio"], 2) == 1.46
    assert round(ceiling_at(rows, 8192), 2) == 1.32


def test_a_curved_step_shows_in_the_residual():
    rows = [row("transformer", T, 1e-6 + 1e-14 * T ** 2) for T in (2048, 8192, 16384)]
    assert max(c["fit_residual"] for c in ceilings(rows)) > 0.01


def test_each_execution_and_batch_is_fitted_apart_and_one_length_gives_no_split():
    rows = (linear_rows(1e-6, 1e-10, [8192, 16384]) + linear_rows(5e-7, 1e-10, [8192, 16384], execution="compiled")
            + linear_rows(1e-6, 1e-10, [8192], batch="packed"))
    found = {(c["execution"], c["batch"], c["T"]): c for c in ceilings(rows)}
    assert set(found) == {("eager", "padded", 8192), ("eager", "padded", 16384), ("compiled", "padded", 8192),
                          ("compiled", "padded", 16384)}
    assert found["compiled", "padded", 16384]["ceiling"] == pytest.approx(1 + 1e-10 * 16384 / 5e-7)
    assert found["eager", "padded", 16384]["ratio"] is None  # no hybrid row
    assert ceiling_at(rows, 8192, batch="packed") is None


def test_a_step_that_does_not_split_gives_no_ceiling_and_no_note():
    rows = [row("transformer", 8192, 1e-6), row("transformer", 16384, 3e-6), row("hybrid", 16384, 1e-6)]
    found = ceilings(rows)
    assert all(c["ceiling"] is None and c["fixed_ms"] is None and c["share_of_ceiling"] is None for c in found)
    target = [t for t in evaluate(rows) if "at 16K (eager, padded)" in t["target"]][0]
    assert target["measured"] == "3.00×" and target["met"]


def test_the_targets_and_the_report_say_the_ceiling(tmp_path):
    rows = linear_rows(1e-6, 1e-10, [8192, 16384], hybrid_s=1.1e-6)
    target = [t for t in evaluate(rows) if "at 16K (eager, padded)" in t["target"]][0]
    ceiling = 1 + 1e-10 * 16384 / 1e-6
    ratio = (1e-6 + 1e-10 * 16384) / 1.1e-6
    assert target["measured"] == f"{ratio:.2f}× (ceiling {ceiling:.2f}×: mixers that cost nothing)"
    assert target["met"] is True
    header = {"device": "cpu", "date": "today", "commit": "abc", "torch": "t", "triton": "t", "python": "3",
              "dry_run": True, "command": "c"}
    write_outputs(tmp_path, header, {}, [{**r, "part": "models"} for r in rows], evaluate(rows))
    report = (tmp_path / "report.md").read_text()
    assert "### The Transformer's step split by length" in report
    assert f"| eager | padded | 16,384 | {1e-6 + 1e-10 * 16384:.3g}" not in report  # milliseconds, not seconds
    assert "| eager | padded | 16,384 | 173 | 65.5 | 107 | 0 | 2.64 | 2.4 |" in report
