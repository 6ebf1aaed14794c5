"""What every task shares (hybrid.train.tasks, tasks.base): seeded repeatability, task.json, one-line errors,
the scaled accuracy."""
from __future__ import annotations

import json

import pytest
import torch

from hybrid.train.tasks import make_task, rng_of, scaled_accuracy


@pytest.mark.parametrize("name", ["parity", "mod5", "mod5-brackets", "mqar"])
def test_seeded_repeatability(name):
    task = make_task(name, **({"vocab_size": 64} if name == "mqar" else {}))
    a, b, c = (task.train_batch(16, rng_of(seed)) for seed in (7, 7, 8))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.ids, c.ids) if a.ids.shape == c.ids.shape else True
    point = task.test_points()[0]
    assert torch.equal(task.test_batch(point, 8, rng_of(1)).ids, task.test_batch(point, 8, rng_of(1)).ids)


def test_task_json_rebuilds_the_task():
    for name in ("parity", "mod5-brackets", "mqar"):
        task = make_task(name)
        spec = json.loads(json.dumps(task.to_json()))
        again = make_task(spec["task"], **spec["params"])
        assert again.tokens == task.tokens and spec["vocab_size"] == task.vocab_size


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("parity", dict(train_lengths=(5, 3)), r"train_lengths: expected 1 <= low <= high, got \(5, 3\)"),
        ("mod5", dict(test_lengths=(1,)), r"test_lengths: expected lengths >= 2"),
        ("mqar", dict(vocab_size=7), r"vocab_size: expected an even int >= 8, got 7"),
        ("mqar", dict(random_filler="no"), r"random_filler: expected True or False, got 'no'"),
        ("mqar", dict(grid=((16, 5),)), r"grid: expected even lengths with 1 <= 4·pairs <= length, got \(16, 5\)"),
        ("sorting", {}, r"task: expected one of"),
    ],
)
def test_bad_parameters(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_task(name, **params)


def test_scaled_accuracy():
    assert scaled_accuracy(1.0, 0.5) == 1.0 and scaled_accuracy(0.5, 0.5) == 0.0
    assert scaled_accuracy(0.6, 0.2) == pytest.approx(0.5)
