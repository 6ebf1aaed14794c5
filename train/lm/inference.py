"""A trained run for inference: the model and tokenizer rebuilt from its checkpoint, and text generation.

    run = load_run("runs/demo")                          # verified checkpoint -> HybridLM + tokenizer
    text = generate_text(run, "def ", max_new_tokens=200, temperature=0)

The prompt is encoded as ``[eos] + prompt``: training streams are ``[eos] doc [eos] doc …``, so ``eos`` is
the context every document starts from.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid.models import HybridLM

from ..loop.checkpoint import CheckpointError, load_checkpoint
from ..loop.saved_model import checkpoint_config, checkpoint_model
from ..data.tokenizer import Tokenizer, tokenizer_from_dict

__all__ = ["LoadedRun", "load_run", "generate_ids", "generate_text"]


@dataclass
class LoadedRun:
    model: HybridLM
    tokenizer: Tokenizer
    step: int
    path: Path  # the checkpoint directory
    train_config: dict  # how it was trained: hybrid-train's config, or a distilled student's hybrid-distill config


def load_run(run_dir, device: str | torch.device = "cpu") -> LoadedRun:
    """The model (eval mode, on ``device``) and tokenizer of the checkpoint in ``run_dir``.

    A missing checkpoint is a FileNotFoundError; a corrupt one, or one without a tokenizer record, a
    CheckpointError.
    """
    ckpt = load_checkpoint(run_dir)
    extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
    if "tokenizer" not in extra:
        raise CheckpointError(ckpt.path, "has no tokenizer record: it was not written by train.Trainer")
    config = checkpoint_config(ckpt)
    tokenizer = tokenizer_from_dict(extra["tokenizer"])
    model = checkpoint_model(ckpt, device, config)
    return LoadedRun(model=model, tokenizer=tokenizer, step=ckpt.step, path=ckpt.path,
                     train_config=extra.get("train_config") or (extra.get("distill") or {}).get("config", {}))


def generate_ids(run: LoadedRun, prompt: str, *, max_new_tokens: int = 200, mode: str = "recurrent",
                 prefill: str = "parallel", temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int = 0, stop_at_eos: bool = True,
                 chunk_size: int | None = None, compile: bool | str = False) -> list[int]:
    """Token ids of the prompt after the tokenizer's document start (``[eos]`` for the runs trained here) and
    its continuation (the start included); ``compile``: ``generate``'s (the decode steps under torch.compile, or
    "cuda-graph": ``hybrid.models.decoding.decode_step``)."""
    tok = run.tokenizer
    device = run.model.embed.weight.device
    ids = torch.tensor([prompt_ids(tok, prompt)], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    out = run.model.generate(ids, max_new_tokens, mode=mode, prefill=prefill, temperature=temperature,
                             top_k=top_k, top_p=top_p, generator=generator,
                             eos_token_id=tok.eos_id if stop_at_eos else None, chunk_size=chunk_size,
                             vocab_limit=min(tok.vocab_size, run.model.config.vocab_size),  # no padding ids
                             compile=compile)
    return out[0].tolist()


def prompt_ids(tok, prompt: str, where: str = "prompt") -> list[int]:
    """The ids a model is given for ``prompt``: the tokenizer's ``document_start``, then the prompt's tokens.
    An empty result (an empty prompt, and a tokenizer that starts documents with nothing) is refused."""
    ids = list(tok.document_start) + tok.encode(prompt)
    if not ids:
        raise ValueError(f"{where}: expected text (this run's tokenizer, as its source model's, puts no token in "
                         f"front of a document), got an empty prompt")
    return ids


def generate_text(run: LoadedRun, prompt: str, **kwargs) -> str:
    """The prompt followed by its continuation, decoded (special tokens dropped)."""
    return run.tokenizer.decode(generate_ids(run, prompt, **kwargs))
