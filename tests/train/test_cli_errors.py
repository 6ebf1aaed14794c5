"""Issue 28, items 2 and 3: each bad input is one line naming the argument, exit 2, no traceback; Ctrl-C says what
survived and how to resume; no CLI expands an abbreviated flag."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.train.cli import generate_main, train_config_from_args, train_main, train_parser

REPO = Path(__file__).resolve().parents[2]
TINY = ["--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--warmup", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


def one_line_error(capsys, prog, *needles):
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ---------------------------------------------------------------------------------------------- hybrid-train

def test_a_text_column_that_is_not_a_string_names_file_line_and_column(tmp_path, capsys):
    data = tmp_path / "w.jsonl"
    data.write_text('{"text": 123}\n{"text": null}\n')
    assert train_main(["--data", str(data), "--out", str(tmp_path / "r"), *TINY, "--steps", "2"]) == 2
    one_line_error(capsys, "hybrid-train", "w.jsonl line 1", "column 'text'", "123 (int)")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "a document"}\n{"text": "another"}\n{"text": [1, 2]}\n')
    assert train_main(["--data", str(mixed), "--out", str(tmp_path / "r"), *TINY, "--steps", "2"]) == 2
    one_line_error(capsys, "hybrid-train", "mixed.jsonl line 3", "column 'text'", "[1, 2] (list)")


def test_a_model_that_cannot_fit_is_refused_with_its_estimate_before_it_is_built(corpus, tmp_path, capsys):
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "r"), *TINY, "--steps", "2",
                       "--d-model", "1000000000"]) == 2
    one_line_error(capsys, "hybrid-train", "model: expected a model that fits", "free on cpu", "d_model 1000000000")
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "r"), *TINY, "--steps", "2",
                       "--d-model", "200000", "--n-heads", "2"]) == 2
    one_line_error(capsys, "hybrid-train", "parameters, whose weights, gradients and AdamW moments need at least")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_text_column_reads_another_column(corpus, tmp_path, capsys, suffix):
    rows = [{"content": p.read_text(), "id": i} for i, p in enumerate(sorted(corpus.iterdir()))]
    data = tmp_path / f"notext{suffix}"
    if suffix == ".jsonl":
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), data)
    common = ["--data", str(data), *TINY, "--steps", "2", "--eval-every", "0"]
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
def test_train_values_are_one_line_errors_that_do_not_contradict_themselves(argv, needles, capsys):
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
def test_generate_values_are_one_line_errors(tmp_path, argv, needles, capsys):
    assert generate_main(["--run", str(tmp_path), *argv]) == 2
    one_line_error(capsys, "hybrid-generate", *needles)


def test_every_cli_refuses_abbreviations():
    from importlib.metadata import entry_points

    from hybrid.train.bench.cli import bench_parser
    from hybrid.train.cli import generate_parser
    from hybrid.train.distill.cli import parser as distill_parser
    from hybrid.train.hf.cli import eval_parser, export_parser, import_parser
    from hybrid.train.rope_analysis import analyze_parser
    from hybrid.train.tasks.cli import parser as synthetic_parser

    parsers = [train_parser, generate_parser, bench_parser, eval_parser, export_parser, import_parser,
               analyze_parser, synthetic_parser, distill_parser]
    assert all(p().allow_abbrev is False for p in parsers)
    scripts = {e.name for e in entry_points(group="console_scripts") if e.value.startswith("hybrid.")}
    assert len(scripts) == len(parsers), scripts  # a new CLI gets a line here


# ---------------------------------------------------------------------------------------------- Ctrl-C

def test_ctrl_c_names_the_surviving_checkpoint_and_the_command_that_resumes(corpus, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "HYBRID_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybrid.train", "--data", str(corpus), "--out", str(out), *TINY, "--steps", "100000",
         "--save-every", "3", "--eval-every", "0"],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell ignores SIGINT
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint" / "checkpoint.json").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    saved = json.loads((out / "checkpoint" / "checkpoint.json").read_text())["step"]
    assert err.startswith("hybrid-train: interrupted at step "), err
    assert f"the checkpoint of step {saved} survived in {out / 'checkpoint'}" in err
    command = err.split("resume with: ")[1].strip()
    assert command == f"hybrid-train --resume {out}"
    assert train_main([*command.split()[1:], "--steps", str(saved + 1), "--quiet"]) == 0  # it does resume


# ---------------------------------------------------------------------------------------------- hybrid-import

@pytest.fixture
def llama(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=64)).save_pretrained(path)
    return path


def test_import_of_a_config_with_a_wrong_type_is_one_line(llama, tmp_path, capsys):
    from hybrid.train.hf.cli import import_main

    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "hidden_size": "x"}))
    capsys.readouterr()
    assert import_main([str(llama), str(tmp_path / "run")]) == 2
    one_line_error(capsys, "hybrid-import", "config.json", "hidden_size")
    assert not (tmp_path / "run").exists()


def test_import_of_truncated_weights_is_one_line(llama, tmp_path, capsys):
    from hybrid.train.hf.cli import import_main

    weights = llama / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    assert import_main([str(llama), str(tmp_path / "run")]) == 2
    one_line_error(capsys, "hybrid-import", "model.safetensors", "expected a complete safetensors file")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- hybrid-eval

def test_eval_checks_the_include_path_and_the_output_before_it_evaluates(tmp_path, capsys, monkeypatch):
    import hybrid.train.hf.evaluate as ev
    from hybrid.train.hf.cli import eval_main

    def never(*args, **kwargs):
        raise AssertionError("evaluated before the arguments were checked")

    monkeypatch.setattr(ev, "_lm_eval", never)
    monkeypatch.setattr(ev, "load_for_eval", never)
    assert eval_main([str(tmp_path), "--tasks", "hybrid_tiny_mc", "--include-path", "/nonexistent"]) == 2
    one_line_error(capsys, "hybrid-eval", "include_path: expected a directory of lm-eval task YAML files",
                   "/nonexistent", "no such directory")
    assert eval_main([str(tmp_path), "--tasks", "hybrid_tiny_mc", "--output", "/proc/x/r.json"]) == 2
    one_line_error(capsys, "hybrid-eval", "--output", "/proc/x does not exist")
    assert eval_main([str(tmp_path), "--tasks", "t", "--output", str(tmp_path)]) == 2
    one_line_error(capsys, "hybrid-eval", "--output: expected a file to write, got the directory")


def test_eval_names_an_unknown_task_and_the_nearest(tmp_path, capsys):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]' in the hybrid checkout); it is not in the "
                                          "test extra: it pulls scikit-learn and friends")
    from hybrid.train.hf.cli import eval_main

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = REPO / "tests" / "train" / "hf" / "data"
    (tasks / "tiny_mc.yaml").write_text((data / "tiny_mc.yaml.in").read_text().replace("@DATA@", str(data / "tiny_mc.jsonl")))
    assert eval_main([str(tmp_path / "no-run"), "--tasks", "nonexistent_task,hybrid_tiny_m",
                      "--include-path", str(tasks)]) == 2
    one_line_error(capsys, "hybrid-eval", "unknown 'nonexistent_task', 'hybrid_tiny_m'", "did you mean hybrid_tiny_mc")


def test_check_tasks_without_lm_eval():
    from hybrid.train.hf.evaluate import check_tasks

    class Manager:
        all_tasks = ["hellaswag", "arc_easy", "arc_challenge"]

    check_tasks(Manager(), ["arc_easy"])
    with pytest.raises(ValueError, match=r"unknown 'arc_esay'; did you mean arc_easy\?"):
        check_tasks(Manager(), ["arc_esay"])
    with pytest.raises(ValueError, match=r"--include-path DIR.*`lm-eval ls tasks` lists them"):
        check_tasks(Manager(), ["zzz"])


def test_lm_evals_pretrained_warning_is_silenced_and_only_it(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]' in the hybrid checkout); it is not in the "
                                          "test extra: it pulls scikit-learn and friends")
    pytest.importorskip("accelerate", reason="lm-eval's HFLM needs accelerate (pip install -e '.[eval]' in the hybrid checkout)")
    import logging

    import lm_eval
    import torch

    import hybrid.train.hf.evaluate as ev
    from hybrid.models import HybridConfig, HybridLM
    from hybrid.train.checkpoint import capture_rng_state, save_checkpoint
    from hybrid.train.tokenizer import ByteTokenizer

    config = HybridConfig.preset("transformer", d_model=32, n_layers=2, n_heads=2, vocab_size=320)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "run", model_state=HybridLM(config).state_dict(), config=config.to_dict(),
                    optimizer_state=None, scheduler_state=None, rng_state=capture_rng_state(), data_state=None,
                    step=0, extra={"tokenizer": ByteTokenizer().to_dict()})
    monkeypatch.setattr(ev, "task_manager", lambda tasks, include_path=None: None)  # no task index: fast
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kwargs: {"results": {}})
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("lm_eval.models.huggingface")
    handler = Collect(level=logging.DEBUG)
    logger.addHandler(handler)
    try:
        assert ev.evaluate(tmp_path / "run", ["anything"]) == {"results": {}}
        logger.warning("another warning")  # the filter is gone after the call, and only ever took that message
    finally:
        logger.removeHandler(handler)
    assert not any("`pretrained` model kwarg is not of type `str`" in m for m in seen), seen
    assert "another warning" in seen
