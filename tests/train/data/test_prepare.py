"""hybrid.train.data.prepare: documents read, split and streamed, the token cache, text columns, PreparedData's
bits per byte and loaders."""
import hashlib
import json
import math
import os

import numpy as np
import pytest

from hybrid.train.data import prepare_data
from hybrid.train.data.prepare import _document_split_fits
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


def _hash_fraction(text: str) -> float:
    """Where a document falls in [0, 1): blake2b-64 of its UTF-8 text, little-endian, over 2**64 (the module's
    rule, computed here on its own)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64


def _equal_documents(root, n: int, valid_fraction: float) -> dict:
    """`n` documents of 100 bytes each in `root`, none of which hashes below `valid_fraction` (a salt searched)."""
    for salt in range(1000):
        texts = {f"d{i:02d}.txt": f"document {i:02d} salt {salt:04d} ".ljust(100, "x") for i in range(n)}
        if min(map(_hash_fraction, texts.values())) >= valid_fraction:
            break
    root.mkdir()
    for name, text in texts.items():
        (root / name).write_text(text)
    return texts


def test_split_is_deterministic_with_at_least_one_validation_document(tmp_path):
    """No hash falls below valid_fraction: the document with the smallest one is held out, as its share of the
    tokens (1/20 at 0.05) is sensible."""
    texts = _equal_documents(tmp_path / "docs", 20, 0.05)
    a = prepare_data(tmp_path / "docs", cache_dir=tmp_path / "a", valid_fraction=0.05)
    b = prepare_data(tmp_path / "docs", cache_dir=tmp_path / "b", valid_fraction=0.05)
    assert a.stats["split"] == "documents" and "split by tokens" not in a.stats["source"]
    assert a.stats["valid_documents"] == 1 and a.stats["train_documents"] == len(texts) - 1
    assert _docs_of(a.valid, ByteTokenizer()) == [min(texts.values(), key=_hash_fraction)]
    np.testing.assert_array_equal(a.valid, b.valid)
    np.testing.assert_array_equal(a.train, b.train)


def _token_split_expected(texts: list[str], valid_fraction: float) -> tuple[int, int, int]:
    """(validation tokens, validation bytes, validation documents) of the token split of `texts` in this order,
    byte tokens: each document is its bytes then one eos; the last max(2, round(n · fraction)) are held out, after
    the stream's leading eos."""
    stream = [b for t in texts for b in [*t.encode(), None]]  # None: the eos
    n_valid = max(2, int(round(len(stream) * valid_fraction)))
    tail = stream[-n_valid:]
    return 1 + n_valid, sum(b is not None for b in tail), tail.count(None)  # a suffix: each document's eos in it


@pytest.mark.parametrize("trial", range(6))
def test_a_document_split_far_from_the_fraction_falls_back_to_the_token_split(tmp_path, trial):
    """The issue: a 108 KB book and two one-line files, --valid-fraction 0.05: the book went to validation whole
    (training kept 27 tokens) or validation held 11 tokens. Any document split is then far from 5 % of the tokens,
    so the last 5 % of the tokens are held out, and the data line says why."""
    root = tmp_path / "few"
    root.mkdir()
    files = {"LICENSE.txt": f"license text {trial}\n", "README.txt": f"readme {trial}\n",
             "book.txt": f"chapter {trial} " + "lorem ipsum dolor sit amet " * 4000 + "\n"}
    for name, text in files.items():
        (root / name).write_text(text)
    data = prepare_data(root, cache_dir=tmp_path / "c", valid_fraction=0.05)
    s, tok = data.stats, ByteTokenizer()
    valid_tokens, valid_bytes, valid_docs = _token_split_expected(list(files.values()), 0.05)  # sorted by name
    assert s["split"] == "tokens" and (s["valid_tokens"], s["valid_bytes"], s["valid_documents"]) == (
        valid_tokens, valid_bytes, valid_docs)
    assert s["train_tokens"] + s["valid_tokens"] == sum(len(t) + 1 for t in files.values()) + 2
    assert s["train_bytes"] + s["valid_bytes"] == sum(len(t) for t in files.values())
    assert s["train_documents"] == 3 and len(data.valid) == valid_tokens == 5403
    assert tok.decode(data.train.tolist()) + tok.decode(data.valid.tolist()) == "".join(files.values())
    fractions = [_hash_fraction(t) for t in files.values()]
    held = [f < 0.05 for f in fractions] if min(fractions) < 0.05 else [f == min(fractions) for f in fractions]
    share = sum(len(t) + 1 for t, h in zip(files.values(), held) if h) / sum(len(t) + 1 for t in files.values())
    assert not all(held) and not 0.025 <= share <= 0.1  # what the hash rule would hold out, unfit
    assert s["source"].endswith(f", split by tokens: whole documents would put {share:.1%} of the tokens in validation "
                                f"(valid_fraction 0.05)")
    again = prepare_data(root, cache_dir=tmp_path / "c2", valid_fraction=0.05)
    np.testing.assert_array_equal(again.train, data.train)
    np.testing.assert_array_equal(again.valid, data.valid)


def test_a_tiny_fraction_holds_out_tokens_not_a_whole_document(tmp_path):
    """valid_fraction 1e-9: one whole document (5 % of the tokens) is 50 million times too much; two tokens are
    held out instead."""
    texts = _equal_documents(tmp_path / "docs", 20, 1e-9)
    data = prepare_data(tmp_path / "docs", cache_dir=tmp_path / "c", valid_fraction=1e-9)
    assert data.stats["split"] == "tokens" and data.stats["valid_tokens"] == 3 and data.stats["valid_bytes"] == 1
    assert "whole documents would put 5.0% of the tokens in validation (valid_fraction 1e-09)" in data.stats["source"]
    assert ByteTokenizer().decode(data.valid.tolist()) == sorted(texts.items())[-1][1][-1]


def _tokenizer_file(path, kind: str, corpus: str):
    """A tokenizer.json trained offline on ``corpus``: a byte-level BPE without merges (every token one byte) or a
    WordPiece, whose decoder does not give the text back (it joins words with single spaces)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "bytes-bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=257, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]", "[SEP]"])
    tok.train_from_iterator([corpus], trainer)
    tok.save(str(path))
    return tok


def test_a_token_split_counts_the_bytes_of_the_text_it_holds_out(tmp_path):
    """One document cut by tokens under a file tokenizer: the validation bytes are those of the text after the
    cut, not of what the decoder makes of its tokens. A cut inside a 4-byte character decoded as U+FFFD (3 bytes
    an orphan byte: 25 bytes for 19); a WordPiece decoder collapses the whitespace (a third short)."""
    from hybrid.train.data.tokenizer import FileTokenizer

    clef = "\N{MUSICAL SYMBOL G CLEF}" * 100  # 400 bytes, one token a byte: the cut falls inside a character
    (tmp_path / "clef").mkdir()
    (tmp_path / "clef" / "one.txt").write_text(clef)
    _tokenizer_file(tmp_path / "bpe.json", "bytes-bpe", "hello")
    tok = FileTokenizer(tmp_path / "bpe.json")
    data = prepare_data(tmp_path / "clef", tokenizer=tok, cache_dir=tmp_path / "c")
    held_out = data.valid[1:-1]  # the text's tokens after the cut: [eos] … [eos]
    assert data.stats["split"] == "tokens" and len(held_out) % 4 != 0
    assert data.valid_bytes == len(held_out) and data.stats["train_bytes"] + data.valid_bytes == 400

    code = "def f(x):\n        return x    +   1\n\n\n" * 200
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "code.txt").write_text(code)
    wordpiece = _tokenizer_file(tmp_path / "wp.json", "wordpiece", code)
    data = prepare_data(tmp_path / "code", tokenizer=FileTokenizer(tmp_path / "wp.json"), cache_dir=tmp_path / "c")
    encoding = wordpiece.encode(code)
    head = len(encoding.ids) - (len(data.valid) - 2)  # the text's tokens that training holds
    want = len(code[encoding.offsets[head - 1][1]:].encode())  # the text after the last of them
    assert data.stats["split"] == "tokens" and data.valid_bytes == want
    assert data.stats["train_bytes"] + data.valid_bytes == len(code.encode())


@pytest.mark.parametrize("lens, mask, fraction, fits", [
    ([10, 90], [True, False], 0.05, True),  # 10 % = twice 5 %: the bound is kept
    ([10, 90], [True, False], 0.049, False),  # just over twice
    ([5, 95], [True, False], 0.1, True),  # 5 % = half of 10 %
    ([5, 95], [True, False], 0.101, False),
    ([50, 50], [True, False], 0.3, True),
    ([60, 40], [True, False], 0.8, False),  # validation 60 % is within [40 %, 160 %], training 40 % is twice 20 %
    ([70, 30], [True, False], 0.8, True),
    ([20, 80], [True, False], 0.8, False),  # validation 20 % is a quarter of 80 %
])
def test_the_document_split_is_kept_within_a_factor_of_two_on_both_sides(lens, mask, fraction, fits):
    ok, share = _document_split_fits(np.asarray(mask), np.asarray(lens), fraction)
    assert ok is fits and share == lens[0] / sum(lens)


def test_an_unreadable_cache_file_is_deleted_and_tokenised_again(corpus_dir, tmp_path, capsys):
    """The issue: a truncated cache file gave `Expected to be able to read 209336 bytes for message body, got
    104236`, naming no file, on every run until the user found the cache."""
    root, _ = corpus_dir
    first = prepare_data(root, cache_dir=tmp_path / "c")
    cache_file = first.stats["cache_file"]
    size = os.path.getsize(cache_file)
    for damaged in (size // 2, 0, 100):
        os.truncate(cache_file, damaged)
        capsys.readouterr()
        CountingTokenizer.calls = 0
        again = prepare_data(root, tokenizer=CountingTokenizer(), cache_dir=tmp_path / "c")
        assert CountingTokenizer.calls > 0 and not again.stats["cache_hit"] and os.path.getsize(cache_file) == size
        np.testing.assert_array_equal(again.train, first.train)
        np.testing.assert_array_equal(again.valid, first.valid)
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
        assert len(notes) == 1 and notes[0].startswith(f"note: the token cache file {cache_file} could not be read (")
        assert notes[0].endswith("); deleted it, tokenising again")
    assert prepare_data(root, cache_dir=tmp_path / "c").stats["cache_hit"]


def test_an_edit_that_keeps_the_mtime_is_read(corpus_dir, tmp_path):
    """The issue: `datasets` keys its own cache of a local file on path and mtime only, so a file rewritten with its
    mtime kept (cp -p, rsync -a, tar) was read as its old text, although the token cache's key (path, size, mtime)
    changed and it missed."""
    root, texts = corpus_dir
    prepare_data(root, cache_dir=tmp_path / "c")
    victim = root / "doc03.txt"
    st = victim.stat()
    victim.write_text("an edited document, longer than it was " * 20)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    data = prepare_data(root, cache_dir=tmp_path / "c")
    assert not data.stats["cache_hit"]
    docs = _docs_of(data.train, ByteTokenizer()) + _docs_of(data.valid, ByteTokenizer())
    assert sorted(docs) == sorted({**texts, "doc03.txt": victim.read_text()}.values())


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
