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


def test_the_cost_table_names_the_machines_when_runs_come_from_several():
    """A suite continued in another device session can finish on another GPU: its timings must not read as
    comparable."""
    from hybrid.train.bench.report import cost_table

    def run(model, gpu, tokens_per_s):
        return {"model": model, "machine": {"gpu": gpu, "platform": "Linux-6.8-x86_64"},
                "metrics": {"tokens_per_s": tokens_per_s, "train_memory_bytes": 2 ** 30, "memory_kind": "peak"}}

    same = cost_table({"transformer": [run("transformer", "NVIDIA H100 80GB HBM3", 1.3e6)],
                       "hybrid": [run("hybrid", "NVIDIA H100 80GB HBM3", 1.1e6)]}, [])
    assert "more than one machine" not in same and "| machine |" not in same
    mixed = cost_table({"transformer": [run("transformer", "NVIDIA H100 80GB HBM3", 1.3e6)],
                        "hybrid": [run("hybrid", "NVIDIA H200", 1.6e6)]}, [])
    assert "**These runs come from more than one machine**" in mixed
    assert "| machine |" in mixed and mixed.rstrip().endswith("| NVIDIA H200 |"), mixed


def test_the_cost_table_names_each_rows_memory_kind_when_they_differ():
    """CPU rows count memory (weights, grads, moments, activations), CUDA rows read max_memory_allocated: one
    header for both named only the last model's kind."""
    from hybrid.train.bench.report import cost_table

    def run(model, kind):
        return {"model": model, "machine": {"cpus": 2, "platform": "Linux-6.8-x86_64"},
                "metrics": {"tokens_per_s": 1e3, "train_memory_bytes": 2 ** 30, "memory_kind": kind}}

    counted, cuda = "counted: weights, grads, AdamW moments, saved activations", "cuda max allocated"
    same = cost_table({"transformer": [run("transformer", counted)], "hybrid": [run("hybrid", counted)]}, [])
    assert f"memory: {counted})" in same and "(counted)" not in same
    mixed = cost_table({"transformer": [run("transformer", counted)], "hybrid": [run("hybrid", cuda)]}, [])
    assert "memory: per row, in brackets)" in mixed
    assert "| 1.0 GB (counted) |" in mixed and "| 1.0 GB (cuda max allocated) |" in mixed, mixed


def test_the_positions_table_compares_l_and_2l_on_the_same_text():
    """Perplexity at L and at 2L of the same sequences (``loss_full_1x``, ``loss_full_2x``): a model that does not
    degrade past L shows no growth. @L was the validation loss, on other text (windows that reset at document ends),
    and showed 7.389 against 9.025 for this record."""
    from hybrid.train.bench.report import positions_table

    run = {"metrics": {"val_loss": 2.0, "bpb_full_1x": 3.1, "loss_full_1x": 2.2, "bpb_full_2x": 3.1,
                       "loss_full_2x": 2.2}}
    row = next(line for line in positions_table({"rope": [run]}).splitlines() if line.startswith("| rope"))
    assert row.split("|")[2:4] == [f" {math.exp(2.2):.3f} "] * 2, row
