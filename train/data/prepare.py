"""Tokenise documents once (cached by `datasets`), split whole documents (or tokens), and lay out the token streams.

Tokenising is one `Dataset.map` whose output is written to `<cache>/tokens/<fingerprint>.arrow`; the
fingerprint hashes the source key (file paths, sizes and mtimes, or the hub name/split/row count), the
tokenizer's fingerprint and `FORMAT_VERSION`. When that file exists the documents are not even loaded: a
second preparation memory-maps the cached tokens and never calls the tokenizer. A cache file that cannot be read
(truncated, overwritten) is deleted with a one-line note naming it, and the corpus is tokenised again.

Per document the cache holds its token ids with `eos` appended, its UTF-8 byte count and a 64-bit
hash of its text. A document is in validation when `hash / 2**64 < valid_fraction` (so identical documents
land in the same split, and the split does not depend on order or on the tokenizer); at least one document
goes to each side. Each split is one stream `[eos] doc₁ [eos] doc₂ [eos] …`: every text token and every
document-ending `eos` is a prediction target exactly once, and `[eos]` is the context a fresh document
starts from (prompt unconditional samples with `[tokenizer.eos_id]`).

A few documents of very different sizes can make that split absurd (a book and two one-line files: the book
alone in validation, or 11 tokens there). So the document split is kept only when each side holds between half
and twice the share of the tokens it is meant to (validation `valid_fraction`, training the rest:
`_document_split_fits`); otherwise, as for a single document, the corpus is split by tokens: the last
`valid_fraction` of all the documents' tokens, in their order, are held out (a document may then be cut in two,
and duplicates may land on both sides). `stats["split"]` says which (`"documents"` / `"tokens"`), and when whole
documents were refused the source description, which the data line shows, says so with their token share. Both
rules depend on the documents only, so the split stays deterministic. The standard-library corpus (731
documents, 3.8 % of the tokens held out at 0.05) keeps its document split.

Cache directory: `cache_dir=`, else `$HYBRID_CACHE`, else `$XDG_CACHE_HOME/hybrid` (`~/.cache/hybrid`).
`datasets`' own builder cache for loaded files lives in `<cache>/datasets/<source key>` (`sources`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from . import bpb as _bpb
from .loader import BatchLoader, eval_batches
from .shards import skipped_rows_text
from .sources import Source, resolve_source

__all__ = ["PreparedData", "prepare_data", "default_cache_dir", "tokenize_documents", "FORMAT_VERSION"]

FORMAT_VERSION = 2  # 2: special-token spellings in documents are text (FileTokenizer.encode_batch)


def default_cache_dir() -> Path:
    """`$HYBRID_CACHE`, else `$XDG_CACHE_HOME/hybrid`, else `~/.cache/hybrid`."""
    if os.environ.get("HYBRID_CACHE"):
        return Path(os.environ["HYBRID_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hybrid"


def _text_hash(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "int32"


def tokenize_documents(docs, tokenizer: Tokenizer, *, cache_file: str | os.PathLike, fingerprint: str,
                       batch_size: int = 256):
    """`docs` (a `text` column) → columns `ids` (tokens + eos), `n_bytes`, `hash`; empty documents dropped.

    Written by `Dataset.map` to `cache_file` and read back from there by later calls.
    """
    import datasets

    dtype = _token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id

    def encode(batch):
        texts = [t for t in batch["text"] if t]
        ids = tokenizer.encode_batch(texts)
        return {
            "ids": [np.asarray(list(x) + [eos], dtype=dtype) for x in ids],
            "n_bytes": np.asarray([len(t.encode("utf-8", errors="surrogatepass")) for t in texts], np.int64),
            "hash": np.asarray([_text_hash(t) for t in texts], dtype=np.uint64),
        }

    features = datasets.Features(
        {"ids": datasets.List(datasets.Value(dtype)), "n_bytes": datasets.Value("int64"),
         "hash": datasets.Value("uint64")}
    )
    return docs.map(
        encode, batched=True, batch_size=batch_size, remove_columns=docs.column_names, features=features,
        cache_file_name=str(cache_file), new_fingerprint=fingerprint, load_from_cache_file=True,
        desc="tokenising",
    )


def _columns(tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(all token ids concatenated, tokens per document, bytes per document, text hash per document)."""
    col = tokens.data.column("ids")
    flat = [c.flatten().to_numpy() for c in col.chunks]
    lens = [c.value_lengths().to_numpy() for c in col.chunks]
    cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt)  # noqa: E731
    ids = cat(flat, np.uint16)
    return (ids, cat(lens, np.int32).astype(np.int64),
            np.asarray(tokens.data.column("n_bytes").to_numpy(), dtype=np.int64),
            np.asarray(tokens.data.column("hash").to_numpy(), dtype=np.uint64))


def _split_mask(hashes: np.ndarray, valid_fraction: float) -> np.ndarray:
    """True for validation documents; at least one per side (needs ≥ 2 documents)."""
    mask = hashes.astype(np.float64) / 2.0**64 < valid_fraction
    if not mask.any():
        mask[np.argmin(hashes)] = True
    if mask.all():
        mask[np.argmax(hashes)] = False
    return mask


def _within_twice(share: float, wanted: float) -> bool:
    return wanted / 2 <= share <= 2 * wanted


def _document_split_fits(mask: np.ndarray, lens: np.ndarray, valid_fraction: float) -> tuple[bool, float]:
    """(whether the documents `mask` holds out are a sensible validation split, their share of the tokens):
    validation holds between half and twice `valid_fraction` of the tokens, training between half and twice the
    rest. The forced document of `_split_mask` may be a whole book, or one line."""
    share = float(lens[mask].sum()) / float(lens.sum())
    return _within_twice(share, valid_fraction) and _within_twice(1.0 - share, 1.0 - valid_fraction), share


def _token_cut(n_tokens: int, valid_fraction: float) -> int:
    """Where the token split cuts the concatenated documents: the last `valid_fraction` (at least 2 tokens) are
    held out."""
    return n_tokens - max(2, int(round(n_tokens * valid_fraction)))


def _split_by_documents(ids, lens, nbytes, mask, start) -> tuple[np.ndarray, np.ndarray, dict]:
    """The documents `mask` marks are validation's, the others training's, each in corpus order."""
    per_token = np.repeat(mask, lens)
    train, valid = np.concatenate([start, ids[~per_token]]), np.concatenate([start, ids[per_token]])
    return train, valid, dict(split="documents", train_documents=int((~mask).sum()), valid_documents=int(mask.sum()),
                              train_bytes=int(nbytes[~mask].sum()), valid_bytes=int(nbytes[mask].sum()))


def _split_by_tokens(ids, lens, nbytes, cut: int, start, tok: Tokenizer,
                     document_text) -> tuple[np.ndarray, np.ndarray, dict]:
    """Tokens `[:cut]` train, `[cut:]` validation; a document with tokens on both sides counts on both; its bytes
    after the cut are validation's (``document_text(k)``: the k-th document's text, read again for a tokenizer
    other than bytes)."""
    ends = np.cumsum(lens)
    k = int(np.searchsorted(ends, cut, side="right"))  # the document holding token `cut`
    head = cut - int(ends[k] - lens[k])  # its tokens before the cut (its last token is the eos, no text)
    vb = _tail_bytes(tok, ids[cut:ends[k]], head, lambda: document_text(k), int(nbytes[k])) + int(nbytes[k + 1:].sum())
    train, valid = np.concatenate([start, ids[:cut]]), np.concatenate([start, ids[cut:]])
    return train, valid, dict(split="tokens", train_documents=int((ends - lens < cut).sum()),
                              valid_documents=int((ends > cut).sum()), train_bytes=int(nbytes.sum()) - vb,
                              valid_bytes=vb)


@dataclass
class PreparedData:
    """Token streams of the two splits (1-D numpy, `[eos] doc [eos] doc [eos] …`) and what they came from."""

    train: np.ndarray
    valid: np.ndarray
    tokenizer: Tokenizer
    stats: dict = field(default_factory=dict)

    @property
    def valid_bytes(self) -> int:
        """UTF-8 bytes of the validation text (documents only, no specials)."""
        return int(self.stats["valid_bytes"])

    @property
    def bytes_per_token(self) -> float:
        """Validation text bytes per validation target (`len(valid) - 1` targets, eos included)."""
        return self.valid_bytes / max(1, len(self.valid) - 1)

    def bpb(self, mean_loss: float) -> float:
        """Bits per byte of a mean loss (nats per target token) over the validation stream."""
        return _bpb.loss_to_bpb(mean_loss, self.bytes_per_token)

    @functools.cached_property
    def content_digest(self) -> str:
        """sha256 of the tokenizer's fingerprint and both token streams: equal exactly when a model would be trained
        and scored on the same tokens, whichever folder, path or machine they came from."""
        digest = hashlib.sha256(f"{self.tokenizer.fingerprint}|{self.train.dtype}|{len(self.train)}|".encode())
        digest.update(np.ascontiguousarray(self.train).data)
        digest.update(np.ascontiguousarray(self.valid).data)
        return digest.hexdigest()

    def unigram_bpb(self, alpha: float = 1.0) -> float:
        """The baseline: a unigram model fitted on train, scored on validation, in bits per byte."""
        return _bpb.unigram_bpb(self.train, self.valid, self.valid_bytes, self.tokenizer.vocab_size, alpha=alpha)

    def train_loader(self, seq_len: int, batch_size: int, *, seed: int = 0, rank: int = 0,
                     world_size: int = 1) -> BatchLoader:
        return BatchLoader(self.train, seq_len, batch_size, seed=seed, rank=rank, world_size=world_size)

    def valid_batches(self, seq_len: int, batch_size: int, *, rank: int = 0, world_size: int = 1,
                      max_batches: int | None = None, max_sequences: int | None = None):
        return eval_batches(self.valid, seq_len, batch_size, rank=rank, world_size=world_size,
                            max_batches=max_batches, max_sequences=max_sequences)


def prepare_data(
    data: str | os.PathLike | Source | None = None,
    *,
    tokenizer: Tokenizer | str | os.PathLike | None = None,
    valid_fraction: float = 0.05,
    cache_dir: str | os.PathLike | None = None,
    text_column: str = "text",
    split: str = "train",
    hub_config: str | None = None,
    max_documents: int | None = None,
    include_tests: bool = False,
    skip_rows_without_text: bool = False,
) -> PreparedData:
    """Load, tokenise (cached), split and stream the corpus `data` names (see `resolve_source`;
    `skip_rows_without_text`: train on the table rows that have `text_column`, instead of refusing a file with rows
    that lack it)."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction: expected a number in (0, 1), got {valid_fraction!r}")
    tok = load_tokenizer(tokenizer) if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    source = data if isinstance(data, Source) else resolve_source(
        data, text_column=text_column, split=split, hub_config=hub_config, max_documents=max_documents,
        include_tests=include_tests, skip_rows_without_text=skip_rows_without_text,
    )
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    fingerprint = hashlib.sha256(f"v{FORMAT_VERSION}|{source.key}|{tok.fingerprint}".encode()).hexdigest()[:32]
    cache_file = cache / "tokens" / f"{fingerprint}.arrow"
    cache_file.parent.mkdir(parents=True, exist_ok=True)

    notes_file = cache_file.with_suffix(".notes.json")  # what loading found (rows skipped), for later runs' data line
    columns = _read_cache(cache_file) if cache_file.is_file() else None
    cached = columns is not None
    if cached:
        notes = _read_notes(notes_file)
    else:
        docs = source.load(str(cache / "datasets"))
        columns = _columns(tokenize_documents(docs, tok, cache_file=cache_file, fingerprint=fingerprint))
        notes = dict(source.notes)
        if notes:
            notes_file.write_text(json.dumps(notes) + "\n")

    ids, lens, nbytes, hashes = columns
    if len(lens) == 0:
        raise ValueError(f"no non-empty documents in {source.description}")
    description = source.description
    if skip_rows_without_text and source.kind == "files":  # the flag, and what it did, in the data line
        description += ", " + skipped_rows_text(notes.get("rows_without_text"), text_column)
    stats = {"source": description, "tokenizer": tok.name, "fingerprint": fingerprint,
             "cache_file": str(cache_file), "cache_hit": cached, "documents": int(len(lens))}
    start = np.asarray([tok.eos_id], dtype=ids.dtype)
    cut = _token_cut(len(ids), valid_fraction)
    document_text = functools.partial(_nth_document, source, cache)
    if len(lens) >= 2:
        mask = _split_mask(hashes, valid_fraction)
        fits, share = _document_split_fits(mask, lens, valid_fraction)
        if fits or cut < 2:  # whole documents, or too few tokens to cut
            train, valid, split = _split_by_documents(ids, lens, nbytes, mask, start)
        else:
            train, valid, split = _split_by_tokens(ids, lens, nbytes, cut, start, tok, document_text)
            stats["source"] += (f", split by tokens: whole documents would put {share:.1%} of the tokens in "
                                f"validation (valid_fraction {valid_fraction:g})")
    else:  # one document: split its tokens
        if cut < 2:
            raise ValueError(f"{source.description} has a single document of {len(ids)} tokens: too short to split")
        train, valid, split = _split_by_tokens(ids, lens, nbytes, cut, start, tok, document_text)
    stats.update(split, train_tokens=int(len(train)), valid_tokens=int(len(valid)))
    return PreparedData(train=train, valid=valid, tokenizer=tok, stats=stats)


def _read_cache(cache_file: Path) -> tuple | None:
    """`_columns` of the token cache file, or None when it cannot be read: it is deleted, with a one-line note on
    stderr naming it, and the caller tokenises the corpus again (it is only a cache)."""
    import datasets

    try:
        return _columns(datasets.Dataset.from_file(str(cache_file)))
    except Exception as e:  # noqa: BLE001 - a damaged arrow file fails in many ways (ArrowInvalid, OSError, KeyError)
        cache_file.unlink(missing_ok=True)
        why = " ".join(str(e).split())[:200]
        print(f"note: the token cache file {cache_file} could not be read ({type(e).__name__}: {why}); deleted it, "
              f"tokenising again", file=sys.stderr, flush=True)
        return None


def _read_notes(path: Path) -> dict:
    try:
        notes = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return notes if isinstance(notes, dict) else {}


def _tail_bytes(tok: Tokenizer, tail: np.ndarray, head: int, text, n_bytes: int) -> int:
    """UTF-8 bytes of a document's text after its first ``head`` tokens (``tail``: the rest of its ids, eos last;
    ``text()`` its text, ``n_bytes`` its bytes). The byte tokenizer counts its byte ids, and a byte-level BPE its
    tokens' bytes (``text_bytes``). Another tokenizer counts the text after the head's last token by the tokenizer's
    offsets (a character cut across tokens goes to the head): its decoder need not give the text back (a
    lowercasing or whitespace-collapsing one). Decoding was the count until 2026-11-29: a cut inside a character
    decoded as U+FFFD (3 bytes an orphan byte), and a WordPiece decoder's text was a third short."""
    if isinstance(tok, ByteTokenizer):
        return int((tail < 256).sum())
    if head == 0:
        return n_bytes
    if len(tail) <= 1:  # only the eos after the cut
        return 0
    exact = tok.text_bytes(tail[:-1].tolist()) if hasattr(tok, "text_bytes") else None
    if exact is not None:
        return exact
    if not hasattr(tok, "token_ends"):  # a tokenizer of one's own: its decoder's account
        return len(tok.decode(tail.tolist()).encode("utf-8", errors="surrogatepass"))
    document = text()
    end = tok.token_ends(document)[head - 1]
    return n_bytes - len(document[:end].encode("utf-8", errors="surrogatepass"))


def _nth_document(source: Source, cache: Path, k: int) -> str:
    """The text of the k-th non-empty document of ``source``, in the order it was tokenised (loaded again: the
    token cache keeps no text)."""
    docs = source.load(str(cache / "datasets"))
    seen = -1
    for batch in docs.iter(batch_size=1024):
        for text in batch["text"]:
            if text:
                seen += 1
                if seen == k:
                    return text
    raise ValueError(f"{source.description}: expected at least {k + 1} non-empty documents, found {seen + 1} "
                     f"(the files changed while they were read?)")
