"""Decoding outside the model: continue a prompt with a ``HybridLM``, token by token (gpt-fast's layout).

    out = generate(model, input_ids, max_new_tokens=20, temperature=0)        # (B, T) -> (B, T + n)

mode "recurrent" prefills the prompt once (``prefill`` = "parallel" or "chunked"), then feeds one token a call,
``model(token (B, 1), state=state)``: one token continuing a state is the model's decode step, the route that
``HybridLM.step`` and the Hugging Face wrapper's decoding take too. "parallel" and "chunked" recompute the whole
sequence for every new token (no state: the slow reference the recurrent decoder must match). Each token is
chosen by ``sampling.sample_next``. ``HybridLM.generate`` is a thin caller of ``generate``.
"""
from __future__ import annotations

import torch

from hybrid.checks import check_int

from .modes import MODES
from .sampling import check_sampling, sample_next

PREFILL_MODES = ("parallel", "chunked")


class TokenPicker:
    """Chooses each row's next token from logits ``(B, V)`` and keeps the tokens chosen (``tokens``); a row that
    produced ``eos_token_id`` repeats it from then on (``finished``)."""

    def __init__(self, batch_size: int, device, *, temperature, top_k, top_p, generator, eos_token_id, vocab_limit):
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                             vocab_limit=vocab_limit)
        self.eos_token_id = eos_token_id
        self.finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # (B,)
        self.tokens: list[torch.Tensor] = []  # one (B,) int64 per new position

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each row, ``(B,)`` int64."""
        token = sample_next(logits, **self.sampling)
        if self.eos_token_id is not None:
            token = torch.where(self.finished, torch.full_like(token, self.eos_token_id), token)
            self.finished.logical_or_(token == self.eos_token_id)
        self.tokens.append(token)
        return token

    @property
    def all_finished(self) -> bool:
        """Every row has produced ``eos_token_id`` (never, without one)."""
        return self.eos_token_id is not None and bool(self.finished.all())


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    mode: str = "recurrent",
    prefill: str = "parallel",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    chunk_size: int | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """Continue ``input_ids`` ``(B, T)`` by up to ``max_new_tokens`` tokens with ``model`` (a ``HybridLM``);
    returns ``(B, T + n)``.

    ``mode``: "recurrent" (prefill in ``prefill`` mode, then one decode step per token) or "parallel" /
    "chunked" (recompute everything per token; ``chunk_size`` for "chunked" and a chunked prefill). Temperature
    0 is greedy; ``top_k`` / ``top_p`` restrict the draw (``sampling.sample_next``). Sequences that produced
    ``eos_token_id`` are padded with it; generation stops when all have. ``vocab_limit``: the tokenizer's
    vocabulary size; ids from it up to ``vocab_size`` (padding rows of the embedding) are never produced, in any
    sampling mode (default: every id may be produced).
    """
    model.check_ids(input_ids)
    check_int("max_new_tokens", max_new_tokens, low=0)
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if prefill not in PREFILL_MODES:
        raise ValueError(f"prefill: expected 'parallel' or 'chunked', got {prefill!r}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids: expected a prompt of at least one token, got an empty sequence")
    check_sampling(temperature, top_k, top_p)
    V = model.config.vocab_size
    vocab_limit = check_int("vocab_limit", vocab_limit, low=1, high=V, allow_none=True)
    check_int("eos_token_id", eos_token_id, low=0, high=(V if vocab_limit is None else vocab_limit) - 1,
              allow_none=True)
    pick = TokenPicker(input_ids.shape[0], input_ids.device, temperature=temperature, top_k=top_k, top_p=top_p,
                       generator=generator, eos_token_id=eos_token_id, vocab_limit=vocab_limit)
    if mode == "recurrent":
        _decode(model, input_ids, max_new_tokens, pick, prefill, chunk_size)
    else:
        _recompute(model, input_ids, max_new_tokens, pick, mode, chunk_size)
    if not pick.tokens:
        return input_ids
    return torch.cat([input_ids, torch.stack(pick.tokens, dim=1)], dim=1)


def _decode(model: torch.nn.Module, input_ids, max_new_tokens: int, pick: TokenPicker, prefill: str, chunk_size) -> None:
    """Prefill the prompt, then one decode step per new token, each continuing the state."""
    logits, state = model(input_ids, mode=prefill, chunk_size=chunk_size)
    for i in range(max_new_tokens):
        token = pick(logits[:, -1])
        if i + 1 == max_new_tokens or pick.all_finished:
            return
        logits, state = model(token[:, None], state=state)  # (B, 1, V): the decode step


def _recompute(model: torch.nn.Module, input_ids, max_new_tokens: int, pick: TokenPicker, mode: str, chunk_size) -> None:
    """The whole sequence again for every new token, in ``mode``, without a state."""
    sequence = input_ids
    for _ in range(max_new_tokens):
        logits, _ = model(sequence, mode=mode, chunk_size=chunk_size)
        sequence = torch.cat([sequence, pick(logits[:, -1]).unsqueeze(1)], dim=1)
        if pick.all_finished:
            return
