"""hybrid.train.data.prepare: documents read, split and streamed, the token cache, text columns, PreparedData's
bits per byte and loaders."""
import json
import math
import os

import numpy as np
import pytest

from hybrid.train.data import prepare_data
from hybrid.train.data.tokenizer import ByteTokenizer


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


def test_prepared_data_bpb_and_baseline(corpus_dir, tmp_path):
    data = prepare_data(corpus_dir[0], cache_dir=tmp_path / "c", valid_fraction=0.3)
    tokens_per_byte = (len(data.valid) - 1) / data.valid_bytes
    assert data.bpb(math.log(2)) == pytest.approx(tokens_per_byte)
    base = data.unigram_bpb()
    assert 2.0 < base < 8.0  # a few distinct letters: far below 8 bits, above 0
    x, y = next(data.train_loader(seq_len=16, batch_size=2))
    assert x.shape == (2, 16)
    assert sum(y.numel() for _, y in data.valid_batches(16, 4)) == len(data.valid) - 1


def test_content_digest_names_the_tokens_not_the_folder(corpus_dir, tmp_path):
    """Equal for the same documents read from another folder (another machine's path), different when one
    document changes by a letter: what the bench's records compare before continuing a suite."""
    import shutil

    root, texts = corpus_dir
    here = prepare_data(root, cache_dir=tmp_path / "a")
    copy = tmp_path / "elsewhere"
    shutil.copytree(root, copy)
    assert prepare_data(copy, cache_dir=tmp_path / "b").content_digest == here.content_digest
    (copy / "doc03.txt").write_text(texts["doc03.txt"].replace("document", "Document"), encoding="utf-8")
    changed = prepare_data(copy, cache_dir=tmp_path / "b")
    assert changed.content_digest != here.content_digest and len(changed.train) + len(changed.valid) == len(
        here.train) + len(here.valid)
