"""The sampling benchmark (``python -m hybrid.train.bench.sampling``) prints a full row per vocabulary and batch
size, and refuses to time a batched draw that differs from each row's own."""
from __future__ import annotations

import pytest

from hybrid.models import sampling
from hybrid.train.bench.sampling import main

TINY = ["--vocab", "31,67", "--batch", "1,3", "--rounds", "2", "--steps", "2"]


def test_a_full_row_per_vocabulary_and_batch(capsys, one_torch_thread):
    assert main(TINY) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == 1 + 4, table  # the header, then the rows
    assert all(cell.strip() for line in table[1:] for cell in line.strip("|").split("|")), table
    assert all(" → " in line for line in table[1:])


def test_a_batched_draw_unlike_each_rows_own_is_refused(monkeypatch, one_torch_thread):
    draw_rows = sampling.draw_rows
    monkeypatch.setattr("hybrid.models.decoding.decoder.draw_rows",
                        lambda probs, generators: draw_rows(probs, [generators[0]] * len(generators)))
    with pytest.raises(AssertionError, match=r"^vocab 31, batch 3: the batched draw differs"):
        main([*TINY[:2], "--batch", "3", *TINY[4:]])
