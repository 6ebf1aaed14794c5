"""hybrid-bench end to end (hybrid.train.cli.bench): the smoke budget on a fresh directory, command-line errors."""
from __future__ import annotations

import pytest

from hybrid.train import load_run
from hybrid.train.cli.bench import bench_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def test_smoke_end_to_end_on_a_fresh_directory(tmp_path, corpus, capsys, records_of, smoke_flags):
    out = tmp_path / "bench"
    argv = ["--suite", "extension", "--out", str(out), "--data", str(corpus), *smoke_flags]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "budget 'smoke':" in printed and "steps       3" in printed  # the budget, overrides applied
    suite = out / "extension"
    records = records_of(suite)
    assert [r["run"] for r in records] == ["transformer/seed0", "finetune-none/seed0", "finetune-pi/seed0",
                                           "finetune-yarn/seed0"]
    for r in records:
        assert {"config", "seed", "metrics", "commit", "machine"} <= set(r)
        assert r["command"] == "hybrid-bench " + " ".join(argv)  # for a report rewritten from the records
        m = r["metrics"]
        assert m["val_bpb"] > 0 and m["bpb_full_8x"] > 0 and m["bpb_stream_8x_last"] > 0
        assert len(m["position_bpb"]) == len(m["position_edges"]) - 1
        assert m["train_memory_bytes"] > 0
        assert ("decode" in m) == (r["model"] == "transformer")  # a fine-tune decodes as its base
        run = load_run(suite / r["run"])  # every run directory opens for inference
        assert run.model.config.to_dict() == {**r["config"]["model"], "meta": run.model.config.meta}
    assert records[0]["metrics"]["decode"]["128"]["state_bytes"] > 0
    base = records[0]["metrics"]["extension"]
    assert set(base) == {"none", "pi", "ntk", "dynamic", "yarn", "llama3"}
    assert base["none"]["8"]["bpb_full"] == pytest.approx(records[0]["metrics"]["bpb_full_8x"], rel=1e-9)
    assert records[2]["config"]["train"]["seq_len"] == 16  # fine-tuned at 2 × L
    assert records[1]["config"]["model"]["rotary"]["scaling"] is None
    assert records[2]["config"]["model"]["rotary"]["scaling"] == {"rope_type": "linear", "factor": 2.0}
    report = (suite / "report.md").read_text()
    for heading in ("## Context extension", "## Quality", "## Loss by position", "## Cost", "pi, fine-tuned at 2×"):
        assert heading in report
    for png in ("bpb_vs_length.png", "loss_curves.png", "loss_by_position.png", "decode_ms.png"):
        assert (suite / png).stat().st_size > 1000

    # a second invocation trains nothing and reports from the records
    assert bench_main(argv) == 0
    assert records_of(suite) == records


@pytest.mark.parametrize("argv, message", [
    (["--suite", "baselines", "--models", "gpt"], "models: expected names from"),
    (["--suite", "all", "--models", "hybrid"], "--models: expected a single --suite"),
    (["--suite", "baselines", "--seeds", "a"], "--seeds: expected comma-separated integers"),
    (["--suite", "baselines", "--report-only"], "--report-only: expected records in"),
    (["--suite", "baselines", "--window", "32"], "--window: expected 1 … 31 tokens"),
    (["--suite", "baselines", "--window", "0"], "--window"),
    # a --seq-len at or below the budget's window (smoke 8, cpu 32): the "windowed" models would be global
    (["--suite", "baselines", "--seq-len", "3"], "--seq-len: expected more tokens than the attention window 8 "
                                                 "(or a --window below 3), got 3"),
    (["--suite", "positions", "--budget", "cpu", "--seq-len", "16"], "--seq-len: expected more tokens than the "
                                                                     "attention window 32"),
    (["--suite", "baselines", "--dry-run", "--budget", "gpu-long", "--seq-len", "8"], "--seq-len: expected more"),
    (["--suite", "baselines", "--seq-len", "16", "--window", "16"], "--window: expected 1 … 15 tokens"),
    # --set window would make the global reference windowed: the window is --window's
    (["--suite", "baselines", "--set", "window=4"], "--set window: expected the attention window through --window"),
    (["--suite", "baselines", "--set", "attention.window=4"], "--set attention.window: expected the attention "
                                                              "window through --window"),
])
def test_user_errors_are_one_line(argv, message, tmp_path, capsys):
    assert bench_main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybrid-bench: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before a suite directory is made (or, --overwrite, cleared)
