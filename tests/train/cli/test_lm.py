"""hybrid-train / hybrid-generate: a smoke run, generation from the run, one-line errors (exit 2) that name the
argument and never contradict themselves, and Ctrl-C, which names the surviving checkpoint and how to resume."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.train.cli.lm import config_from_args, generate_main, train_config_from_args, train_main, train_parser

REPO = Path(__file__).resolve().parents[3]
TINY = ["--d-model", "32", "--n-layers", "3", "--n-heads", "2", "--window", "16", "--seq-len", "32",
        "--batch-size", "4", "--lr", "1e-2", "--warmup", "2", "--eval-batches", "2", "--device", "cpu"]
TINY_TRANSFORMER = ["--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len",
                    "32", "--batch-size", "4", "--warmup", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


@pytest.fixture
def trained(train_run):
    return train_run("run", 20, TINY)


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
    assert generate_main([*common, "--mode", "recurrent", "--compile"]) == 0  # Inductor on the decode steps
    compiled = capsys.readouterr().out
    assert recurrent.startswith("def f") and len(recurrent) > len("def f\n")
    assert recurrent == parallel == compiled
    assert generate_main(["--run", str(trained), "--temperature", "1", "--top-k", "5", "--top-p", "0.9",
                          "--seed", "1", "--max-new-tokens", "10", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert generate_main([*common, "--cuda-graph"]) == 2  # a CUDA graph replays on a GPU
    assert "--cuda-graph: expected a CUDA device (--device cuda), got cpu" in capsys.readouterr().err


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


def test_the_help_examples_parse_and_build_their_model():
    """Every `--set` example of the help and every command line of its epilog gives a model config (the issue: the
    help's `--set rope_scaling='{"rope_type": "yarn", "factor": 4}'` lacked yarn's original_max_position_embeddings)."""
    import re
    import shlex

    from hybrid.train.cli.lm import TRAIN_EPILOG
    from hybrid.train.data.tokenizer import ByteTokenizer
    from hybrid.train.lm.config import TrainConfig
    from hybrid.train.lm.trainer import model_config_for

    parser = train_parser()
    helps = " ".join(a.help for a in parser._actions if a.help)
    sets = re.findall(r"--set \S+?=(?:'[^']*'|\S+?)(?=[ );,]|$)", helps)
    assert any("rope_scaling" in s for s in sets) and len(sets) >= 3, sets
    lines = [ln.split("#")[0].split("[")[0] for ln in TRAIN_EPILOG.splitlines() if ln.startswith("  hybrid-train")]
    argvs = [shlex.split(s) for s in sets] + [shlex.split(ln)[1:] for ln in lines]
    for argv in argvs:
        model_config_for(TrainConfig(**config_from_args(parser.parse_args(argv))), ByteTokenizer())


def test_the_pattern_help_and_the_docs_name_every_mixer_and_preset():
    """The issue: --pattern's help named R, A and M but not G; the docs' --preset row lacked vo-gla."""
    import re

    from hybrid.models import PRESETS
    from hybrid.models.mixers import MIXERS

    (pattern,) = [a.help for a in train_parser()._actions if "--pattern" in a.option_strings]
    assert all(re.search(rf"\b{letter} \w", pattern) for letter in MIXERS), pattern
    docs = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    assert f"| `--preset {{{','.join(sorted(PRESETS))}}}` |" in docs


def test_missing_data_path(tmp_path, capsys, one_line_error):
    assert train_main(["--data", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "hybrid-train", "data path not found")


def test_unknown_preset(capsys, one_line_error):
    assert train_main(["--preset", "gpt5"]) == 2
    one_line_error(capsys, "hybrid-train", "--preset", "gpt5")
    assert train_main(["--set", "colour=blue"]) == 2
    one_line_error(capsys, "hybrid-train", "unknown HybridConfig field 'colour'")


def test_offline_hub_name(tmp_path, capsys, monkeypatch, one_line_error):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert train_main(["--data", "someone/some-dataset", "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "hybrid-train", "offline", "someone/some-dataset")


def test_corrupt_checkpoint(trained, tmp_path, capsys, one_line_error):
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


def test_resume_refuses_changes_that_break_it(trained, capsys, one_line_error):
    assert train_main(["--resume", str(trained), "--seq-len", "64"]) == 2
    one_line_error(capsys, "hybrid-train", "seq_len: cannot change when resuming")
    assert train_main(["--resume", str(trained), "--out", "elsewhere"]) == 2
    one_line_error(capsys, "hybrid-train", "different run directories")
    assert train_main(["--out", str(trained)]) == 2
    one_line_error(capsys, "hybrid-train", "already holds a checkpoint", "--resume")


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_a_checkpoint_resumes_into_its_run_and_never_among_other_files(train_run, tmp_path, capsys, one_line_error):
    """A resume writes in the checkpoint's parent. A checkpoint copied among a user's files is refused and nothing
    there changes (the resume used to replace train_config.json, cut metrics.jsonl and write beside them); alone in
    a folder it resumes; ``--out`` may name the run a ``checkpoint-step-N`` belongs to."""
    import shutil

    run = train_run("kept", 4, [*TINY_TRANSFORMER, "--save-every", "2"])
    backup = tmp_path / "backup"
    shutil.copytree(run / "checkpoint-step-2", backup / "mine")
    (backup / "notes.txt").write_text("mine\n")
    (backup / "metrics.jsonl").write_text('{"step": 999, "loss": 1.0}\n')
    before = _snapshot(backup)
    capsys.readouterr()
    assert train_main(["--resume", str(backup / "mine"), "--steps", "3"]) == 2
    one_line_error(capsys, "hybrid-train", "--resume", str(backup), "notes.txt", "NEW/checkpoint")
    assert _snapshot(backup) == before
    alone = tmp_path / "alone"
    shutil.copytree(run / "checkpoint-step-2", alone / "mine")
    assert train_main(["--resume", str(alone / "mine"), "--steps", "3", "--quiet"]) == 0
    assert json.loads((alone / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    assert train_main(["--resume", str(run / "checkpoint-step-2"), "--out", str(run), "--steps", "3", "--quiet"]) == 0


def test_a_run_records_its_inputs_absolute_and_resumes_from_anywhere(corpus, tmp_path, monkeypatch):
    """--data given relative is recorded absolute: a resume from another directory reads the same files (it was
    refused, or took the name for a hub dataset), and naming it again in another spelling is no change."""
    monkeypatch.chdir(corpus.parent)
    out = tmp_path / "run"
    assert train_main(["--data", corpus.name, "--out", str(out), "--steps", "2", *TINY, "--quiet"]) == 0
    assert json.loads((out / "train_config.json").read_text())["data"] == str(corpus.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / corpus.name).mkdir()  # a folder of the same name there, which must not be read
    monkeypatch.chdir(elsewhere)
    assert train_main(["--resume", str(out), "--steps", "3", "--quiet"]) == 0
    monkeypatch.chdir(corpus.parent)
    assert train_main(["--resume", str(out), "--steps", "4", "--data", f"./{corpus.name}", "--quiet"]) == 0
    assert json.loads((out / "train_config.json").read_text())["steps"] == 4


def test_a_resume_refuses_data_that_changed(tmp_path, capsys, one_line_error, monkeypatch):
    """A file of --data rewritten (same size, other text) between the run and its resume: the tokens differ, so the
    resume is refused in one line instead of training on other tokens."""
    monkeypatch.setenv("HYBRID_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "one.txt"  # one document: split by tokens, so the same length keeps every count the same
    text.write_text("".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200)))
    out = tmp_path / "run"
    assert train_main(["--data", str(text), "--out", str(out), "--steps", "2", *TINY, "--quiet"]) == 0
    text.write_text(text.read_text().replace("x", "y"))
    assert train_main(["--resume", str(out), "--steps", "3", "--quiet"]) == 2
    one_line_error(capsys, "hybrid-train", "data: expected the tokens the run was trained on", "--init-from")


def test_user_errors_are_one_line_exit_2(corpus, tmp_path, capsys, one_line_error):
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
        (["--data", str(corpus), *common, "--out", str(a_file / "run")], ["out: expected a directory, got the file", "a-file"]),
        (["--data", str(corpus), *common, "--set", "rope_base=0.5", "--out", str(tmp_path / "r3")],
         ["rope_base: expected a number > 1, got 0.5"]),
        (["--data", str(corpus), *common, "--keep", "0", "--out", str(tmp_path / "r4")], ["--keep", "got '0'"]),
        (["--data", str(corpus), *common, "--on-nonfinite", "ignore"], ["--on-nonfinite", "'ignore'"]),
    ]
    for argv, needles in cases:
        assert train_main(argv) == 2, argv
        one_line_error(capsys, "hybrid-train", *needles)


def test_generate_errors_are_one_line_exit_2(trained, capsys, one_line_error):
    for argv, needles in [
        (["--temperature", "nan"], ["--temperature: expected a finite number >= 0, got 'nan'"]),
        (["--temperature", "inf"], ["--temperature: expected a finite number >= 0, got 'inf'"]),
        (["--top-p", "nan"], ["--top-p: expected a number in (0, 1], got 'nan'"]),
        (["--compile", "--mode", "parallel"],
         ["--compile: expected --mode recurrent (it compiles the decode steps), got --mode parallel"]),
    ]:
        assert generate_main(["--run", str(trained), "--device", "cpu", *argv]) == 2, argv
        one_line_error(capsys, "hybrid-generate", *needles)


def test_quiet_prints_nothing_and_the_prompt_example_has_a_real_newline(corpus, tmp_path, capsys):
    capsys.readouterr()
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "q"), "--steps", "2", *TINY, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # no datasets bars ("Generating train split", "tokenising")
    from hybrid.train.cli.lm import generate_parser

    assert "--prompt $'import os\\n'" in generate_parser().epilog  # bash turns \n into a newline in $'…'


def test_default_sampling_never_fails_on_padding_ids(trained, capsys):
    """The vocabulary is padded to 320 for 259 byte tokens: the default temperature samples only real ids."""
    for seed in range(6):
        assert generate_main(["--run", str(trained), "--prompt", "def ", "--max-new-tokens", "30", "--seed",
                              str(seed), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count("def ") >= 6


def test_a_text_column_that_is_not_a_string_names_file_line_and_column(tmp_path, capsys, one_line_error):
    data = tmp_path / "w.jsonl"
    data.write_text('{"text": 123}\n{"text": null}\n')
    assert train_main(["--data", str(data), "--out", str(tmp_path / "r"), *TINY_TRANSFORMER, "--steps", "2"]) == 2
    one_line_error(capsys, "hybrid-train", "w.jsonl line 1", "column 'text'", "123 (int)")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "a document"}\n{"text": "another"}\n{"text": [1, 2]}\n')
    assert train_main(["--data", str(mixed), "--out", str(tmp_path / "r"), *TINY_TRANSFORMER, "--steps", "2"]) == 2
    one_line_error(capsys, "hybrid-train", "mixed.jsonl line 3", "column 'text'", "[1, 2] (list)")


def test_a_model_that_cannot_fit_is_refused_with_its_estimate_before_it_is_built(corpus, tmp_path, capsys,
                                                                                  one_line_error):
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "r"), *TINY_TRANSFORMER, "--steps", "2",
                       "--d-model", "1000000000"]) == 2
    one_line_error(capsys, "hybrid-train", "model: expected a model that fits", "free on cpu", "d_model 1000000000")
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "r"), *TINY_TRANSFORMER, "--steps", "2",
                       "--d-model", "200000", "--n-heads", "2"]) == 2
    one_line_error(capsys, "hybrid-train", "parameters, whose weights, gradients and AdamW moments need at least")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_text_column_reads_another_column(corpus, tmp_path, capsys, suffix, one_line_error):
    rows = [{"content": p.read_text(), "id": i} for i, p in enumerate(sorted(corpus.iterdir()))]
    data = tmp_path / f"notext{suffix}"
    if suffix == ".jsonl":
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), data)
    common = ["--data", str(data), *TINY_TRANSFORMER, "--steps", "2", "--eval-every", "0"]
    assert train_main([*common, "--out", str(tmp_path / "a")]) == 2
    one_line_error(capsys, "hybrid-train", "column 'text'", "['content', 'id']", "--text-column")
    assert train_main([*common, "--text-column", "content", "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "train_config.json").read_text())["text_column"] == "content"


@pytest.mark.parametrize("argv, needles", [
    (["--lr", "inf"], ["lr: expected a finite number > 0, got inf"]),
    (["--lr", "0"], ["lr: expected a finite number > 0, got 0.0"]),
    (["--grad-clip", "-1"], ["grad_clip: expected a finite number > 0, or 0 (or None) for no clipping, got -1.0"]),
    (["--weight-decay", "inf"], ["weight_decay: expected a finite number >= 0, got inf"]),
    (["--set", "rope_scaling={bad json"], ["--set: rope_scaling: expected a JSON value, got '{bad json'",
                                           "Expecting property name enclosed in double quotes at column 2"]),
    (["--log-e", "3"], ["unrecognized arguments: --log-e 3"]),  # no abbreviation of --log-every
    (["--log", "mlflow"], ["--log: invalid choice: 'mlflow'"]),
])
def test_train_values_are_one_line_errors_that_do_not_contradict_themselves(argv, needles, capsys, one_line_error):
    assert train_main([*argv, "--steps", "2"]) == 2
    err = one_line_error(capsys, "hybrid-train", *needles)
    assert "inf]" not in err  # never "(0.0, inf]", an interval inf would be in


def test_grad_clip_zero_means_off_and_says_so():
    assert train_config_from_args(train_parser().parse_args(["--grad-clip", "0"])) == {"grad_clip": 0.0}
    from hybrid.train import TrainConfig

    assert TrainConfig(grad_clip=0).grad_clip is None
    assert "0 turns clipping off" in train_parser().format_help()


def test_log_is_its_own_flag_not_log_every():
    args = train_parser().parse_args(["--log", "tensorboard", "--log", "wandb", "--log-every", "5"])
    assert train_config_from_args(args) == {"log": ["tensorboard", "wandb"], "log_every": 5}


@pytest.mark.parametrize("argv, needles", [
    (["--temperature", "inf"], ["--temperature: expected a finite number >= 0, got 'inf'"]),
    (["--temperature", "-1"], ["--temperature: expected a finite number >= 0, got '-1'"]),
    (["--top-p", "0"], ["--top-p: expected a number in (0, 1], got '0'"]),
])
def test_generate_values_are_one_line_errors(tmp_path, argv, needles, capsys, one_line_error):
    assert generate_main(["--run", str(tmp_path), *argv]) == 2
    one_line_error(capsys, "hybrid-generate", *needles)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_names_the_surviving_checkpoint_and_the_command_that_resumes(corpus, tmp_path, sig):
    """SIGTERM ends the run as Ctrl-C does (the issue: no message, and the lock file left behind)."""
    out = tmp_path / "run"
    env = {**os.environ, "HYBRID_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybrid.train", "--data", str(corpus), "--out", str(out), *TINY_TRANSFORMER,
         "--steps", "100000", "--save-every", "3", "--eval-every", "0"],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell ignores SIGINT
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint" / "checkpoint.json").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        proc.send_signal(sig)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    saved = json.loads((out / "checkpoint" / "checkpoint.json").read_text())["step"]
    by = " by SIGTERM" if sig == signal.SIGTERM else ""
    assert err.startswith(f"hybrid-train: interrupted{by} at step "), err
    assert not (out / ".hybrid.lock").exists()  # released
    assert f"the checkpoint of step {saved} survived in {out / 'checkpoint'}" in err
    command = err.split("resume with: ")[1].strip()
    assert command == f"hybrid-train --resume {out}"
    assert train_main([*command.split()[1:], "--steps", str(saved + 1), "--quiet"]) == 0  # it does resume
