"""hybrid-train / hybrid-generate: a smoke run, generation from the run, and one-line errors (exit 2)."""
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.train.cli import config_from_args, generate_main, train_main, train_parser

REPO = Path(__file__).resolve().parents[2]
TINY = ["--d-model", "32", "--n-layers", "3", "--n-heads", "2", "--window", "16", "--seq-len", "32",
        "--batch-size", "4", "--lr", "1e-2", "--warmup", "2", "--eval-batches", "2", "--device", "cpu"]


@pytest.fixture
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert train_main(["--data", str(corpus), "--out", str(out), "--steps", "20", *TINY, "--quiet"]) == 0
    return out


def one_line_error(capsys, prog, *needles):
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_train_then_generate(trained, capsys):
    assert sorted(p.name for p in trained.iterdir()) == ["checkpoint", "loss.png", "metrics.jsonl",
                                                         "train_config.json"]
    capsys.readouterr()
    common = ["--run", str(trained), "--prompt", "def f", "--max-new-tokens", "40", "--temperature", "0",
              "--device", "cpu"]
    assert generate_main([*common, "--mode", "recurrent"]) == 0
    recurrent = capsys.readouterr().out
    assert generate_main([*common, "--mode", "parallel"]) == 0
    parallel = capsys.readouterr().out
    assert recurrent.startswith("def f") and len(recurrent) > len("def f\n")
    assert recurrent == parallel
    assert generate_main(["--run", str(trained), "--temperature", "1", "--top-k", "5", "--top-p", "0.9",
                          "--seed", "1", "--max-new-tokens", "10", "--device", "cpu"]) == 0


def test_train_prints_progress_and_layout(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main(["--data", str(corpus), "--out", str(out), "--steps", "4", "--log-every", "2", *TINY]) == 0
    text = capsys.readouterr().out
    assert "training hybrid/tiny" in text and "step      2  loss" in text
    assert f"run directory {out}/" in text and "metrics.jsonl" in text and "loss.png" in text
    assert train_main(["--resume", str(out), "--steps", "6", "--quiet"]) == 0
    assert "step" not in capsys.readouterr().out


def test_python_m_train_help():
    proc = subprocess.run([sys.executable, "-m", "hybrid.train", "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "hybrid-train" in proc.stdout and "--resume" in proc.stdout and "torchrun" in proc.stdout


def test_flags_become_config_fields():
    args = train_parser().parse_args(["--pattern", "RA", "--window", "none", "--set", "carope=true",
                                      "--set", "rope_layout=half", "--eval-batches", "all", "--betas", "0.9",
                                      "0.99", "--steps", "5"])
    assert config_from_args(args) == {"model": {"pattern": "RA", "window": None, "carope": True,
                                                "rope_layout": "half"},
                                      "eval_batches": None, "betas": (0.9, 0.99), "steps": 5}
    assert config_from_args(train_parser().parse_args([])) == {}


def test_missing_data_path(tmp_path, capsys):
    assert train_main(["--data", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "hybrid-train", "data path not found")


def test_unknown_preset(capsys):
    assert train_main(["--preset", "gpt5"]) == 2
    one_line_error(capsys, "hybrid-train", "--preset", "gpt5")
    assert train_main(["--set", "colour=blue"]) == 2
    one_line_error(capsys, "hybrid-train", "unknown HybridConfig field 'colour'")


def test_offline_hub_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert train_main(["--data", "someone/some-dataset", "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "hybrid-train", "offline", "someone/some-dataset")


def test_corrupt_checkpoint(trained, tmp_path, capsys):
    weights = trained / "checkpoint" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert train_main(["--resume", str(trained), "--steps", "30"]) == 2
    one_line_error(capsys, "hybrid-train", "model.safetensors", "corrupt")
    assert generate_main(["--run", str(trained), "--device", "cpu"]) == 2
    one_line_error(capsys, "hybrid-generate", "model.safetensors", "corrupt")
    assert generate_main(["--run", str(tmp_path / "missing")]) == 2
    one_line_error(capsys, "hybrid-generate", "no checkpoint")


def test_resume_refuses_changes_that_break_it(trained, capsys):
    assert train_main(["--resume", str(trained), "--seq-len", "64"]) == 2
    one_line_error(capsys, "hybrid-train", "seq_len: cannot change when resuming")
    assert train_main(["--resume", str(trained), "--out", "elsewhere"]) == 2
    one_line_error(capsys, "hybrid-train", "different run directories")
    assert train_main(["--out", str(trained)]) == 2
    one_line_error(capsys, "hybrid-train", "already holds a checkpoint", "--resume")


def test_user_errors_are_one_line_exit_2(corpus, tmp_path, capsys):
    """Each bad input of the hardening issue: one line naming the problem, exit 2, no traceback."""
    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text('{"text": "fine"}\n{not json\n')
    not_a_tokenizer = tmp_path / "tokenizer.json"
    not_a_tokenizer.write_text("not json at all\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    common = [*TINY, "--steps", "2", "--quiet"]
    cases = [
        (["--data", str(bad_rows), *common, "--out", str(tmp_path / "r1")], ["data: expected json files", "bad.jsonl"]),
        (["--data", str(corpus), "--tokenizer", str(not_a_tokenizer), *common, "--out", str(tmp_path / "r2")],
         ["tokenizer: expected a tokenizer.json", "tokenizer.json"]),
        (["--data", str(corpus), *common, "--out", str(a_file / "run")], ["a-file", "Not a directory"]),
        (["--data", str(corpus), *common, "--set", "rope_base=0.5", "--out", str(tmp_path / "r3")],
         ["rope_base: expected a number > 1, got 0.5"]),
        (["--data", str(corpus), *common, "--keep", "0", "--out", str(tmp_path / "r4")], ["--keep", "got '0'"]),
        (["--data", str(corpus), *common, "--on-nonfinite", "ignore"], ["--on-nonfinite", "'ignore'"]),
    ]
    for argv, needles in cases:
        assert train_main(argv) == 2, argv
        one_line_error(capsys, "hybrid-train", *needles)


def test_generate_errors_are_one_line_exit_2(trained, capsys):
    for argv, needles in [
        (["--temperature", "nan"], ["--temperature: expected a finite number >= 0, got 'nan'"]),
        (["--temperature", "inf"], ["--temperature: expected a finite number >= 0, got 'inf'"]),
        (["--top-p", "nan"], ["--top-p: expected a number in (0, 1], got 'nan'"]),
    ]:
        assert generate_main(["--run", str(trained), "--device", "cpu", *argv]) == 2, argv
        one_line_error(capsys, "hybrid-generate", *needles)


def test_quiet_prints_nothing_and_the_prompt_example_has_a_real_newline(corpus, tmp_path, capsys):
    capsys.readouterr()
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "q"), "--steps", "2", *TINY, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # no datasets bars ("Generating train split", "tokenising")
    from hybrid.train.cli import generate_parser

    assert "--prompt $'import os\\n'" in generate_parser().epilog  # bash turns \n into a newline in $'…'


def test_default_sampling_never_fails_on_padding_ids(trained, capsys):
    """The vocabulary is padded to 320 for 259 byte tokens: the default temperature samples only real ids."""
    for seed in range(6):
        assert generate_main(["--run", str(trained), "--prompt", "def ", "--max-new-tokens", "30", "--seed",
                              str(seed), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count("def ") >= 6
