"""Tokenizers: byte-level by default, or a local `tokenizer.json` through the `tokenizers` library.

Both share one interface::

    encode(text) -> list[int]            decode(ids, skip_special=True) -> str
    encode_batch(texts) -> list[list[int]]
    vocab_size, bos_id, eos_id, pad_id, document_start, name, fingerprint
    to_dict() -> dict                    tokenizer_from_dict(d) -> Tokenizer

`encode` is for prompts, `encode_batch` for a corpus's documents. They differ in one case: a file tokenizer
reads the spelling of a special token in a prompt (`<|endoftext|>`) as that token, as transformers does, but
in a document as the text it is, so that a document quoting it is not cut in two by an end-of-text it never had.

`document_start` is the ids a prompt is put after: `[eos]` for the runs this library trains (its training
streams are `[eos] doc [eos] doc …`), and for a model imported from transformers what its own tokenizer puts in
front (`<s>` for Llama and Mistral, nothing for Qwen2; `FileTokenizer(document_start=...)`).

`to_dict()` is what a run directory records (JSON-serialisable); `tokenizer_from_dict` rebuilds the same
tokenizer and refuses a tokenizer file whose content changed since it was recorded. `fingerprint` names the
exact token mapping; the data cache is keyed by it.

Byte tokenizer: ids 0..255 are the UTF-8 bytes, then `<bos>` = 256, `<eos>` = 257, `<pad>` = 258, so
`vocab_size` is 259 (the true count; a model may round its embedding up with `round_vocab_size`). Text is
encoded with `errors="surrogateescape"`, so strings decoded from arbitrary bytes with that handler round-trip
exactly; `decode_bytes` inverts `encode_bytes` for every byte sequence.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Protocol, runtime_checkable

__all__ = [
    "Tokenizer",
    "ByteTokenizer",
    "FileTokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
    "round_vocab_size",
    "byte_alphabet",
]


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline, trainer and generation rely on."""

    name: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    document_start: list[int]

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The token ids of each document, special-token spellings in it encoded as ordinary text."""
        ...

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    def to_dict(self) -> dict: ...


def byte_alphabet() -> list[str]:
    """The printable character standing for each byte 0..255: bytes that are printable Latin-1 characters stand
    for themselves, the others take the code points 256, 257, … in byte order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def round_vocab_size(n: int, multiple: int = 64) -> int:
    """`n` rounded up to a multiple of `multiple` (embedding / LM-head sizes that suit matmul kernels)."""
    if n < 1 or multiple < 1:
        raise ValueError(f"round_vocab_size: expected n >= 1 and multiple >= 1, got n={n}, multiple={multiple}")
    return -(-n // multiple) * multiple


class ByteTokenizer:
    """UTF-8 bytes as tokens (0..255) plus `<bos>`, `<eos>`, `<pad>`; needs no files."""

    name = "bytes"
    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259
    specials = {256: "<bos>", 257: "<eos>", 258: "<pad>"}
    document_start = [eos_id]

    def encode_bytes(self, data: bytes) -> list[int]:
        return list(data)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids`, specials dropped."""
        ids = [int(i) for i in ids]
        self._check(ids)
        return bytes(i for i in ids if i < 256)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", errors="surrogateescape"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int], skip_special: bool = True, errors: str = "replace") -> str:
        """Text of `ids`. Specials are dropped, or shown as `<eos>`-style markers with `skip_special=False`;
        invalid UTF-8 becomes U+FFFD (`errors="surrogateescape"` inverts `encode` exactly instead)."""
        ids = [int(i) for i in ids]
        self._check(ids)
        if skip_special:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors=errors)
        out, run = [], bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
            else:
                out.append(run.decode("utf-8", errors=errors))
                out.append(self.specials[i])
                run = bytearray()
        out.append(run.decode("utf-8", errors=errors))
        return "".join(out)

    def _check(self, ids: list[int]) -> None:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: expected token ids in [0, {self.vocab_size}) ({self.name}), got {bad[:5]}")

    @property
    def fingerprint(self) -> str:
        return "bytes-v1"

    def to_dict(self) -> dict:
        return {"kind": "bytes"}

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"


# Candidate spellings of the special tokens in common tokenizer.json files, most specific first.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FileTokenizer:
    """A `tokenizers` tokenizer read from a local `tokenizer.json` (a file, or a directory holding one).

    `eos` is the first of the usual end-of-text spellings the vocabulary has (or `eos_token=`); without one,
    `<eos>` is added as a special token (deterministically, so the same file always gives the same ids).
    `bos` and `pad` fall back to `eos` when the vocabulary has no such token. `document_start`: the tokens a
    prompt is put after (default: `[eos]`, this library's; an import records its source's, maybe none).
    """

    def __init__(self, path: str | os.PathLike, *, eos_token: str | None = None, sha256: str | None = None,
                 document_start: list[str] | None = None):
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError as e:  # pragma: no cover - tokenizers is a test dependency
            raise ImportError("a tokenizer.json needs the `tokenizers` package: pip install 'hybrid-lm[tokenizers]' (or tokenizers)") from e
        self.path = _resolve_tokenizer_file(path)
        self.sha256 = _sha256(self.path)
        if sha256 is not None and sha256 != self.sha256:
            raise ValueError(
                f"tokenizer file {self.path} changed since it was recorded "
                f"(sha256 {self.sha256[:12]}…, recorded {sha256[:12]}…); the token ids would not match"
            )
        try:
            self._tok = _HFTokenizer.from_file(str(self.path))
        except Exception as e:  # tokenizers raises a bare Exception for malformed JSON or an unknown model
            raise ValueError(f"tokenizer: expected a tokenizer.json that `tokenizers` reads, got {self.path} "
                             f"({e})") from None
        self.eos_token = eos_token
        eos = self._find([eos_token] if eos_token else _EOS_NAMES)
        if eos is None:
            if eos_token:
                raise ValueError(f"eos_token {eos_token!r} is not in the vocabulary of {self.path}")
            self._tok.add_special_tokens(["<eos>"])
            eos = self._tok.token_to_id("<eos>")
        self.eos_id = eos
        bos, pad = self._find(_BOS_NAMES), self._find(_PAD_NAMES)
        self.bos_id = eos if bos is None else bos
        self.pad_id = eos if pad is None else pad
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.name = f"file:{self.path.name}@{self.sha256[:12]}"
        self.document_start_tokens = document_start  # None: this library's [eos]
        self.document_start = [self.eos_id] if document_start is None else self._ids_of(document_start)

    def _ids_of(self, tokens: list[str]) -> list[int]:
        """The ids of ``document_start``'s tokens, each in the vocabulary."""
        if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"document_start: expected a list of token strings, got {tokens!r}")
        ids = [self._tok.token_to_id(t) for t in tokens]
        missing = [t for t, i in zip(tokens, ids) if i is None]
        if missing:
            raise ValueError(f"document_start: expected tokens of the vocabulary of {self.path}, got {missing}")
        return ids

    def _find(self, names) -> int | None:
        for n in names:
            i = self._tok.token_to_id(n)
            if i is not None:
                return i
        return None

    def encode(self, text: str) -> list[int]:
        """A prompt's ids: a special token's spelling in it becomes that token, as in transformers."""
        return self._tok.encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def _text_only(self):
        """A copy of the tokenizer that reads special tokens' spellings as ordinary text."""
        copy = type(self._tok).from_str(self._tok.to_str())
        copy.encode_special_tokens = True
        return copy

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Documents' ids: a special token's spelling in a document is encoded as the text it is."""
        return [e.ids for e in self._text_only.encode_batch(list(texts), add_special_tokens=False)]

    def text_bytes(self, ids: Iterable[int]) -> int | None:
        """The UTF-8 bytes of the text that the tokens ``ids`` encode, counted exactly where the tokenizer allows it:
        a byte-level BPE (its decoder ``ByteLevel``), whose tokens are each a string of bytes, one character a byte
        (an added token: its literal text). None for any other tokenizer."""
        from tokenizers import decoders

        if not isinstance(self._tok.decoder, decoders.ByteLevel):
            return None
        added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        return sum(len(added[i].encode("utf-8")) if i in added else len(self._tok.id_to_token(i))
                   for i in map(int, ids))

    def token_ends(self, text: str) -> list[int]:
        """Where each token of the document ``text`` (``encode_batch([text])[0]``) ends in ``text`` (a character
        index, from the tokenizer's offsets): ``text[:ends[n - 1]]`` is the text of the first n tokens, whatever
        the decoder would make of them."""
        return [end for _, end in self._text_only.encode(text, add_special_tokens=False).offsets]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: expected token ids in [0, {self.vocab_size}) ({self.name}), got {bad[:5]}")
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    @property
    def fingerprint(self) -> str:
        return f"tokenizers-{self.sha256}-{self.eos_id}-{self.vocab_size}"

    def to_dict(self) -> dict:
        record = {"kind": "tokenizers", "path": str(self.path), "sha256": self.sha256, "eos_token": self.eos_token}
        if self.document_start_tokens is not None:
            record["document_start"] = list(self.document_start_tokens)
        return record

    def __repr__(self) -> str:
        return f"FileTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _resolve_tokenizer_file(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return (p / "tokenizer.json").resolve()
        raise FileNotFoundError(
            f"tokenizer directory {p} has no tokenizer.json (only `tokenizers` files are supported; "
            f"`transformers` tokenizers without a tokenizer.json are not)"
        )
    if p.is_file():
        return p.resolve()
    raise FileNotFoundError(f"tokenizer not found: {p} (expected a tokenizer.json file or a directory with one)")


def load_tokenizer(spec: str | os.PathLike | None = None, **kwargs) -> Tokenizer:
    """`None`, `"bytes"` or `"byte"` → `ByteTokenizer`; otherwise a path to a tokenizer.json (or its directory)."""
    if spec is None or str(spec) in ("bytes", "byte"):
        return ByteTokenizer()
    return FileTokenizer(spec, **kwargs)


def tokenizer_from_dict(d: dict | str) -> Tokenizer:
    """Rebuild the tokenizer that `to_dict()` (or its JSON text) describes."""
    if isinstance(d, str):
        d = json.loads(d)
    kind = d.get("kind")
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "tokenizers":
        return FileTokenizer(d["path"], eos_token=d.get("eos_token"), sha256=d.get("sha256"),
                             document_start=d.get("document_start"))
    raise ValueError(f"tokenizer_from_dict: unknown kind {kind!r} (expected 'bytes' or 'tokenizers')")
