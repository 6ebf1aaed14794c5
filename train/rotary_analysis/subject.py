"""The model an analysis reads: one of our runs or a Hugging Face causal LM, with its rotary layers, a forward
for `capture_statistics`, its tokenizer's `encode` and the tokens that join and open sequences.

    subject = load_subject("runs/tf", device=torch.device("cpu"))
    batches = token_batches(docs, subject.encode, separator=subject.separator, prefix=subject.prefix, ...)
    stats = capture_statistics(subject.forward, subject.layers, batches)
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..loop.checkpoint import has_checkpoint
from .capture import RotaryLayer


@dataclass
class Subject:
    """A loaded model, ready to be analysed.

    separator: the id put between documents (None: none); prefix: the id each sequence starts with (HF models'
    BOS; None for ours). p_max: our run's training seq_len (hybrid-train's, or a distilled student's
    hybrid-distill seq_len) or the HF config's max_position_embeddings (None when the run records none); a
    layer with a sliding window carries it in its `RotaryLayer`, and its bounds use min(p_max, window).
    """

    name: str
    layers: list[RotaryLayer]
    forward: Callable[[torch.Tensor], object]
    encode: Callable[[str], list[int]]
    separator: int | None
    prefix: int | None
    p_max: int | None
    notes: list[str] = field(default_factory=list)


def load_subject(model: str, *, device: torch.device, dtype: torch.dtype = torch.float32,
                 include_retention: bool = False) -> Subject:
    """A run directory of ours (its checkpoint/) or a transformers causal LM (a local directory or a hub name).

    dtype applies to Hugging Face weights only; include_retention adds our retention (M) layers.
    """
    if has_checkpoint(model):
        return _our_run(model, device=device, include_retention=include_retention)
    return _hugging_face(model, device=device, dtype=dtype)


def _our_run(path: str, *, device, include_retention: bool) -> Subject:
    from ..lm.inference import load_run
    from .hybrid_lm import hybrid_forward, hybrid_rotary_layers

    run = load_run(path, device=device)
    layers, notes = hybrid_rotary_layers(run.model, include_retention=include_retention)
    tok = run.tokenizer
    return Subject(name=run_name(path), layers=layers, forward=hybrid_forward(run.model),
                   encode=tok.encode, separator=tok.eos_id, prefix=None,
                   p_max=int(run.train_config.get("seq_len") or 0) or None, notes=notes)


def run_name(path: str) -> str:
    """A run's name in reports: its directory's name, with the parent's when the name alone is a bench seed
    (hybrid-bench writes SUITE/MODEL/seedN: "transformer/seed0", not a "seed0" every run shares)."""
    full = Path(os.path.abspath(path))
    if re.fullmatch(r"seed\d+", full.name) and full.parent.name:
        return f"{full.parent.name}/{full.name}"
    return full.name or str(path)


def _hugging_face(name: str, *, device, dtype) -> Subject:
    from .hf import hf_rotary_layers, load_hf_causal_lm

    model, tok = load_hf_causal_lm(name, device=device, dtype=dtype)
    if tok is None:
        raise FileNotFoundError(f"MODEL: {name!r} has no tokenizer files; the corpus cannot be encoded")
    layers, p_max = hf_rotary_layers(model)

    def forward(ids):
        return model(input_ids=ids.to(device), use_cache=False)

    def encode(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    separator = tok.eos_token_id if tok.eos_token_id is not None else tok.bos_token_id
    return Subject(name=str(name), layers=layers, forward=forward, encode=encode, separator=separator,
                   prefix=tok.bos_token_id, p_max=p_max)
