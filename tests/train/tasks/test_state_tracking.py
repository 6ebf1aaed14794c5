"""The state-tracking tasks (hybrid.train.tasks.state_tracking): parity and modular arithmetic labels on hand-built
cases, the structure of random samples, padding."""
from __future__ import annotations

import pytest
import torch

from hybrid.train.tasks import IGNORE, evaluate_expression, make_task, rng_of


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


def test_train_lengths_and_padding():
    task = make_task("parity", train_lengths=(3, 6))
    batch = task.train_batch(200, rng_of(0))
    lengths = (batch.ids != task.pad_id).sum(1) - 1
    assert lengths.min() == 3 and lengths.max() == 6
    assert ((batch.ids == task.pad_id) == (batch.labels == IGNORE))[:, 1:].all()  # pads unlabelled, bits labelled


@pytest.mark.parametrize("name", ["parity", "mod5"])
def test_a_length_curriculum_draws_up_to_its_longest_and_any_length_is_a_test_point(name):
    task = make_task(name, train_lengths=(4, 8))
    assert task.longest_train_length == 8
    lengths = (task.train_batch(300, rng_of(1), longest=20).ids != task.pad_id).sum(1) - 1
    assert lengths.min() == 4 and lengths.max() == 20
    same = task.train_batch(50, rng_of(2)).ids, task.train_batch(50, rng_of(2), longest=None).ids
    assert torch.equal(*same)
    assert (task.test_batch("33", 5, rng_of(3)).ids != task.pad_id).sum(1).tolist() == [33 - (name == "mod5") + 1] * 5  # mod5 rounds an odd length down
