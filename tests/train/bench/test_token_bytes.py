"""hybrid.train.bench.token_bytes: the bytes each token id stands for, and the bucket figures of window_gain and
quality with a BPE tokenizer against float64 losses over the bytes of each bucket's own targets.

The BPE is byte-level, trained here on text with accents, dashes and emoji, so that some of its tokens hold part
of a UTF-8 character (decoded alone to text they read U+FFFD, three bytes). The reference bytes of a token come
from GPT-2's byte alphabet written out below, checked against the documents' own UTF-8 bytes."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.quality import context_metrics, long_sequences
from hybrid.train.bench.token_bytes import bits_per_byte, target_bytes, token_bytes
from hybrid.train.bench.window_gain import document_blocks, window_metrics
from hybrid.train.data import PreparedData
from hybrid.train.data.tokenizer import ByteTokenizer, FileTokenizer, round_vocab_size

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

tokenizers = pytest.importorskip("tokenizers")

WORDS = ["naïve", "café", "déjà", "vu", "—", "über", "straße", "😀", "日本語", "the", "of", "données",
         "x = 1", "return", "ça", "€5", "jalapeño"]


def documents(n: int, words: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, words)) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> FileTokenizer:
    """A byte-level BPE of 300 ids (the 256 bytes, ``<|endoftext|>``, merges) trained on the documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(documents(40, 30, seed=1), trainer=trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    raw.save(str(path))
    return FileTokenizer(path)


def gpt2_byte_of() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character of each byte → the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2 ** 8):
        if b not in bs:
            bs.append(b)
            cs.append(2 ** 8 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def reference_bytes(tok: FileTokenizer, ids) -> list[bytes]:
    """The bytes of each of ``ids`` by the byte alphabet (the special ``<|endoftext|>``: none)."""
    byte_of = gpt2_byte_of()
    return [b"" if i == tok.eos_id else bytes(byte_of[ch] for ch in tok._tok.id_to_token(i)) for i in ids]


def test_the_byte_tokenizer_counts_a_byte_per_byte_and_none_for_specials():
    table = token_bytes(ByteTokenizer())
    assert table.tolist() == [1] * 256 + [0, 0, 0]
    with pytest.raises(ValueError, match="tokenizer: expected a ByteTokenizer or FileTokenizer, got object"):
        token_bytes(object())


def test_a_byte_level_bpe_counts_the_bytes_of_each_token_even_a_part_of_a_character(bpe):
    table = token_bytes(bpe)
    assert table.shape == (bpe.vocab_size,) and table[bpe.eos_id] == 0
    for text in documents(10, 20, seed=2):
        ids = bpe.encode(text)
        parts = reference_bytes(bpe, ids)
        assert b"".join(parts) == text.encode("utf-8")  # the reference is the text's own bytes
        assert table[ids].tolist() == [len(p) for p in parts]
        assert int(table[ids].sum()) == len(text.encode("utf-8"))
    # tokens that hold part of a character: decoded alone, U+FFFD (3 bytes), not their 1 or 2
    partial = [i for i in range(bpe.vocab_size) if i != bpe.eos_id and "\ufffd" in bpe.decode([i])]
    assert partial
    for i in partial:
        assert table[i] == len(reference_bytes(bpe, [i])[0]) < len(bpe.decode([i]).encode("utf-8"))


def test_the_bytes_of_a_target_and_of_a_slice():
    seqs = torch.tensor([[257, 65, 66, 257, 67], [10, 257, 256, 258, 200]])
    nbytes = target_bytes(ByteTokenizer(), seqs)
    assert nbytes.tolist() == [[1, 1, 0, 1], [0, 0, 0, 1]]
    losses = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
    assert bits_per_byte(losses, nbytes) == pytest.approx((1 + 2 + 3 + 4 + 5 + 6 + 7 + 8) / math.log(2) / 4)
    assert bits_per_byte(losses[1:, :3], nbytes[1:, :3]) is None  # only specials: no bytes, no figure


def _bpe_data(tok: FileTokenizer, texts: list[str]) -> PreparedData:
    stream = []
    for text in texts:
        stream += [tok.eos_id, *tok.encode(text)]
    stream = np.asarray(stream + [tok.eos_id], dtype=np.uint16)
    return PreparedData(train=stream, valid=stream, tokenizer=tok,
                        stats={"valid_bytes": sum(len(t.encode("utf-8")) for t in texts)})


def _model(vocab_size: int) -> HybridLM:
    torch.manual_seed(0)
    return HybridLM(HybridConfig(vocab_size=round_vocab_size(vocab_size), d_model=12, n_heads=2, n_layers=2,
                                 pattern="RA", window=4, init_std=0.5)).eval()


def _own_bpb(losses: torch.Tensor, nbytes: torch.Tensor) -> float:
    return losses.sum().item() / math.log(2) / nbytes.sum().item()


def test_window_buckets_with_a_bpe_charge_each_bucket_its_own_bytes(bpe, direct_losses):
    data = _bpe_data(bpe, documents(6, 40, seed=3))
    model = _model(bpe.vocab_size)
    out = window_metrics(model, data, window=4, seq_len=16, count=12)
    seqs = document_blocks(data.valid, eos=bpe.eos_id, length=16, count=12)
    losses = direct_losses(model, seqs)  # (N, 16), float64
    nbytes = torch.tensor([[len(p) for p in reference_bytes(bpe, row[1:].tolist())] for row in seqs],
                          dtype=torch.float64)
    edges = out["window_edges"]
    assert edges == [0, 1, 2, 4, 8, 16] and out["window_blocks"] == seqs.shape[0]
    split_wide = []
    for (a, b), got in zip(zip(edges[:-1], edges[1:]), out["window_bpb"]):
        assert got == pytest.approx(_own_bpb(losses[:, a:b], nbytes[:, a:b]), rel=1e-9)
        split_wide.append(data.bpb(losses[:, a:b].mean().item()))
    # the whole split's bytes per token, the conversion before: off by more than 1 % in some bucket
    assert max(abs(s / g - 1) for s, g in zip(split_wide, out["window_bpb"])) > 0.01


def test_long_context_figures_with_a_bpe_charge_each_slice_its_own_bytes(bpe, direct_losses):
    L = 8
    data = _bpe_data(bpe, documents(8, 12, seed=4))  # short documents: the long sequences cross their ends
    model = _model(bpe.vocab_size)
    seqs = long_sequences(data.valid, length=4 * L, count=2)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(1, 2, 4))
    losses = direct_losses(model, seqs)  # (2, 4L)
    nbytes = torch.tensor([[len(p) for p in reference_bytes(bpe, row[1:].tolist())] for row in seqs],
                          dtype=torch.float64)
    assert (nbytes == 0).any()  # eos targets inside: no bytes
    for k in (1, 2, 4):
        n = k * L
        assert m[f"bpb_full_{k}x"] == pytest.approx(_own_bpb(losses[:, :n], nbytes[:, :n]), rel=1e-6)
        assert m[f"bpb_full_{k}x_last"] == pytest.approx(_own_bpb(losses[:, n - L:n], nbytes[:, n - L:n]), rel=1e-6)
        assert m[f"bpb_stream_{k}x"] == pytest.approx(_own_bpb(losses[:, :n], nbytes[:, :n]), rel=1e-5)
    edges = m["position_edges"]
    for (a, b), got in zip(zip(edges[:-1], edges[1:]), m["position_bpb"]):
        assert got == pytest.approx(_own_bpb(losses[:, a:b], nbytes[:, a:b]), rel=1e-6)


def test_sentencepiece_style_tokens_count_their_space_and_byte_fallback_one_byte(tmp_path):
    """Not byte-level: a word-start token ``▁a`` stands for " a", a byte-fallback token ``<0xC3>`` for one byte
    (decoded alone it reads U+FFFD)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({"<|endoftext|>": 256, "▁": 257, "a": 258, "▁a": 259, "b": 260, "ab": 261})
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("a", "b")], byte_fallback=True))
    raw.add_special_tokens(["<|endoftext|>"])
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    raw.save(str(tmp_path / "tokenizer.json"))
    tok = FileTokenizer(tmp_path / "tokenizer.json")
    table = token_bytes(tok)
    assert table[vocab["<0xC3>"]] == 1 and "\ufffd" in tok.decode([vocab["<0xC3>"]])
    assert table[vocab["▁a"]] == 2 and table[vocab["ab"]] == 2 and table[vocab["▁"]] == 1
    assert table[tok.eos_id] == 0
    ids = tok.encode("a é ab")
    assert [tok._tok.id_to_token(i) for i in ids] == ["▁a", "▁", "<0xC3>", "<0xA9>", "▁a", "b"]
    assert int(table[ids].sum()) == len(" a é ab".encode("utf-8"))  # the text and the space put in front
