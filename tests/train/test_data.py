"""Data: sources, cached tokenisation, document split, batches, bits per byte."""
import json
import math
import os
import threading

import numpy as np
import pytest
import torch

from hybrid.train.data import (
    BatchLoader,
    HubOfflineError,
    eval_batches,
    loss_to_bpb,
    looks_like_hub_name,
    prepare_data,
    resolve_source,
    stdlib_files,
    unigram_bpb,
)
from hybrid.train.tokenizer import ByteTokenizer


class CountingTokenizer(ByteTokenizer):
    calls = 0

    def encode_batch(self, texts):
        type(self).calls += 1
        return super().encode_batch(texts)


def _docs_of(stream, tok):
    """The documents of a `[eos] doc [eos] doc [eos]` stream, as text."""
    assert stream[0] == tok.eos_id and stream[-1] == tok.eos_id
    cuts = np.flatnonzero(stream == tok.eos_id)
    return [tok.decode(stream[a + 1 : b].tolist()) for a, b in zip(cuts[:-1], cuts[1:])]


# ------------------------------------------------------------------------------------------------ sources


def test_stdlib_files_are_found_sorted_and_exclude_site_packages_and_tests():
    files = stdlib_files()
    assert len(files) > 100
    assert files == stdlib_files()
    names = {f.name for f in files}
    assert {"os.py", "json/__init__.py".split("/")[-1], "functools.py"} <= names
    parts = {p for f in files for p in f.parts}
    assert not parts & {"site-packages", "__pycache__", "test", "tests"}
    assert len(stdlib_files(include_tests=True)) > len(files)


def test_default_source_is_stdlib():
    src = resolve_source(None)
    assert src.kind == "stdlib" and src.key == resolve_source("stdlib").key


@pytest.mark.parametrize("path", ["./no/such/dir", "/no/such/file.txt", "~/nope-hybrid", "data/train.txt",
                                  "a/b/c"])
def test_missing_local_path_is_a_clear_error(path):
    with pytest.raises(FileNotFoundError, match="data path not found"):
        resolve_source(path)


def test_hub_name_heuristic():
    assert looks_like_hub_name("roneneldan/TinyStories") and looks_like_hub_name("wikitext")
    for s in ["./x", "/x", "~/x", "a/b/c", "corpus.txt", "x/y.jsonl", ""]:
        assert not looks_like_hub_name(s), s


def _bounded(fn, seconds=60):
    """Run fn in a thread; fail instead of hanging."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"call did not return within {seconds} s"
    return out


def test_hub_dataset_offline_flag_raises_at_once(tmp_path):
    out = _bounded(lambda: prepare_data("someone/some-dataset", cache_dir=tmp_path))
    err = out.get("error")
    assert isinstance(err, HubOfflineError) and isinstance(err, RuntimeError)
    assert "offline" in str(err) and "HF_HUB_OFFLINE" in str(err) and "--data /path/to/texts" in str(err)


def test_unreachable_hub_raises_without_retrying(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused, whatever the network
    out = _bounded(lambda: prepare_data("no-such-user-hybrid/no-such-dataset", cache_dir=tmp_path))
    err = out.get("error")
    assert isinstance(err, HubOfflineError), err
    assert "127.0.0.1:9" in str(err) and "--data" in str(err)


# ---------------------------------------------------------------------------------------------- prepare


def test_prepare_reads_documents_splits_and_streams(corpus_dir, tmp_path):
    root, texts = corpus_dir
    tok = ByteTokenizer()
    data = prepare_data(root, cache_dir=tmp_path / "c", valid_fraction=0.2)
    s = data.stats
    assert s["documents"] == len(texts) == s["train_documents"] + s["valid_documents"]
    assert s["valid_documents"] >= 1 and s["split"] == "documents"
    train_docs, valid_docs = _docs_of(data.train, tok), _docs_of(data.valid, tok)
    assert sorted(train_docs + valid_docs) == sorted(texts.values())  # each document once, whole
    assert not set(train_docs) & set(valid_docs)
    assert s["valid_bytes"] == sum(len(t.encode()) for t in valid_docs) == data.valid_bytes
    assert s["train_bytes"] == sum(len(t.encode()) for t in train_docs)
    # byte tokens: targets are the text bytes plus one eos per document
    assert len(data.valid) - 1 == data.valid_bytes + len(valid_docs)


def test_split_is_deterministic_with_at_least_one_validation_document(corpus_dir, tmp_path):
    root, texts = corpus_dir
    a = prepare_data(root, cache_dir=tmp_path / "a", valid_fraction=1e-9)
    b = prepare_data(root, cache_dir=tmp_path / "b", valid_fraction=1e-9)
    assert a.stats["valid_documents"] == 1 and a.stats["train_documents"] == len(texts) - 1
    np.testing.assert_array_equal(a.valid, b.valid)
    np.testing.assert_array_equal(a.train, b.train)


def test_second_preparation_hits_the_cache(corpus_dir, tmp_path):
    root, _ = corpus_dir
    CountingTokenizer.calls = 0
    first = prepare_data(root, tokenizer=CountingTokenizer(), cache_dir=tmp_path / "c")
    assert CountingTokenizer.calls > 0 and not first.stats["cache_hit"]
    assert os.path.isfile(first.stats["cache_file"])
    CountingTokenizer.calls = 0
    second = prepare_data(root, tokenizer=CountingTokenizer(), cache_dir=tmp_path / "c")
    assert CountingTokenizer.calls == 0 and second.stats["cache_hit"]
    assert second.stats["cache_file"] == first.stats["cache_file"]
    np.testing.assert_array_equal(first.train, second.train)
    np.testing.assert_array_equal(first.valid, second.valid)
    # an edited file is a different corpus
    victim = next(root.glob("*.txt"))
    victim.write_text(victim.read_text() + "more\n")
    third = prepare_data(root, tokenizer=CountingTokenizer(), cache_dir=tmp_path / "c")
    assert CountingTokenizer.calls > 0 and not third.stats["cache_hit"]


def test_cache_dir_defaults_to_env(corpus_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRID_CACHE", str(tmp_path / "from-env"))
    data = prepare_data(corpus_dir[0])
    assert data.stats["cache_file"].startswith(str(tmp_path / "from-env"))


def test_jsonl_text_column_and_single_document(tmp_path):
    rows = [{"body": f"row {i} " + "xyz " * i, "n": i} for i in range(1, 9)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = prepare_data(path, text_column="body", cache_dir=tmp_path / "c")
    assert data.stats["documents"] == 8
    with pytest.raises(ValueError, match="^data: expected a column 'text' in .*rows.jsonl, got the columns \\['body', 'n'\\]; pass --text-column"):
        prepare_data(path, cache_dir=tmp_path / "c2")
    one = tmp_path / "one.txt"
    one.write_text("a single long document. " * 40)
    single = prepare_data(one, cache_dir=tmp_path / "c3", valid_fraction=0.1)
    assert single.stats["split"] == "tokens"
    tok = ByteTokenizer()
    assert tok.decode(single.train[1:].tolist()) + tok.decode(single.valid[1:].tolist()) == one.read_text()
    assert single.valid_bytes == len(single.valid) - 2  # the trailing eos carries no byte


def test_directory_reads_jsonl_as_rows_and_json_as_text(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    (root / "rows.jsonl").write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(5)))
    (root / "package.json").write_text('{"name": "x", "version": "1.0"}')
    (root / "notes.txt").write_text("notes")
    data = prepare_data(root, cache_dir=tmp_path / "c")
    docs = _docs_of(data.train, ByteTokenizer()) + _docs_of(data.valid, ByteTokenizer())
    assert sorted(docs) == sorted([f"row {i}" for i in range(5)] + ['{"name": "x", "version": "1.0"}', "notes"])


def test_bad_valid_fraction(corpus_dir):
    with pytest.raises(ValueError, match="valid_fraction"):
        prepare_data(corpus_dir[0], valid_fraction=0.0)


# ---------------------------------------------------------------------------------------------- batches


def _stream(n=1000, seed=0):
    return np.random.default_rng(seed).integers(0, 259, size=n).astype(np.uint16)


def test_batches_are_shifted_long_tensors():
    stream = np.arange(1000, dtype=np.uint16)
    x, y = next(BatchLoader(stream, seq_len=17, batch_size=4))
    assert x.shape == y.shape == (4, 17) and x.dtype == y.dtype == torch.long
    for row_x, row_y in zip(x, y):
        start = int(row_x[0])
        assert start % 17 == 0  # a block boundary
        assert torch.equal(row_x, torch.arange(start, start + 17))
        assert torch.equal(row_y, torch.arange(start + 1, start + 18))


def test_loader_is_deterministic_and_resumes_exactly_across_epochs():
    stream = _stream()
    ref = BatchLoader(stream, seq_len=10, batch_size=8, seed=3)
    assert ref.batches_per_epoch == 12
    batches = [next(ref) for _ in range(30)]  # crosses two epoch boundaries
    again = BatchLoader(stream, seq_len=10, batch_size=8, seed=3)
    for b in batches[:7]:
        assert torch.equal(next(again)[0], b[0])
    state = json.loads(json.dumps(again.state_dict()))  # plain values
    resumed = BatchLoader(stream, seq_len=10, batch_size=8, seed=0)
    resumed.load_state_dict(state)
    for b in batches[7:]:
        x, y = next(resumed)
        assert torch.equal(x, b[0]) and torch.equal(y, b[1])
    assert not torch.equal(torch.cat([b[0] for b in batches[:12]]), torch.cat([b[0] for b in batches[12:24]]))
    other_seed = BatchLoader(stream, seq_len=10, batch_size=8, seed=4)
    assert not torch.equal(next(other_seed)[0], batches[0][0])


def test_ranks_see_disjoint_blocks():
    stream = np.arange(1001, dtype=np.int64)  # block i starts at token 10*i: the first input names it
    world = 3
    seen = []
    for rank in range(world):
        loader = BatchLoader(stream, seq_len=10, batch_size=4, seed=1, rank=rank, world_size=world)
        blocks = [int(v) // 10 for _ in range(loader.batches_per_epoch) for v in next(loader)[0][:, 0]]
        seen.append(set(blocks))
        assert len(blocks) == len(set(blocks)) == 32
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])


def test_load_state_dict_refuses_a_different_layout():
    a = BatchLoader(_stream(), seq_len=10, batch_size=8)
    b = BatchLoader(_stream(), seq_len=10, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="fewer than"):
        BatchLoader(_stream(50), seq_len=10, batch_size=8)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_eval_batches_cover_every_target_once(world):
    stream = np.arange(1, 108, dtype=np.int64)  # 106 targets: 10 full blocks of 10 and a tail of 6
    targets = []
    for rank in range(world):
        for x, y in eval_batches(stream, seq_len=10, batch_size=3, rank=rank, world_size=world):
            assert torch.equal(x[:, 1:], y[:, :-1])
            targets += y.flatten().tolist()
    assert sorted(targets) == stream[1:].tolist()
    assert len(list(eval_batches(stream, 10, 3, max_batches=2))) == 2


# -------------------------------------------------------------------------------------------------- bpb


def test_loss_to_bpb():
    assert loss_to_bpb(math.log(2), 1.0) == pytest.approx(1.0)
    assert loss_to_bpb(math.log(256), 2.0) == pytest.approx(4.0)


def test_unigram_bpb_matches_a_hand_count():
    train = np.array([9, 0, 0, 1, 1], dtype=np.int64)  # targets 0 0 1 1: p = 0.5 each without smoothing
    valid = np.array([9, 0, 1, 1], dtype=np.int64)
    assert unigram_bpb(train, valid, valid_bytes=3, vocab_size=2, alpha=0.0) == pytest.approx(1.0)
    assert unigram_bpb(train, valid, valid_bytes=6, vocab_size=2, alpha=0.0) == pytest.approx(0.5)


def test_prepared_data_bpb_and_baseline(corpus_dir, tmp_path):
    data = prepare_data(corpus_dir[0], cache_dir=tmp_path / "c", valid_fraction=0.3)
    tokens_per_byte = (len(data.valid) - 1) / data.valid_bytes
    assert data.bpb(math.log(2)) == pytest.approx(tokens_per_byte)
    base = data.unigram_bpb()
    assert 2.0 < base < 8.0  # a few distinct letters: far below 8 bits, above 0
    x, y = next(data.train_loader(seq_len=16, batch_size=2))
    assert x.shape == (2, 16)
    assert sum(y.numel() for _, y in data.valid_batches(16, 4)) == len(data.valid) - 1
