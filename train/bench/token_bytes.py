"""Bits per byte of a slice of targets: its own losses over its own tokens' UTF-8 bytes.

    nbytes = target_bytes(data.tokenizer, seqs)       # (N, T): the bytes each target token stands for
    bpb = bits_per_byte(losses[:, a:b], nbytes[:, a:b])  # Σ loss / ln 2 / Σ bytes, None where no bytes

A bucket of positions holds its own mix of tokens: with a BPE tokenizer the first tokens of a document hold
fewer or more bytes than those deep inside it (2.48 to 2.73 bytes per token in the window buckets of a
1024-token BPE on Python sources, 2.56 over the whole validation split), so the split's bytes per token
(``PreparedData.bpb``, right for the whole split) would put a bucket off by up to a quarter. Each slice is
therefore charged the bytes of its own targets; with the byte tokenizer that is its count of targets less
its ``eos`` targets.

``token_bytes(tokenizer)``, one count per token id (built once per tokenizer), counts as the data pipeline does
(``hybrid.train.data.bpb``): the specials (``eos`` between documents, ``bos``, ``pad``, every special added
token) stand for no bytes; a byte of the byte tokenizer for one. A byte-level BPE's token is read back to its
bytes through the byte alphabet, not decoded to text: a token may hold part of a UTF-8 character, which a
decode to text would show as U+FFFD (3 bytes). For these two the counts add up to the bytes of the text exactly.
Other tokenizers (``tokenizers`` files without a byte-level decoder): a byte-fallback token ``<0xNN>`` is one
byte, any other token the bytes it adds to the decoded text after an ordinary token (the space a word-start token
of WordPiece or SentencePiece stands for included), an estimate, since such decoders add or strip spaces at the
start of a text.
"""
from __future__ import annotations

import json
import re

import numpy as np
import torch

from ..data.bpb import LN2
from ..data.tokenizer import ByteTokenizer, FileTokenizer, Tokenizer, byte_alphabet

__all__ = ["token_bytes", "target_bytes", "bits_per_byte"]

_TABLES: dict[str, np.ndarray] = {}  # tokenizer fingerprint -> its table
_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def token_bytes(tokenizer: Tokenizer) -> np.ndarray:
    """UTF-8 bytes each token id stands for (int64, ``vocab_size`` entries; 0 for the specials), built once per
    tokenizer (keyed by its fingerprint)."""
    if not isinstance(tokenizer, (ByteTokenizer, FileTokenizer)):
        raise ValueError(f"tokenizer: expected a ByteTokenizer or FileTokenizer, got {type(tokenizer).__name__}")
    key = tokenizer.fingerprint
    if key not in _TABLES:
        table = _byte_table(tokenizer) if isinstance(tokenizer, ByteTokenizer) else _file_table(tokenizer)
        table[[tokenizer.eos_id, tokenizer.bos_id, tokenizer.pad_id]] = 0  # never text: the pipeline counts none
        _TABLES[key] = table
    return _TABLES[key]


def target_bytes(tokenizer: Tokenizer, seqs: torch.Tensor) -> torch.Tensor:
    """The bytes of every target of ``seqs`` ``(N, T + 1)``: ``(N, T)`` int64."""
    return torch.from_numpy(token_bytes(tokenizer))[seqs[:, 1:]]


def bits_per_byte(losses: torch.Tensor, nbytes: torch.Tensor) -> float | None:
    """``Σ losses / ln 2 / Σ nbytes`` (losses in nats, the bytes of the same targets); None where the targets hold
    no bytes (only specials, or none at all), a figure that does not exist."""
    total = int(nbytes.sum())
    return None if total == 0 else float(losses.double().sum()) / LN2 / total


def _byte_table(tokenizer: ByteTokenizer) -> np.ndarray:
    """The byte tokenizer: ids 0..255 are one byte each, the specials none."""
    table = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    table[:256] = 1
    return table


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet (``tokenizers.pre_tokenizers.ByteLevel``), character → byte."""
    return {ch: b for b, ch in enumerate(byte_alphabet())}


def _decoders(raw) -> set[str]:
    """The types of the tokenizer's decoder and of every decoder of a ``Sequence``."""
    found, todo = set(), [json.loads(raw.to_str()).get("decoder")]
    while todo:
        d = todo.pop()
        if isinstance(d, dict):
            found.add(d.get("type"))
            todo += d.get("decoders") or []
    return found


def _file_table(tokenizer: FileTokenizer) -> np.ndarray:
    """A ``tokenizers`` tokenizer (``FileTokenizer``): see the module docstring for how each kind of token counts."""
    raw = tokenizer._tok  # the tokenizers.Tokenizer (as hybrid.train.hf.tokenizer reads it)
    kinds = _decoders(raw)
    alphabet = _byte_alphabet() if "ByteLevel" in kinds else {}
    added = raw.get_added_tokens_decoder()  # id -> AddedToken
    table = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    other = []
    for i in range(tokenizer.vocab_size):
        token = raw.id_to_token(i)
        if i in added:  # added tokens are kept as their text, outside the model's alphabet
            table[i] = 0 if added[i].special else len(added[i].content.encode("utf-8"))
        elif token is None:
            table[i] = 0
        elif alphabet and all(ch in alphabet for ch in token):
            table[i] = len(token)  # one character per byte
        elif "ByteFallback" in kinds and _BYTE_FALLBACK.fullmatch(token):
            table[i] = 1
        else:
            other.append(i)
    if other:
        table[other] = _decoded_bytes(raw, other, exclude=set(added))
    return table


def _decoded_bytes(raw, ids: list[int], exclude: set[int]) -> list[int]:
    """The UTF-8 bytes each of ``ids`` adds to the decoded text after an ordinary token (``"a"``'s last), or
    decoded alone where there is none."""
    anchor = [i for i in raw.encode("a", add_special_tokens=False).ids if i not in exclude][-1:]
    size = lambda text: len(text.encode("utf-8", errors="surrogatepass"))  # noqa: E731
    base = size(raw.decode(anchor, skip_special_tokens=False)) if anchor else 0
    texts = raw.decode_batch([anchor + [i] for i in ids], skip_special_tokens=False)
    return [max(0, size(text) - base) for text in texts]
