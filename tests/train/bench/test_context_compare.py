"""python -m hybrid.train.cli.studies.context_compare: window_bpb of trained runs at any window, grouped over seeds."""
from __future__ import annotations

import pytest

from hybrid.train.bench.context_compare import group_rows, parse_groups
from hybrid.train.cli.studies.context_compare import main
from hybrid.train.bench.window_gain import window_metrics
from hybrid.train.data import prepare_data
from hybrid.train.lm.inference import load_run

PROG = "python -m hybrid.train.cli.studies.context_compare"
TINY = ["--d-model", "16", "--n-layers", "2", "--n-heads", "2", "--seq-len", "16", "--batch-size", "2"]


def test_groups_are_measured_as_hybrid_bench_measures_them(train_run, corpus, capsys):
    glob = [train_run(f"global{s}", 2, ["--preset", "transformer", "--seed", str(s), *TINY]) for s in (0, 1)]
    win = train_run("window", 2, ["--preset", "transformer", "--window", "4", *TINY])
    argv = [f"glob={glob[0]},{glob[1]}", f"win={win}", "--window", "4", "--seq-len", "16", "--blocks", "5",
            "--data", str(corpus), "--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    data = prepare_data(str(corpus))
    want = {name: [window_metrics(load_run(r).model, data, window=4, seq_len=16, count=5)["window_bpb"] for r in runs]
            for name, runs in {"glob": glob, "win": [win]}.items()}
    rows, diffs = group_rows(want)
    for row in rows + diffs:  # the printed tables hold exactly these cells
        assert "| " + " | ".join(row) + " |" in out
    assert "| runs | [0, 1) | [1, 2) | [2, 4) | [4, 8) | [8, 16) |" in out
    assert "5 validation blocks of 16 tokens, window 4" in out


def test_group_rows_means_spreads_and_differences():
    rows, diffs = group_rows({"a": [[1.0, 2.0], [3.0, 2.0]], "b": [[1.5, 1.0]]})
    assert rows == [["a", "2.000 ± 1.414", "2.000 ± 0.000"], ["b", "1.500", "1.000"]]
    assert diffs == [["b − a", "-0.500", "-1.000"]]


def test_parse_groups():
    assert parse_groups(["g=a,b", "c"]) == {"g": ["a", "b"], "c": ["c"]}
    for bad, message in ((["g="], "expected NAME=RUN"), (["=a"], "expected NAME=RUN"),
                         (["g=a", "g=b"], "distinct group names")):
        with pytest.raises(ValueError, match=message):
            parse_groups(bad)


def test_bad_input_is_one_line(capsys, one_line_error, tmp_path):
    assert main([str(tmp_path), "--window", "16", "--seq-len", "16"]) == 2
    one_line_error(capsys, PROG, "--window: expected fewer tokens than --seq-len (16), got 16")
    assert main([str(tmp_path), "--seq-len", "16"]) == 2
    one_line_error(capsys, PROG, "--window")
