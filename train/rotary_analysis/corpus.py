"""The corpus the analysis reads: documents in a fixed shuffled order, cut into batches `(B, seq_len)` of ids.

    batches = token_batches(corpus_documents(None), encode, separator=eos, prefix=None, seq_len=256,
                            batch_size=2, tokens=100_000)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from ..data.prepare import default_cache_dir
from ..data.shards import skipped_rows_text
from ..data.sources import resolve_source


def corpus_documents(data, *, skip_rows_without_text: bool = False, say=None) -> Iterator[str]:
    """The non-empty documents of `data` (as for hybrid-train's --data: None is the standard library), as
    strings, in a fixed shuffled order. ``say``: prints the data line (what was read, what was skipped)."""
    source = resolve_source(data, skip_rows_without_text=skip_rows_without_text)
    docs = source.load(str(default_cache_dir() / "datasets"))
    if say is not None:  # the data line: what was read, what was skipped
        rows = source.notes.get("rows_without_text")
        say(f"data: {source.description}" + (", " + skipped_rows_text(rows, "text") if skip_rows_without_text else ""))
    order = np.random.default_rng(0).permutation(len(docs))
    for i in order:
        text = docs[int(i)]["text"]
        if text:
            yield text


def token_batches(docs: Iterable[str], encode: Callable[[str], list[int]], *, separator: int | None,
                  prefix: int | None, seq_len: int, batch_size: int, tokens: int) -> Iterator[torch.Tensor]:
    """Batches `(B, seq_len)` of ids from documents joined by `separator`; each sequence starts with `prefix`
    (when given). Stops once `tokens` tokens were yielded (the last batch may be smaller)."""
    body = seq_len - (prefix is not None)
    if body < 1:
        raise ValueError(f"seq_len: expected at least 2 with a BOS prefix, got {seq_len}")
    buffer: list[int] = []
    rows, sent = [], 0
    for doc in docs:
        if separator is not None:
            buffer.append(separator)
        buffer.extend(encode(doc))
        while len(buffer) >= body and sent < tokens:
            rows.append(([prefix] if prefix is not None else []) + buffer[:body])
            del buffer[:body]
            if len(rows) == batch_size or sent + seq_len * len(rows) >= tokens:
                yield torch.tensor(rows, dtype=torch.long)
                sent += seq_len * len(rows)
                rows = []
        if sent >= tokens:
            return
    if rows:
        yield torch.tensor(rows, dtype=torch.long)
    elif sent == 0:
        raise ValueError(f"data: expected a corpus of at least one sequence of {seq_len} tokens, got fewer")
