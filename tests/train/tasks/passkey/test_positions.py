"""hybrid.train.tasks.passkey.positions: the key's positions (negative ones from the end), the scores against
score_passkey's own grid on the same sequences, and the command line on a run directory."""
from __future__ import annotations

import pytest

from hybrid.train.cli import synthetic as cli
from hybrid.train.tasks import make_task, score_passkey
from hybrid.train.cli.studies.passkey_positions import main
from hybrid.train.tasks.passkey.positions import default_positions, resolve_positions, score_positions

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_positions_count_filler_tokens_and_negative_ones_count_from_the_end():
    task = make_task("passkey", train_length=40, test_lengths=[40, 64], depths=5, samples=2, filler_vocab=8)
    # k = 5, F = 40 − 11 = 29: 0 … 5, the middle 14, 24 … 29
    assert default_positions(task, 40) == [0, 1, 2, 3, 4, 5, 14, 24, 25, 26, 27, 28, 29]
    assert resolve_positions(task, 40, [0, 3, -1, -2, -30]) == [0, 3, 29, 28, 0]
    for bad in (30, -31):
        with pytest.raises(ValueError, match=rf"positions: expected key positions in \[-30, 29\] at length 40, "
                                             rf"got {bad}"):
            resolve_positions(task, 40, [bad])


def test_scores_are_the_test_grids_on_the_same_sequences():
    import torch

    from hybrid.models import HybridConfig, HybridLM

    task = make_task("passkey", train_length=40, test_lengths=[40, 64], depths=5, samples=3, filler_vocab=8)
    torch.manual_seed(0)
    model = HybridLM(HybridConfig.preset("hybrid", "tiny", vocab_size=task.vocab_size, d_model=16, n_layers=3,
                                         n_heads=2, window=8)).eval()
    grid = score_passkey(model, task)["passkey"]
    # the test set's generator with the test seed and its sample count: the same sequences as the grid's row
    at = [task.key_position(64, d) for d in task.depths]
    assert at == [0, 13, 27, 40, 53]  # F = 53: ⌊d · 53 + 0.5⌋
    rows = score_positions(model, task, 64, at, samples=3, seed=task.test_seed)
    assert [r["position"] for r in rows] == at
    assert [r["distance"] for r in rows] == [54 - p for p in at]  # the query at 64 − 5 = 59, the digits end at p + 5
    assert [r["exact"] for r in rows] == grid["exact"][1] and [r["digit"] for r in rows] == grid["digit"][1]
    assert {r["sequences"] for r in rows} == {3}
    other = score_positions(model, task, 64, [-1, 0], samples=3, seed=task.test_seed)
    assert [r["position"] for r in other] == [53, 0] and other[1]["digit"] == grid["digit"][1][0]


def test_the_command_line_on_a_run(tmp_path, capsys, monkeypatch):
    run = tmp_path / "pk"
    assert cli.main(["--task", "passkey", "--budget", "smoke", "--preset", "hybrid", "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main([str(run), str(run), "--length", "48", "--positions", "0,-1", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    # smoke keys have 5 digits: F = 48 − 11 = 37; the query at 43, so p 0 is 38 tokens back and p 37 one
    assert "| run |  | p 0 (d 38) | p 37 (d 1) |" in out and out.count(f"| {run} | exact |") == 2
    import hybrid.train.tasks.passkey.scoring as passkey_module

    asked, scored = [], passkey_module.score_passkey
    monkeypatch.setattr(passkey_module, "score_passkey",
                        lambda *a, **k: asked.append(k.get("rope_scaling")) or scored(*a, **k))
    assert main([str(run), "--length", "64", "--yarn", "--device", "cpu"]) == 0
    assert asked == ["yarn"] and f"| {run} (YaRN) | digit |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--length", "48", "--positions", "x"], "--positions: expected comma-separated integers such as 0,1,-1, got 'x'"),
    (["--length", "11"], "--length: expected at least 12 (2·key_digits + 2), got 11"),
    (["--length", "48", "--positions", "38"], "positions: expected key positions in [-38, 37] at length 48, got 38"),
    (["--length", "48", "--missing"], "run: expected a finished hybrid-synthetic run directory, got "),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    run = tmp_path / "pk"
    if "--missing" in argv:
        argv = [a for a in argv if a != "--missing"]
    else:
        assert cli.main(["--task", "passkey", "--budget", "smoke", "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main([str(run), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
