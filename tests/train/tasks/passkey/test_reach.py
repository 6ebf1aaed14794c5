"""hybrid.train.tasks.passkey.reach: test cells grouped by the key's distance to the query, on a crafted grid whose
distances are worked out by hand, and on a run directory from the command line."""
from __future__ import annotations

import json

import pytest

from hybrid.train.cli import synthetic as cli
from hybrid.train.tasks import make_task
from hybrid.train.cli.studies.passkey_reach import main
from hybrid.train.tasks.passkey.reach import length_rows, reach_buckets, run_reach

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cells_are_grouped_by_the_keys_distance():
    task = make_task("passkey", train_length=40, test_lengths=[40, 64], depths=3, samples=2, filler_vocab=8)
    # k = 5, F = L − 11, query at L − 5, the key's last digit at p + 5 with p = ⌊depth · F + 0.5⌋:
    # L 40: depth 0 → 30, 0.5 → 15 (p 15), 1 → 1;  L 64: depth 0 → 54, 0.5 → 27 (p 27), 1 → 1
    assert [[task.key_distance(n, d) for d in (0.0, 0.5, 1.0)] for n in (40, 64)] == [[30, 15, 1], [54, 27, 1]]
    grid = {"lengths": [40, 64], "depths": [0.0, 0.5, 1.0], "samples": 2,
            "exact": [[0.5, 1.0, 1.0], [0.0, 0.5, 0.5]], "digit": [[0.8, 1.0, 1.0], [0.2, 0.6, 0.9]]}
    buckets = reach_buckets(task, grid, edges=(16, 32))
    assert [b["label"] for b in buckets] == ["1–16", "17–32", "> 32"]
    assert [b["sequences"] for b in buckets] == [6, 4, 2]
    # ≤ 16: (40, 0.5), (40, 1), (64, 1); 17–32: (40, 0), (64, 0.5); > 32: (64, 0)
    assert buckets[0]["exact"] == pytest.approx((1.0 + 1.0 + 0.5) / 3, rel=1e-12)
    assert buckets[0]["digit"] == pytest.approx((1.0 + 1.0 + 0.9) / 3, rel=1e-12)
    assert buckets[1]["exact"] == pytest.approx((0.5 + 0.5) / 2, rel=1e-12)
    assert buckets[1]["digit"] == pytest.approx((0.8 + 0.6) / 2, rel=1e-12)
    assert (buckets[2]["exact"], buckets[2]["digit"]) == (0.0, 0.2)
    assert [b["label"] for b in reach_buckets(task, grid, edges=(64,))] == ["1–64"]  # empty buckets are left out
    rows = length_rows(grid)  # per length: the mean over depths
    assert [(r["label"], r["sequences"]) for r in rows] == [("40", 6), ("64", 6)]
    assert rows[1]["exact"] == pytest.approx(1.0 / 3, rel=1e-12) and rows[0]["digit"] == pytest.approx(2.8 / 3, rel=1e-12)
    with pytest.raises(ValueError, match=r"edges: expected increasing positive distances, got \[32, 16\]"):
        reach_buckets(task, grid, edges=(32, 16))


def test_a_run_directory_from_the_command_line(tmp_path, capsys, monkeypatch):
    run = tmp_path / "pk"
    assert cli.main(["--task", "passkey", "--budget", "smoke", "--preset", "hybrid", "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    buckets = run_reach(run, edges=(8, 16, 32))
    # the smoke grid: lengths 32 and 64, depths 0, 0.5, 1, two sequences a cell
    assert sum(b["sequences"] for b in buckets) == 2 * 3 * 2
    assert main([str(run), "--edges", "8,16,32"]) == 0
    out = capsys.readouterr().out
    assert "| run | distance | 1–8 |" in out and f"| {run} | sequences |" in out
    # --yarn: the model scored again with YaRN, the same buckets as score_passkey's grid gives them
    from hybrid.train.tasks import score_passkey
    from hybrid.train.tasks.train import load_task_run

    model, task = load_task_run(run)
    want = reach_buckets(task, score_passkey(model, task, rope_scaling="yarn")["passkey"], (8, 16, 32))
    assert run_reach(run, edges=(8, 16, 32), yarn=True) == want
    # the smoke model may answer the same with and without YaRN, so the equality alone would pass a run_reach
    # that ignored --yarn: the scoring it calls must be asked for YaRN
    import hybrid.train.tasks.passkey.scoring as passkey_module

    asked, scored = [], passkey_module.score_passkey
    monkeypatch.setattr(passkey_module, "score_passkey",
                        lambda *a, **k: asked.append(k.get("rope_scaling")) or scored(*a, **k))
    run_reach(run, edges=(8, 16, 32), yarn=True)
    assert asked == ["yarn"]
    monkeypatch.undo()
    assert main([str(run), "--edges", "8,16,32", "--yarn", "--device", "cpu"]) == 0
    assert f"| {run} (YaRN) | exact |" in capsys.readouterr().out
    # --by length: the run's own accuracy per length (results.json), and with --yarn score_passkey's
    results = json.loads((run / "results.json").read_text())
    plain = run_reach(run, by="length")
    assert [r["label"] for r in plain] == ["32", "64"]
    assert [r["exact"] for r in plain] == pytest.approx([results["accuracy"][n] for n in ("32", "64")], rel=1e-12)
    yarn = score_passkey(model, task, rope_scaling="yarn")
    assert [r["exact"] for r in run_reach(run, yarn=True, by="length")] == pytest.approx(
        [yarn["accuracy"][n] for n in ("32", "64")], rel=1e-12)
    assert main([str(run), "--by", "length"]) == 0
    assert "| run | length | 32 | 64 |" in capsys.readouterr().out
    # --by cell: the grid itself, each cell with its distance
    cells = run_reach(run, by="cell")
    assert [(c["length"], c["depth"]) for c in cells] == [(n, d) for n in (32, 64) for d in (0.0, 0.5, 1.0)]
    assert [c["exact"] for c in cells] == results["passkey"]["exact"][0] + results["passkey"]["exact"][1]
    assert [c["distance"] for c in cells] == [task.key_distance(c["length"], c["depth"]) for c in cells]
    assert main([str(run), "--by", "cell"]) == 0
    out = capsys.readouterr().out
    assert "| run | length | 0% | 50% | 100% | sequences per cell |" in out and f"| {run} | 64 |" in out
    # --samples / --seed: a fresh grid, as score_passkey gives it for the task with those sequences
    fresh = make_task(task.name, **{**task.params(), "samples": 3, "test_seed": 5})
    want = score_passkey(model, fresh)["passkey"]
    got = run_reach(run, by="cell", samples=3, seed=5)
    assert {c["sequences"] for c in got} == {3}
    # (the losses, not the accuracies: a 3-step smoke model may score 0 on any sequences)
    assert [c["loss"] for c in got] == want["loss"][0] + want["loss"][1]
    assert [c["loss"] for c in run_reach(run, by="cell", samples=3)] != want["loss"][0] + want["loss"][1]  # seed 5's
    with_yarn = score_passkey(model, fresh, rope_scaling="yarn")["passkey"]
    assert with_yarn["loss"][1] != want["loss"][1]  # YaRN changes the 64-token cells
    assert [c["loss"] for c in run_reach(run, by="cell", samples=3, seed=5, yarn=True)] == (
        with_yarn["loss"][0] + with_yarn["loss"][1])
    assert main([str(run), "--by", "cell", "--samples", "3", "--seed", "5", "--yarn"]) == 0
    assert f"| {run} (YaRN) | 32 |" in capsys.readouterr().out


@pytest.mark.parametrize("case, message", [
    ("missing", "run: expected a finished hybrid-synthetic run directory, got "),
    ("parity", "run: expected a passkey run directory, got a parity run at "),
    ("edges", "--edges: expected comma-separated integers such as 64,256, got 'x'"),
    ("samples", "argument --samples: expected a positive integer"),
])
def test_bad_input_is_one_line(tmp_path, capsys, case, message):
    run = tmp_path / "run"
    argv = [str(run)]
    if case == "parity":
        assert cli.main(["--task", "parity", "--budget", "smoke", "--out", str(run), "--quiet"]) == 0
    if case == "edges":
        argv += ["--edges", "x"]
    if case == "samples":
        argv += ["--samples", "0"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
