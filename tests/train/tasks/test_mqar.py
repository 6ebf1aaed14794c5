"""MQAR (hybrid.train.tasks.mqar): the pairs and queries, the filler, the gap law, the curriculum point."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybrid.train.tasks import IGNORE, MQAR, make_task, rng_of


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
