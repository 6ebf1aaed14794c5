"""The decoding benchmark (``python -m hybrid.train.bench.decoding PART``) runs each part end to end at tiny sizes
and prints its table: a row per model (per max_batch for ``continuous``) with every column filled."""
from __future__ import annotations

import pytest

from hybrid.train.bench.decoding import main

TINY = ["--size", "tiny", "--models", "hybrid,global Transformer", "--rounds", "1"]


@pytest.mark.parametrize("part, args, rows", [
    ("ragged", ["--batch", "3", "--max-length", "20", "--tokens", "2"], 2),
    ("continuous", ["--requests", "3", "--max-batch", "1,2", "--max-prompt", "20", "--max-new", "17"], 4),
    # the eager backend: Dynamo's trace and graphs without Inductor's minute of CPU compiling
    ("compiled", ["--models", "hybrid", "--prompt", "9", "--tokens", "3", "--backend", "eager"], 1),
])
def test_each_part_prints_a_full_row_per_case(part, args, rows, capsys, one_torch_thread):
    assert main([part, *TINY, *args]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == 1 + rows, table  # the header, then the rows
    assert all(cell.strip() for line in table[1:] for cell in line.strip("|").split("|")), table
