"""The passkey task (hybrid.train.tasks.passkey.task): where keys and depths are, the filler, seeds, task.json, chunked
scoring, YaRN, bad parameters, the heatmap."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from hybrid.models import PRESETS, HybridConfig, HybridLM
from hybrid.train.tasks import IGNORE, make_task, rng_of, score_passkey, score_task_json
from hybrid.train.tasks.passkey.scoring import answer_logits, plot_heatmap, yarn_scaling

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # width-16 models (tests/conftest.py)
SMALL = dict(train_length=40, test_lengths=[40, 64, 97], depths=5, samples=3, filler_vocab=12)


def tiny_model(task, preset="transformer", **overrides) -> HybridLM:
    """One full pattern of ``preset`` at width 16."""
    torch.manual_seed(0)
    layers = len(overrides.get("pattern", PRESETS[preset]["pattern"]))
    config = HybridConfig.preset(preset, "tiny", vocab_size=task.vocab_size, d_model=16, n_layers=layers, n_heads=2,
                                 **overrides)
    return HybridLM(config).eval()


def parts(task, ids, length, p):
    """Split one sequence at the layout's positions: filler before, key marker, digits, filler after, query…"""
    k = task.k
    return ids[:p], ids[p], ids[p + 1 : p + 1 + k], ids[p + 1 + k : length - k], ids[length - k], ids[length - k + 1 :]


@pytest.mark.parametrize("name", ["passkey", "passkey-text"])
def test_keys_and_depths_are_where_they_are_said_to_be(name, corpus):
    params = dict(SMALL, **({"corpus": str(corpus)} if name == "passkey-text" else {}))
    if name == "passkey-text":
        params.pop("filler_vocab")
    task = make_task(name, **params)
    test_set = task.test_set()
    k, digits = task.k, task.digit_ids
    for length in task.test_lengths:
        haystacks, keys = test_set[length]
        F = length - 2 * k - 1
        assert haystacks.shape == (task.samples, F) and keys.shape == (task.samples, k)
        batch = task.cell_batch(test_set, length)
        assert batch.ids.shape == (len(task.depths) * task.samples, length)
        positions = [task.key_position(length, d) for d in task.depths]
        assert positions[0] == 0 and positions[-1] == F  # depth 0: first; depth 1: right before the query
        assert positions == sorted(positions) and positions[2] == int(np.floor(0.5 * F + 0.5))
        for row, (ids, labels) in enumerate(zip(batch.ids.numpy(), batch.labels.numpy())):
            d, s = divmod(row, task.samples)
            p = positions[d]
            before, key, key_digits, after, query, answer_inputs = parts(task, ids, length, p)
            assert key == task.key_id and query == task.query_id
            np.testing.assert_array_equal(key_digits, digits[keys[s]])
            np.testing.assert_array_equal(np.concatenate([before, after]), haystacks[s])  # the filler, unbroken
            np.testing.assert_array_equal(answer_inputs, digits[keys[s]][:-1])  # teacher-forced answer
            np.testing.assert_array_equal(labels[length - k :], digits[keys[s]])  # labelled at the last k
            assert (labels[: length - k] == IGNORE).all()
            assert (ids == task.key_id).sum() == 1 and (ids == task.query_id).sum() == 1
            # the key's distance: from its last digit to the query marker, as the sequence has them
            last_digit = int(np.flatnonzero(ids == task.key_id)[0]) + k
            assert task.key_distance(length, task.depths[d]) == int(np.flatnonzero(ids == task.query_id)[0]) - last_digit
    # the depth is the share of the filler before the key
    assert task.key_position(97, 0.25) == int(np.floor(0.25 * (97 - 11) + 0.5))
    assert make_task("passkey", depths=[0.0, 0.3]).depths == (0.0, 0.3)


def test_random_filler_never_holds_a_digit_or_a_marker():
    task = make_task("passkey", **SMALL)
    batch = task.train_batch(300, rng_of(0))
    k, L = task.k, task.train_length
    filler_ids = set(task.filler_ids.tolist())
    assert not filler_ids & (set(task.digit_ids.tolist()) | {task.key_id, task.query_id, task.pad_id})
    positions = []
    for ids in batch.ids.numpy():
        p = int(np.flatnonzero(ids == task.key_id)[0])
        positions.append(p)
        before, _, _, after, _, _ = parts(task, ids, L, p)
        assert set(np.concatenate([before, after]).tolist()) <= filler_ids
    assert min(positions) == 0 and max(positions) == L - 2 * k - 1  # training depths cover 0 … 100 %
    test_set = task.test_set()
    assert all(set(np.unique(h).tolist()) <= filler_ids for h, _ in test_set.values())
    assert len(set(np.concatenate([h.ravel() for h, _ in test_set.values()]).tolist())) == task.filler_vocab


def test_text_filler_is_the_corpus(corpus):
    task = make_task("passkey-text", train_length=40, test_lengths=[40, 70], depths=2, samples=2, corpus=str(corpus))
    train, valid, _ = task.filler_streams()
    assert task.vocab_size == 261 and (task.key_id, task.query_id) == (259, 260)
    assert task.tokens["7"] == ord("7") and task.tokens["<eos>"] == 257
    stream = valid.astype(np.int64)
    for row in task.test_set()[70][0]:  # each test haystack is a contiguous stretch of the validation stream
        starts = np.flatnonzero(stream[: len(stream) - len(row) + 1] == row[0])
        assert any((stream[s : s + len(row)] == row).all() for s in starts)
    assert task.key_id not in train and task.query_id not in valid


def test_seeds_are_reproducible():
    task = make_task("passkey", **SMALL)
    a, b, c = (task.train_batch(16, rng_of(seed)) for seed in (7, 7, 8))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.labels, b.labels) and not torch.equal(a.ids, c.ids)
    one, two = task.test_set(), task.test_set()
    for n in task.test_lengths:
        assert all(np.array_equal(x, y) for x, y in zip(one[n], two[n]))
    # a length's test sequences do not depend on the other lengths tested; another test_seed changes them
    alone = make_task("passkey", **{**SMALL, "test_lengths": [64]}).test_set()
    assert all(np.array_equal(x, y) for x, y in zip(alone[64], one[64]))
    other = make_task("passkey", **{**SMALL, "test_seed": 5}).test_set()
    assert not np.array_equal(other[64][0], one[64][0])


@pytest.mark.parametrize("preset", ["transformer", "hybrid"])
def test_chunked_scoring_gives_the_parallel_logits(preset):
    task = make_task("passkey", **SMALL)
    model = tiny_model(task, preset, **({"window": 8} if preset == "hybrid" else {}))
    ids = task.cell_batch(task.test_set(), 97).ids[:4]
    with torch.no_grad():
        full, _ = model(ids)
    for chunk in (7, 32, 97, 200):  # chunk edges before, inside and after the answer
        torch.testing.assert_close(answer_logits(model, ids, task.k, chunk), full[:, -task.k :], rtol=1e-4, atol=1e-5)


def test_task_json_round_trips(tmp_path):
    task = make_task("passkey", **SMALL)
    model = tiny_model(task)
    direct = score_passkey(model, task, chunk_size=16)
    path = tmp_path / "task.json"
    path.write_text(json.dumps(task.to_json()))
    again = score_task_json(model, path, chunk_size=16)
    assert again == direct
    assert set(direct["accuracy"]) == {"40", "64", "97"}
    grid = direct["passkey"]
    assert len(grid["exact"]) == 3 and all(len(row) == 5 for row in grid["exact"])
    assert direct["accuracy"]["64"] == pytest.approx(np.mean(grid["exact"][1]))
    spec = json.loads(path.read_text())
    spec["test_set"]["sha256"] = "0" * 64
    with pytest.raises(ValueError, match=r"task.json: expected test sequences with sha256 0{64}"):
        score_task_json(model, spec)


def test_text_task_json_holds_its_sequences(tmp_path, corpus, monkeypatch):
    """The text filler's task.json carries its haystacks: it scores the same after the corpus is gone."""
    task = make_task("passkey-text", train_length=40, test_lengths=[40, 70], depths=3, samples=2, corpus=str(corpus))
    model = tiny_model(task)
    direct = score_passkey(model, task)
    spec = json.loads(json.dumps(task.to_json()))
    shutil.rmtree(corpus)
    monkeypatch.setenv("HYBRID_CACHE", str(tmp_path / "another-cache"))  # no stream prepared before is reused
    assert score_task_json(model, spec) == direct


def test_yarn_reads_longer_sequences_with_a_scaled_copy():
    assert yarn_scaling(256, 256) is None
    assert yarn_scaling(1024, 256) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    task = make_task("passkey", **{**SMALL, "test_lengths": [40, 97]})
    model = tiny_model(task)
    plain, yarn = score_passkey(model, task), score_passkey(model, task, rope_scaling="yarn")
    assert yarn["test_loss"]["40"] == plain["test_loss"]["40"]  # at the training length: the same model
    assert yarn["test_loss"]["97"] != plain["test_loss"]["97"]
    assert model.config.rope_scaling is None  # the model itself is untouched


def test_a_staged_curriculum_gives_each_length_an_equal_run_of_steps():
    task = make_task("passkey", **{**SMALL, "train_length": 97, "curriculum_length": [16, 40, 64]})
    assert [task.curriculum_stage(i, 9) for i in range(9)] == [16] * 3 + [40] * 3 + [64] * 3
    # 10 steps over 3 stages: stage ⌊i·3/10⌋, so 4, 3, 3 (never a stage of length 0 or a step past the last)
    assert [task.curriculum_stage(i, 10) for i in range(10)] == [16] * 4 + [40] * 3 + [64] * 3
    assert [task.curriculum_stage(i, 2) for i in range(2)] == [16, 40]  # fewer steps than stages: the first ones
    for i, length in ((0, 16), (5, 40), (8, 64)):
        batch = task.curriculum_batch(3, rng_of(i), step=i, steps=9)
        assert batch.ids.shape == (3, length)
        assert torch.equal(batch.ids, task.sample(length, 3, rng_of(i)).ids)  # the ordinary sample at that length
    assert task.curriculum_length == 16 and task.params()["curriculum_length"] == [16, 40, 64]
    assert make_task("passkey", **task.params()).curriculum_lengths == (16, 40, 64)  # task.json rebuilds it
    one = make_task("passkey", **SMALL)
    assert one.curriculum_lengths == (12,) and one.params()["curriculum_length"] == 12  # a quarter of 40, at least 12
    assert one.curriculum_batch(2, rng_of(0), step=5, steps=6).ids.shape == (2, 12)


def _key_positions(task, batch) -> np.ndarray:
    """(n,) the key marker's position in each sequence (the filler holds no marker)."""
    assert ((batch.ids == task.key_id).sum(1) == 1).all()
    return (batch.ids == task.key_id).int().argmax(1).numpy()


def test_edge_share_puts_that_share_of_training_keys_at_the_edges():
    k = 5
    plain = make_task("passkey", **SMALL)
    F_ = plain.filler_count(40)  # 29
    # without it, a training batch is drawn exactly as before the option existed: filler, keys, then p uniform
    rng = rng_of(7)
    filler = rng.choice(plain.filler_ids, size=(6, F_))
    keys = rng.integers(0, 10, size=(6, k))
    positions = rng.integers(0, F_ + 1, size=6)
    assert torch.equal(plain.train_batch(6, rng_of(7)).ids, plain.build(filler, keys, positions).ids)
    assert "edge_share" not in plain.params()

    always = make_task("passkey", **SMALL, edge_share=1.0)
    p = _key_positions(always, always.train_batch(2000, rng_of(1)))
    band = set(range(k + 1)) | set(range(F_ - k, F_ + 1))
    assert set(p.tolist()) == band  # every position of both bands, nothing else
    assert abs((p <= k).mean() - 0.5) < 0.05  # either edge half the time (1000 ± 22 of 2000)

    share = 0.25
    some = make_task("passkey", **SMALL, edge_share=share)
    p = _key_positions(some, some.train_batch(4000, rng_of(2)))
    expected = share + (1 - share) * len(band) / (F_ + 1)  # the edge draws, plus uniform draws that land there
    assert abs(np.isin(p, list(band)).mean() - expected) < 0.03  # 4 σ of 4000 draws
    # the curriculum's sequences (here 40 tokens before 97) take their edges from their own length
    staged = make_task("passkey", **{**SMALL, "train_length": 97, "curriculum_length": 40, "edge_share": 1.0})
    assert set(_key_positions(staged, staged.curriculum_batch(1000, rng_of(3))).tolist()) == band

    assert some.params()["edge_share"] == share and make_task("passkey", **some.params()).edge_share == share
    assert "a share 0.25 with p uniform over 0 … k or F − k … F" in some.describe()["train"]
    # the test set does not depend on it
    assert torch.equal(some.cell_batch(some.test_set(), 64).ids, plain.cell_batch(plain.test_set(), 64).ids)


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("passkey", dict(key_digits=0), r"key_digits: expected an int >= 1 and <= 32, got 0"),
        ("passkey", dict(train_length=11), r"train_length: expected an int >= 12 \(2·key_digits \+ 2\), got 11"),
        ("passkey", dict(test_lengths=[]), r"test_lengths: expected a non-empty list"),
        ("passkey", dict(test_lengths=[64, 64]), r"test_lengths: expected distinct lengths"),
        ("passkey", dict(depths=[0.5, 1.5]), r"depths: expected a count >= 1 or numbers in \[0, 1\]"),
        ("passkey", dict(depths=0), r"depths: expected a count >= 1"),
        ("passkey", dict(depths=["x"]), r"depths: expected a count >= 1 or numbers in \[0, 1\], got \['x'\]"),
        ("passkey", dict(samples=0), r"samples: expected a positive int, got 0"),
        ("passkey", dict(train_length=40, curriculum_length=41),
         r"curriculum_length: expected an int in \[12, train_length=40\]"),
        ("passkey", dict(train_length=40, curriculum_length=[12, 41]),
         r"curriculum_length: expected an int in \[12, train_length=40\] or a list of increasing ones, got 41"),
        ("passkey", dict(train_length=40, curriculum_length=[24, 24]),
         r"curriculum_length: expected .* a list of increasing ones, got \[24, 24\]"),
        ("passkey", dict(train_length=40, curriculum_length=[]), r"curriculum_length: expected .*, got \[\]"),
        ("passkey", dict(corpus="x"), r"corpus: only the text filler"),
        ("passkey", dict(edge_share=1.5), r"edge_share: expected a share in \[0, 1\], got 1.5"),
        ("passkey", dict(edge_share=True), r"edge_share: expected a share in \[0, 1\], got True"),
        ("passkey-text", dict(filler_vocab=8), r"filler_vocab: the text filler takes its tokens from the corpus"),
    ],
)
def test_bad_parameters(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_task(name, **params)


def test_heatmap_is_written(tmp_path):
    path = plot_heatmap(tmp_path / "h.png", [256, 512], [0.0, 0.5, 1.0], [[1.0, 0.5, 0.0], [0.2, float("nan"), 1.0]],
                        title="t")
    assert path.read_bytes()[:8] == PNG_MAGIC
