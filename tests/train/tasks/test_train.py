"""A task run (hybrid.train.tasks.train): the curriculum first, its config's checks, the scored positions and the
masked loss, a run directory that reopens."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from hybrid.train.checkpoint import load_checkpoint
from hybrid.train.tasks import IGNORE, MQAR
from hybrid.train.tasks.train import TaskRunConfig, load_task_run, masked_loss, scored_positions, train_task


def test_a_run_trains_its_curriculum_steps_first(tmp_path, monkeypatch):
    drawn = []
    for name in ("curriculum_batch", "train_batch"):
        original = getattr(MQAR, name)
        monkeypatch.setattr(MQAR, name, lambda self, n, rng, _f=original, _name=name: drawn.append(_name) or _f(self, n, rng))
    config = TaskRunConfig(task="mqar", task_params={"grid": [[16, 2], [32, 4]], "vocab_size": 16}, preset="transformer",
                           model={"d_model": 16, "n_layers": 1, "n_heads": 2}, steps=5, curriculum_steps=2,
                           batch_size=4, eval_size=4)
    train_task(config, tmp_path)
    # five steps (two of the curriculum), then the validation batch of the training distribution
    assert drawn == ["curriculum_batch"] * 2 + ["train_batch"] * 4
    with pytest.raises(ValueError, match=r"curriculum_steps: expected an int in \[0, steps=5\], got 6"):
        TaskRunConfig(task="mqar", steps=5, curriculum_steps=6)


@pytest.mark.parametrize("field, value, expected", [
    ("lr", True, "lr: expected a number > 0, got True"),  # a bool is not a learning rate (it was taken as 1)
    ("lr", 0, "lr: expected a number > 0, got 0"),
    ("lr", float("nan"), "lr: expected a number > 0, got nan"),
    ("steps", True, "steps: expected a positive int, got True"),
    ("weight_decay", -0.1, "weight_decay: expected a number >= 0, got -0.1"),
    ("device", "gpu", "device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
])
def test_a_task_run_config_refuses_a_bad_value_in_one_line(field, value, expected):
    with pytest.raises(ValueError) as e:
        TaskRunConfig(task="parity", **{field: value})
    assert str(e.value) == expected


def test_scored_positions_and_masked_loss():
    labels = torch.tensor([[IGNORE, 1, 0, IGNORE], [IGNORE, IGNORE, 1, 1]])
    last = scored_positions(labels, "last")
    assert last.tolist() == [[False, False, True, False], [False, False, False, True]]
    assert torch.equal(scored_positions(labels, "all"), labels != IGNORE)
    logits = torch.randn(2, 4, 3, dtype=torch.float64)
    keep = labels != IGNORE
    want = F.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(masked_loss(logits, labels), want.float())


def test_a_run_directory_reopens(tmp_path):
    config = TaskRunConfig(task="parity", task_params={"train_lengths": [3, 6], "test_lengths": [6, 9]},
                           model={"d_model": 16, "n_layers": 1, "n_heads": 2}, steps=2, batch_size=4, eval_size=8)
    results = train_task(config, tmp_path)
    assert set(results["accuracy"]) == {"6", "9"} and results["status"] == "finished"
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.extra["task"]["tokens"] == json.loads((tmp_path / "task.json").read_text())["tokens"]
    model, task = load_task_run(tmp_path)
    from hybrid.train.tasks.train import evaluate_task

    again = evaluate_task(model, task, 8, torch.device("cpu"))
    assert again["accuracy"] == results["accuracy"]
    assert json.loads((tmp_path / "results.json").read_text())["accuracy"] == results["accuracy"]
