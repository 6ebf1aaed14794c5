"""A task run (hybrid.train.tasks.train): the curriculum first, its config's checks, the scored positions and the
masked loss, a run directory that reopens."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from hybrid.train.loop.checkpoint import load_checkpoint
from hybrid.train.tasks import IGNORE, MQAR
from hybrid.train.tasks import make_task, rng_of
from hybrid.train.tasks.train import (TaskRunConfig, load_task_run, majority_accuracy, masked_loss, scored_positions,
                                     train_task)


def test_a_run_trains_its_curriculum_steps_first(tmp_path, monkeypatch):
    drawn = []
    for name in ("curriculum_batch", "train_batch"):
        original = getattr(MQAR, name)
        monkeypatch.setattr(MQAR, name, lambda self, n, rng, _f=original, _name=name, **kw: drawn.append(_name)
                            or _f(self, n, rng, **kw))
    config = TaskRunConfig(task="mqar", task_params={"grid": [[16, 2], [32, 4]], "vocab_size": 16}, preset="transformer",
                           model={"d_model": 16, "n_layers": 1, "n_heads": 2}, steps=5, curriculum_steps=2,
                           batch_size=4, eval_size=4)
    train_task(config, tmp_path)
    # five steps (two of the curriculum); the validation draws a batch per grid point (valid_batches)
    assert drawn == ["curriculum_batch"] * 2 + ["train_batch"] * 3
    with pytest.raises(ValueError, match=r"curriculum_steps: expected an int in \[0, steps=5\], got 6"):
        TaskRunConfig(task="mqar", steps=5, curriculum_steps=6)


def test_mqar_is_validated_on_every_grid_point(monkeypatch):
    """Training draws one grid point a batch, and validation was one training batch: the validation seed's draw,
    64x4 of the suites' grid, the easiest (a model exact there and wrong elsewhere scored 1.0, and the suites picked
    learning rates by it). Now a batch per point, their figures averaged."""
    import hybrid.train.tasks.train as task_train

    shapes = []

    def by_length(model, batch, score, device):  # (accuracy, loss): exact at 16 tokens only
        shapes.append(tuple(batch.ids.shape))
        return (1.0 if batch.ids.shape[1] == 16 else 0.0), float(batch.ids.shape[1])
    monkeypatch.setattr(task_train, "accuracy", by_length)
    config = TaskRunConfig(task="mqar", task_params={"grid": [[16, 2], [32, 4], [48, 4]], "vocab_size": 16},
                           preset="transformer", steps=2, eval_size=7)
    task = make_task("mqar", **config.task_params)
    figures = task_train.TaskStage(config, task, torch.nn.Identity(), torch.device("cpu")).evaluate()
    assert shapes == [(3, 16), (3, 32), (3, 48)]  # 7 sequences split over 3 points, rounded up
    assert figures["valid_accuracy"] == pytest.approx(1 / 3) and figures["valid_loss"] == pytest.approx(32.0)


def test_a_staged_passkey_curriculum_trains_its_lengths_in_order(tmp_path, monkeypatch):
    from hybrid.train.tasks.passkey.task import Passkey

    lengths = []
    original = Passkey.sample
    monkeypatch.setattr(Passkey, "sample", lambda self, length, n, rng, split="train", edge_share=0.0:
                        lengths.append((length, split)) or original(self, length, n, rng, split, edge_share))
    config = TaskRunConfig(task="passkey", task_params={"train_length": 48, "curriculum_length": [16, 32],
                                                        "test_lengths": [48], "depths": 2, "samples": 1,
                                                        "filler_vocab": 8},
                           preset="hybrid", model={"d_model": 16, "n_layers": 3, "n_heads": 2, "window": 8},
                           steps=7, curriculum_steps=5, batch_size=2, eval_size=2)
    train_task(config, tmp_path)
    # 5 curriculum steps over 2 stages (⌊i·2/5⌋: 3 at 16, 2 at 32), then 2 at the training length
    assert lengths[:7] == [(16, "train")] * 3 + [(32, "train")] * 2 + [(48, "train")] * 2
    assert load_task_run(tmp_path)[1].curriculum_lengths == (16, 32)


@pytest.mark.parametrize("field, value, expected", [
    ("lr", True, "lr: expected a finite number > 0, got True"),  # a bool is not a learning rate (it was taken as 1)
    ("lr", 0, "lr: expected a finite number > 0, got 0"),
    ("lr", float("nan"), "lr: expected a finite number > 0, got nan"),
    ("steps", True, "steps: expected an int >= 1, got True"),
    ("weight_decay", -0.1, "weight_decay: expected a finite number >= 0, got -0.1"),
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


def test_the_most_common_answer_is_scored_where_the_task_scores():
    labels = torch.tensor([[IGNORE, 4, 0, IGNORE], [IGNORE, 2, 1, 0], [3, 3, IGNORE, 2], [IGNORE, 0, 0, 0]])
    assert majority_accuracy(labels, "last") == 0.75  # the last answers: 0, 0, 2, 0
    assert majority_accuracy(labels, "all") == 5 / 11  # 0 five times among eleven labelled positions
    # mod 5 left to right: a product with 0 stays 0, so 0 answers far more than a fifth of long expressions
    task = make_task("mod5", train_lengths=[3, 40], test_lengths=[256])
    labels = task.test_batch("256", 2048, rng_of(5)).labels
    answers = labels[scored_positions(labels, "last")]
    assert majority_accuracy(labels, task.score) == (answers == 0).float().mean().item() > 0.24


def test_a_run_directory_reopens(tmp_path):
    config = TaskRunConfig(task="parity", task_params={"train_lengths": [3, 6], "test_lengths": [6, 9]},
                           model={"d_model": 16, "n_layers": 1, "n_heads": 2}, steps=2, batch_size=4, eval_size=8)
    results = train_task(config, tmp_path)
    assert set(results["accuracy"]) == {"6", "9"} and results["status"] == "finished"
    assert set(results["majority_accuracy"]) == {"6", "9"} and 0.5 <= min(results["majority_accuracy"].values())
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.extra["task"]["tokens"] == json.loads((tmp_path / "task.json").read_text())["tokens"]
    model, task = load_task_run(tmp_path)
    from hybrid.train.tasks.train import evaluate_task

    again = evaluate_task(model, task, 8, torch.device("cpu"))
    assert again["accuracy"] == results["accuracy"]
    assert json.loads((tmp_path / "results.json").read_text())["accuracy"] == results["accuracy"]


def _parity_run(**kw) -> TaskRunConfig:
    model = {"d_model": 16, "n_layers": 1, "n_heads": 2, "rnn_phase": "data", **kw.pop("model", {})}
    kw = {"steps": 4, "batch_size": 4, "eval_size": 16, **kw}
    return TaskRunConfig(task="parity", task_params={"train_lengths": [3, 6], "test_lengths": [6, 24]},
                         preset="vo-rnn", model=model, **kw)


@pytest.mark.parametrize("grow", [0, 9])
def test_the_long_validation_is_twice_the_longest_training_length_on_fresh_sequences(tmp_path, grow):
    """valid_length = 2 × the longest length trained on (after growth); its score is the model's accuracy at the
    last position of VALID_SEED + 1 sequences of that length, which no test point uses."""
    from hybrid.train.tasks.base import rng_of
    from hybrid.train.tasks.train import TEST_SEED, VALID_SEED, accuracy

    results = train_task(_parity_run(grow_lengths_to=grow), tmp_path)
    length = 2 * (grow or 6)
    assert results["valid_length"] == length
    model, task = load_task_run(tmp_path)
    batch = task.test_batch(str(length), 16, rng_of(VALID_SEED + 1))
    assert (batch.ids != task.pad_id).sum(1).eq(length + 1).all()
    assert (results["valid_long_accuracy"], results["valid_long_loss"]) == accuracy(model, batch, "last", torch.device("cpu"))
    tests = [task.test_batch(p, 16, rng_of(TEST_SEED + i)).ids for i, p in enumerate(task.test_points())]
    assert not any(t.shape == batch.ids.shape and torch.equal(t, batch.ids) for t in tests)


def test_a_length_curriculum_grows_over_the_first_half(tmp_path, monkeypatch):
    from hybrid.train.tasks import Parity

    drawn = []
    original = Parity.train_batch
    monkeypatch.setattr(Parity, "train_batch", lambda self, n, rng, longest=None: drawn.append(longest) or original(self, n, rng, longest))
    config = _parity_run(grow_lengths_to=14, steps=8)
    train_task(config, tmp_path)
    assert drawn == [8, 10, 12, 14, 14, 14, 14, 14, None]  # 6 → 14 over steps 1–4, then the validation draw


def test_rounding_starts_at_its_fraction_of_the_steps_and_is_saved_in_the_config(tmp_path, monkeypatch):
    import hybrid.train.tasks.train as train_module

    events = []
    real = train_module.set_phase_rounding
    monkeypatch.setattr(train_module, "set_phase_rounding", lambda m, on: events.append(("round", on)) or real(m, on))
    config = _parity_run(model={"recurrence.phase_round": 2}, phase_round_from=0.5)
    train_task(config, tmp_path, on_step=lambda step, loss: events.append(("step", step)))
    assert events == [("round", False), ("step", 1), ("step", 2), ("round", True), ("step", 3), ("step", 4)]
    model, _ = load_task_run(tmp_path)
    phase = model.blocks[0].mixer.data_phase
    assert (phase.round_to, phase.round_at_inference, phase.rounds()) == (2, False, False)  # eval: not rounded
    assert load_checkpoint(tmp_path).config["recurrence"]["phase_round"] == 2


@pytest.mark.parametrize("kw, expected", [
    (dict(task="mqar", grow_lengths_to=80), "grow_lengths_to: expected 0 for mqar (no training lengths to grow), got 80"),
    (dict(task="parity", grow_lengths_to=40), "grow_lengths_to: expected 0 or a length > the longest training length 40, got 40"),
    (dict(task="parity", phase_round_from=1.0), "phase_round_from: expected a number in [0, 1), got 1.0"),
])
def test_state_tracking_options_refuse_bad_values_in_one_line(kw, expected):
    with pytest.raises(ValueError) as e:
        TaskRunConfig(**kw)
    assert str(e.value) == expected


def test_metrics_are_readable_while_the_run_trains(tmp_path):
    """Each logged step is in metrics.jsonl when the next step starts (it was buffered until the run's end)."""
    seen = []
    config = _parity_run(log_every=2, steps=5)
    train_task(config, tmp_path, on_step=lambda step, loss: seen.append(
        [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]))
    assert seen == [[], [2], [2], [2, 4], [2, 4, 5]]


def test_forward_passes_run_under_the_runs_autocast(tmp_path, monkeypatch):
    """Every forward of a task run (each training step, the validation, the final scoring) runs inside the
    autocast that ``precision`` gives the run's device: bf16 on CUDA, as hybrid-train, nothing on the CPU. Here a
    recording context stands in for it; the backward and the loss's float32 cross-entropy run outside."""
    import contextlib

    from hybrid.train.tasks import train as task_train

    depth = [0]
    forwards = []

    @contextlib.contextmanager
    def recording():
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    asked = []
    monkeypatch.setattr(task_train, "precision", lambda device: asked.append(device) or (recording, None))
    original = task_train.HybridLM.forward
    monkeypatch.setattr(task_train.HybridLM, "forward",
                        lambda self, *a, **kw: forwards.append(depth[0]) or original(self, *a, **kw))
    config = TaskRunConfig(task="mqar", task_params={"grid": [[16, 2]], "vocab_size": 16}, preset="transformer",
                           model={"d_model": 16, "n_layers": 1, "n_heads": 2}, steps=3, batch_size=4, eval_size=4)
    train_task(config, tmp_path)
    assert asked == [torch.device("cpu")]
    assert len(forwards) >= 3 + 2 and all(forwards), forwards  # 3 steps, validation and test: all inside
    bf16 = TaskRunConfig(task="mqar", task_params={"grid": [[16, 2]], "vocab_size": 16}, preset="transformer",
                         model={"d_model": 16, "n_layers": 1, "n_heads": 2, "dtype": "bfloat16"}, steps=1,
                         batch_size=4, eval_size=4)
    forwards.clear()
    train_task(bf16, tmp_path / "bf16")  # a model of another dtype than float32 runs as it is
    assert forwards and not any(forwards)
