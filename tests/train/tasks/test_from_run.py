"""hybrid-synthetic --init-from (hybrid.train.tasks.from_run): a trained byte-level LM fine-tuned on passkey-text."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import load_checkpoint, save_checkpoint
from hybrid.train.cli import synthetic as cli
from hybrid.train.tasks import make_task
from hybrid.train.tasks.passkey.suites import BUDGETS, task_params
from hybrid.train.tasks.train import TaskRunConfig, train_task

LM = ["--d-model", "32", "--n-layers", "3", "--n-heads", "2", "--window", "8", "--seq-len", "32", "--batch-size", "4",
      "--warmup", "1", "--eval-batches", "1", "--device", "cpu"]
TEXT = dict(train_length=40, test_lengths=[40, 70], depths=2, samples=2)


@pytest.fixture
def lm_run(train_run):
    """A tiny hybrid LM trained for 2 steps by hybrid-train (byte tokenizer, vocabulary 320)."""
    return train_run("lm", 2, LM)


def _fake_run(path, vocab_size: int, tokenizer: dict | None):
    config = HybridConfig.preset("transformer", "tiny", d_model=16, n_layers=1, n_heads=2, vocab_size=vocab_size)
    extra = {"tokenizer": tokenizer} if tokenizer is not None else {}
    save_checkpoint(path, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=None, data_state=None, step=1, extra=extra)
    return path


def test_a_fine_tune_starts_from_the_runs_weights_with_its_architecture(lm_run, corpus, tmp_path):
    """At a vanishing rate one step leaves every weight where the source run had it: the fine-tune loaded them
    all, with the source's config (not a preset's), and its --set overrides on top."""
    config = TaskRunConfig(task="passkey-text", task_params={**TEXT, "corpus": str(corpus)}, preset=None, size=None,
                           model={"window": 12}, steps=1, batch_size=2, lr=1e-30, eval_size=2, init_from=str(lm_run),
                           device="cpu")
    results = train_task(config, tmp_path / "ft")
    assert results["status"] == "finished"
    source, tuned = load_checkpoint(lm_run), load_checkpoint(tmp_path / "ft")
    before = HybridConfig.from_dict(source.config)
    assert before.replace(window=12).to_dict() == tuned.config and before.to_dict() != tuned.config
    assert source.model_state.keys() == tuned.model_state.keys()
    for name, weight in source.model_state.items():
        torch.testing.assert_close(tuned.model_state[name], weight, rtol=0, atol=1e-20, msg=name)
    assert tuned.extra["task_run"]["init_from"] == str(lm_run)


def test_the_passkey_text_budgets_make_a_valid_task():
    """The smoke budget's random-filler parameter (filler_vocab) is not passed to the text filler, which refuses it."""
    for name, budget in BUDGETS.items():
        assert "filler_vocab" not in task_params(budget, "passkey-text")
        make_task("passkey-text", **task_params(budget, "passkey-text"))
    assert task_params(BUDGETS["smoke"], "passkey")["filler_vocab"] == 16


def test_init_from_refusals_are_one_line(lm_run, tmp_path, capsys, one_line_error):
    small = _fake_run(tmp_path / "small", 64, {"kind": "bytes"})
    bpe = _fake_run(tmp_path / "bpe", 320, {"kind": "tokenizers", "path": "tok.json", "sha256": "0", "eos_token": None})
    untagged = _fake_run(tmp_path / "untagged", 320, None)
    cases = [
        (["--task", "parity", "--init-from", str(lm_run)],
         "--init-from: expected a task whose tokens are a byte-level LM's (passkey-text), got parity"),
        (["--task", "passkey-text", "--init-from", str(lm_run), "--preset", "hybrid"],
         "--preset: the architecture comes from --init-from; expected no --preset with it, got --preset hybrid"),
        (["--task", "passkey-text", "--init-from", str(lm_run), "--model", "hybrid"],
         "--model: the architecture comes from --init-from"),
        (["--suite", "passkey-text", "--init-from", str(lm_run)], "--edge-share and --init-from: apply to one run"),
        (["--task", "passkey-text", "--init-from", str(tmp_path / "nowhere")],
         f"--init-from: expected a run directory (with checkpoint/), got {tmp_path / 'nowhere'}"),
        (["--task", "passkey-text", "--init-from", str(small)],
         f"--init-from: expected a vocabulary of at least 261 (bytes and the two markers), got 64 in {small}"),
        (["--task", "passkey-text", "--init-from", str(bpe)],
         "--init-from: expected a run trained on the byte tokenizer (the task's tokens are bytes), got"),
        (["--task", "passkey-text", "--init-from", str(untagged)], "with tokenizer none recorded"),
        (["--task", "passkey-text", "--init-from", str(lm_run), "--set", "d_model=48"],
         "differ, e.g. blocks.0.mixer"),
    ]
    for i, (argv, message) in enumerate(cases):
        assert cli.main([*argv, "--budget", "smoke", "--out", str(tmp_path / f"x{i}"), "--quiet"]) == 2, argv
        one_line_error(capsys, "hybrid-synthetic", message)
        assert not (tmp_path / f"x{i}").exists()
