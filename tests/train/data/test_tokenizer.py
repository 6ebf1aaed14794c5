"""Tokenizers: the byte tokenizer's exact round trips, and local tokenizer.json files."""
import json
import random

import pytest

from hybrid.train.data import prepare_data
from hybrid.train.data.tokenizer import (
    ByteTokenizer,
    FileTokenizer,
    Tokenizer,
    load_tokenizer,
    round_vocab_size,
    tokenizer_from_dict,
)


def test_byte_tokenizer_inverts_every_byte():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (259, 256, 257, 258)
    every = bytes(range(256))
    assert tok.encode_bytes(every) == list(range(256))
    assert tok.decode_bytes(tok.encode_bytes(every)) == every
    text = every.decode("utf-8", errors="surrogateescape")  # invalid UTF-8 kept as lone surrogates
    assert tok.encode(text) == list(range(256))
    assert tok.decode(tok.encode(text), errors="surrogateescape") == text


def test_byte_tokenizer_round_trips_unicode_text():
    rng = random.Random(0)
    tok = ByteTokenizer()
    pool = "aZ09 \n\t\"'\\{}ßéλжש中文🙂\u200d\x00\x7f"
    for _ in range(50):
        s = "".join(rng.choice(pool) for _ in range(rng.randrange(0, 40)))
        ids = tok.encode(s)
        assert all(0 <= i < 256 for i in ids) and len(ids) == len(s.encode())
        assert tok.decode(ids) == s
    assert tok.encode_batch(["ab", ""]) == [[97, 98], []]


def test_byte_tokenizer_specials_and_bad_ids():
    tok = ByteTokenizer()
    ids = [tok.bos_id, *tok.encode("hi"), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special=False) == "<bos>hi<eos><pad>"
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a cut-off character does not raise
    with pytest.raises(ValueError, match="259"):
        tok.decode([259])
    with pytest.raises(ValueError):
        tok.decode([-1])


def test_byte_tokenizer_dict_round_trip():
    d = ByteTokenizer().to_dict()
    assert json.loads(json.dumps(d)) == d == {"kind": "bytes"}
    assert isinstance(tokenizer_from_dict(d), ByteTokenizer)
    assert isinstance(tokenizer_from_dict(json.dumps(d)), ByteTokenizer)
    assert isinstance(load_tokenizer(None), ByteTokenizer) and isinstance(load_tokenizer("bytes"), ByteTokenizer)
    assert round_vocab_size(259, 8) == 264 and round_vocab_size(256, 64) == 256


def _train_bpe(tmp_path, specials=("<|endoftext|>",), name="tok"):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = ["the quick brown fox jumps over the lazy dog", "def f(x):\n    return x * 2\n"] * 20
    tok.train_from_iterator(text, trainer=trainer)
    folder = tmp_path / name
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _token_id(folder, token: str) -> int:
    """The id of ``token`` read from the file itself, with the tokenizers library."""
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(token)


def test_file_tokenizer_from_file_and_directory(tmp_path):
    folder = _train_bpe(tmp_path)
    for spec in (folder, folder / "tokenizer.json", str(folder)):
        tok = load_tokenizer(spec)
        assert isinstance(tok, FileTokenizer) and isinstance(tok, Tokenizer)
        assert tok.eos_id == _token_id(folder, "<|endoftext|>") and tok.bos_id == tok.eos_id
        s = "the lazy fox returns x * 2 — ünïcode 🙂"
        assert tok.decode(tok.encode(s)) == s
        assert tok.encode_batch([s, "dog"]) == [tok.encode(s), tok.encode("dog")]
        assert tok.decode([tok.eos_id] + tok.encode("dog")) == "dog"
    rebuilt = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert rebuilt.fingerprint == tok.fingerprint and rebuilt.encode(s) == tok.encode(s)


def test_file_tokenizer_refuses_a_changed_file_and_missing_paths(tmp_path):
    folder = _train_bpe(tmp_path)
    record = load_tokenizer(folder).to_dict()
    path = folder / "tokenizer.json"
    path.write_text(path.read_text().replace('"quick"', '"quack"') + " ")
    with pytest.raises(ValueError, match="changed since it was recorded"):
        tokenizer_from_dict(record)
    with pytest.raises(FileNotFoundError, match="tokenizer not found"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown kind"):
        tokenizer_from_dict({"kind": "sentencepiece"})


def test_file_tokenizer_without_eos_gets_one(tmp_path):
    tok = load_tokenizer(_train_bpe(tmp_path, specials=()))
    assert tok.decode([tok.eos_id], skip_special=False) == "<eos>" and tok.vocab_size == tok.eos_id + 1
    assert tok.decode(tok.encode("the dog") + [tok.eos_id]) == "the dog"


def test_prepare_with_a_file_tokenizer(tmp_path, corpus_dir):
    tok = load_tokenizer(_train_bpe(tmp_path))
    data = prepare_data(corpus_dir[0], tokenizer=tok, cache_dir=tmp_path / "c")
    byte_data = prepare_data(corpus_dir[0], cache_dir=tmp_path / "c")
    assert data.stats["fingerprint"] != byte_data.stats["fingerprint"]
    assert data.valid_bytes == byte_data.valid_bytes  # the split does not depend on the tokenizer
    assert data.valid.max() < tok.vocab_size and data.valid[0] == tok.eos_id
    assert data.bytes_per_token > 1.0  # merges: fewer tokens than bytes


def test_a_special_tokens_spelling_is_text_in_a_document_and_the_token_in_a_prompt(tmp_path):
    """A document quoting `<|endoftext|>` keeps it as text, so packing does not start a document inside it;
    a prompt's `<|endoftext|>` is the token, as transformers reads it."""
    tok = load_tokenizer(_train_bpe(tmp_path))
    doc = "the fox wrote <|endoftext|> and the dog"
    (ids,) = tok.encode_batch([doc])
    assert tok.eos_id not in ids and tok.decode(ids) == doc
    assert tok.encode_batch([doc, "dog"])[1] == tok.encode("dog")
    ends = tok.token_ends(doc)
    assert len(ends) == len(ids) and ends[-1] == len(doc)
    assert [tok.decode(ids[:n]) for n in (3, len(ids))] == [doc[:ends[2]], doc]
    assert tok.encode(doc).count(tok.eos_id) == 1


def test_prepare_keeps_a_quoted_special_token_inside_its_document(tmp_path):
    tok = load_tokenizer(_train_bpe(tmp_path))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    for i in range(40):
        (corpus / f"d{i:02d}.txt").write_text(f"document {i} quotes <|endoftext|> once; " * 3)
        (plain / f"d{i:02d}.txt").write_text(f"document {i} quotes <|nothing|> once; " * 3)
    eos_counts = []
    for folder in (corpus, plain):
        data = prepare_data(folder, tokenizer=tok, cache_dir=tmp_path / "c")
        eos_counts.append(int((data.train == tok.eos_id).sum() + (data.valid == tok.eos_id).sum()))
    assert eos_counts[0] == eos_counts[1] >= 40  # the separators alone, none from the quoted spelling
