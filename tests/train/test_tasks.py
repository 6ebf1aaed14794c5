"""The synthetic task generators: exact labels on hand-built cases, structure of random samples, seeded repeatability."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hybrid.train.checkpoint import load_checkpoint
from hybrid.train.tasks import IGNORE, MQAR, evaluate_expression, make_task, rng_of, scaled_accuracy
from hybrid.train.tasks.train import TaskRunConfig, load_task_run, masked_loss, scored_positions, train_task


def test_parity_labels_by_hand():
    task = make_task("parity")
    ids, labels = task.example([1, 0, 1, 1, 0])
    assert ids == [task.tokens["<bos>"], 1, 0, 1, 1, 0]
    assert labels == [IGNORE, 1, 1, 0, 1, 1]
    assert task.tokens["0"] == 0 and task.tokens["1"] == 1  # a label is the token of its parity


@pytest.mark.parametrize(
    "text,value",
    [
        ("3", 3),
        ("2 + 3 * 4", 0),  # left to right: (2 + 3) · 4 = 20
        ("1 + 2 * 3", 4),  # not 7 (precedence) but (1 + 2) · 3 = 9
        ("3 - 4", 4),  # −1 mod 5
        ("0 - 1 - 1", 3),
        ("( 2 + 3 ) * 4", 0),
        ("2 * ( 3 + 4 )", 4),  # 2 · 7 = 14
        ("4 - ( 1 - ( 2 * 3 ) )", 4),  # 4 − (1 − 1)
        ("( ( 4 ) )", 4),
        ("( 1 + 1 ) * ( 2 + 2 ) - 3", 0),  # 2 · 4 − 3 = 5
    ],
)
def test_modular_values_by_hand(text, value):
    assert evaluate_expression(text.split()) == value


@pytest.mark.parametrize("text", ["1 +", "( 1 + 2", "1 2 +", "1 2", "1 + 2 )", "( )", "+ 1", "1 ( 2 )", ""])
def test_modular_rejects_broken_expressions(text):
    with pytest.raises(ValueError, match=r"tokens: expected a complete expression"):
        evaluate_expression(text.split())


def test_modular_rejects_unknown_symbols():
    with pytest.raises(ValueError, match=r"tokens: expected digits"):
        evaluate_expression("1 / 2".split())


def test_modular_example_labels_only_the_answer():
    task = make_task("mod5-brackets")
    ids, labels = task.example("( 2 + 3 ) * 4".split())
    t = task.tokens
    assert ids == [t["<bos>"], t["("], t["2"], t["+"], t["3"], t[")"], t["*"], t["4"], t["="]]
    assert labels == [IGNORE] * 8 + [t["0"]]


@pytest.mark.parametrize("name", ["mod5", "mod5-brackets"])
def test_modular_samples_have_the_asked_length_and_their_value(name):
    task = make_task(name)
    inverse = {i: s for s, i in task.tokens.items()}
    rng = rng_of(5)
    saw_bracket = False
    for length in [2, 3, 4, 9, 40, 41, 64, 255, 256]:
        ids, labels = task.sample(length, rng)
        want = length - length % 2  # expression (odd) + "=" has an even length
        assert len(ids) - 1 == want and len(labels) == len(ids)
        symbols = [inverse[i] for i in ids[1:-1]]
        saw_bracket |= "(" in symbols
        assert symbols.count("(") == symbols.count(")")
        assert labels[-1] == task.tokens[str(evaluate_expression(symbols))]
        assert all(v == IGNORE for v in labels[:-1])
        if name == "mod5":
            assert all(s.isdigit() for s in symbols[0::2]) and all(s in "+-*" for s in symbols[1::2])
    assert saw_bracket == (name == "mod5-brackets")


def test_modular_answers_cover_every_residue():
    task = make_task("mod5")
    batch = task.train_batch(400, rng_of(0))
    answers = batch.labels[batch.labels != IGNORE]
    counts = torch.bincount(answers, minlength=5)[:5]
    assert (counts > 40).all(), counts  # roughly uniform over 0 … 4 (expected 80 each)


def test_mqar_structure():
    task = MQAR(grid=((64, 4), (128, 8)), vocab_size=128)
    batch = task.test_batch("128x8", 50, rng_of(3))
    assert batch.ids.shape == batch.labels.shape == (50, 128)
    half = 64
    for ids, labels in zip(batch.ids.tolist(), batch.labels.tolist()):
        keys, values = ids[0:16:2], ids[1:16:2]
        assert len(set(keys)) == 8 and all(1 <= k < half for k in keys)
        assert len(set(values)) == 8 and all(half <= v < 128 for v in values)
        queries = [t for t, v in enumerate(labels) if v != IGNORE]
        assert len(queries) == 8 and all(t >= 16 and (t - 16) % 2 == 0 for t in queries)
        pairs = dict(zip(keys, values))
        assert sorted(ids[t] for t in queries) == sorted(keys)  # every key queried once
        assert all(labels[t] == pairs[ids[t]] for t in queries)  # labelled with its value, at the query


@pytest.mark.parametrize("random_filler", [True, False])
def test_mqar_filler(random_filler):
    """Random filler draws every token, keys included (decoy pairs); the clean filler is token 0 alone, which is
    neither a key nor a value, and the pairs and queries are the same either way."""
    task = MQAR(grid=((256, 16),), vocab_size=64, random_filler=random_filler)
    batch = task.test_batch("256x16", 40, rng_of(5))
    filler = batch.ids[:, 32:][batch.labels[:, 32:] == IGNORE]  # positions after the pairs that are not queries
    if random_filler:
        assert filler.unique().numel() == 64
    else:
        assert filler.unique().tolist() == [0]
    assert task.params()["random_filler"] is random_filler
    assert make_task("mqar", **json.loads(json.dumps(task.params()))).random_filler is random_filler


def test_mqar_gap_law():
    task = MQAR(grid=((64, 4),), vocab_size=64)
    p = task.gap_probabilities(64, 4)
    j = np.arange(1, 29)
    np.testing.assert_allclose(p, 0.01 * j ** -0.99 / (0.01 * j ** -0.99).sum(), rtol=1e-12)
    assert len(p) == (64 - 8) // 2 and np.all(np.diff(p) < 0)


def test_mqar_curriculum_draws_the_easiest_point():
    task = MQAR(grid=((128, 8), (64, 4), (256, 16)), vocab_size=64)
    a, b = (task.curriculum_batch(10, rng_of(4)) for _ in range(2))
    assert a.ids.shape == (10, 64) and torch.equal(a.ids, b.ids)
    assert ((a.labels != IGNORE).sum(1) == 4).all()  # the 64x4 point: four queries a row
    parity = make_task("parity")  # no curriculum of its own: the ordinary training batch
    assert torch.equal(parity.curriculum_batch(8, rng_of(2)).ids, parity.train_batch(8, rng_of(2)).ids)


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


@pytest.mark.parametrize("name", ["parity", "mod5", "mod5-brackets", "mqar"])
def test_seeded_repeatability(name):
    task = make_task(name, **({"vocab_size": 64} if name == "mqar" else {}))
    a, b, c = (task.train_batch(16, rng_of(seed)) for seed in (7, 7, 8))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.ids, c.ids) if a.ids.shape == c.ids.shape else True
    point = task.test_points()[0]
    assert torch.equal(task.test_batch(point, 8, rng_of(1)).ids, task.test_batch(point, 8, rng_of(1)).ids)


def test_train_lengths_and_padding():
    task = make_task("parity", train_lengths=(3, 6))
    batch = task.train_batch(200, rng_of(0))
    lengths = (batch.ids != task.pad_id).sum(1) - 1
    assert lengths.min() == 3 and lengths.max() == 6
    assert ((batch.ids == task.pad_id) == (batch.labels == IGNORE))[:, 1:].all()  # pads unlabelled, bits labelled


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
