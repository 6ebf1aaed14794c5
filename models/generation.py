"""Decoding outside the model: continue a prompt with a ``HybridLM``, token by token (gpt-fast's layout).

    out = generate(model, input_ids, max_new_tokens=20, temperature=0)        # (B, T) -> (B, T + n)
    outs = generate(model, [prompt_a, prompt_b], max_new_tokens=20)          # any lengths -> a list of rows
    outs = generate(model, padded, 20, attention_mask=mask)                   # a padded (B, T) batch, likewise
    out = generate(model, input_ids, 20, draft=small_model, lookahead=4)     # speculative decoding
    out = generate(model, input_ids, 200, compile=True)                       # decode steps under torch.compile

mode "recurrent" prefills the prompt once (``prefill`` = "parallel" or "chunked"), then feeds one token a call,
``model(token (B, 1), state=state)``: one token continuing a state is the model's decode step, the route that
``HybridLM.step`` and the Hugging Face wrapper's decoding take too. "parallel" and "chunked" recompute the whole
sequence for every new token (no state: the slow reference the recurrent decoder must match). Each token is
chosen by ``sampling.sample_next``. ``HybridLM.generate`` is a thin caller of ``generate``.

Prompts of different lengths (a list, or a padded batch with its mask or lengths) prefill as one packed forward and
decode as one batch, every row at its own position (``models/decoding``: a ragged batch); a draft model turns on
speculative decoding (``models/decoding/speculative.py``). A stream of requests with their own sampling options
and seeds: ``models/decoding/decoder.py`` (continuous batching).
"""
from __future__ import annotations

import torch

from hybrid.checks import check_int

from .decoding.compiled_step import decode_step
from .decoding.prompts import PREFILL_MODES, check_prompts, prefill as prefill_prompts, prompt_list
from .decoding.speculative import check_draft, speculative_decode
from .modes import MODES
from .sampling import check_sampling, check_vocab_limit, sample_next


# On an accelerator, whether every row has ended is read back every this many tokens (a host sync each), not at
# every token: the loop may then run up to this many minus one steps past the end, whose tokens are cut.
EOS_CHECK_EVERY = 8


def eos_check_every(device) -> int:
    """How often ``TokenPicker`` reads back whether every row has ended: every token on the CPU (no sync there),
    every ``EOS_CHECK_EVERY`` elsewhere."""
    return 1 if torch.device(device).type == "cpu" else EOS_CHECK_EVERY


class TokenPicker:
    """Chooses each row's next token from logits ``(B, V)`` and keeps the tokens chosen (``tokens``); a row that
    produced ``eos_token_id`` repeats it from then on (``finished``)."""

    def __init__(self, batch_size: int, device, *, temperature, top_k, top_p, generator, eos_token_id, vocab_limit):
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                             vocab_limit=vocab_limit)
        self.eos_token_id = eos_token_id
        self.finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # (B,)
        self.tokens: list[torch.Tensor] = []  # one (B,) int64 per new position
        self.check_every = eos_check_every(device)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each row, ``(B,)`` int64."""
        token = sample_next(logits, **self.sampling)
        if self.eos_token_id is not None:
            token = torch.where(self.finished, torch.full_like(token, self.eos_token_id), token)
            self.finished.logical_or_(token == self.eos_token_id)
        self.tokens.append(token)
        return token

    def stacked(self) -> torch.Tensor:
        """The tokens chosen so far ``(B, n)`` (n = 0 before the first)."""
        if not self.tokens:
            return torch.zeros(len(self.finished), 0, dtype=torch.long, device=self.finished.device)
        return torch.stack(self.tokens, dim=1)

    def columns(self) -> torch.Tensor:
        """The tokens chosen ``(B, n)``, up to the one with which the last row ended: the loop may have run past it
        (``ended``); read back once then."""
        tokens = self.stacked()
        if self.eos_token_id is None or self.check_every == 1:
            return tokens
        return tokens[:, :max(_lengths_until_eos(tokens, self.eos_token_id))]

    def ended(self, i: int) -> bool:
        """Whether to stop after the (i + 1)-th token: every row has produced ``eos_token_id``, read back once
        every ``check_every`` tokens (the rows that ended repeat it meanwhile)."""
        return (i + 1) % self.check_every == 0 and self.all_finished

    @property
    def all_finished(self) -> bool:
        """Every row has produced ``eos_token_id`` (never, without one)."""
        return self.eos_token_id is not None and bool(self.finished.all())


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids,
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
    *,
    attention_mask: torch.Tensor | None = None,
    lengths=None,
    draft: torch.nn.Module | None = None,
    lookahead: int = 4,
    compile=False,
):
    """Continue ``input_ids`` ``(B, T)`` by up to ``max_new_tokens`` tokens with ``model`` (a ``HybridLM``);
    returns ``(B, T + n)``.

    Prompts of different lengths: ``input_ids`` a list of 1-D token sequences, or a padded ``(B, T)`` tensor with
    ``attention_mask`` ``(B, T)`` (1 = token, padding on either side) or ``lengths`` ``(B,)`` (row b's prompt is
    its first ``lengths[b]`` tokens). They prefill as one packed forward and decode as one batch, each row at its
    own position; the result is a list of B 1-D tensors, each row's prompt followed by its continuation (which
    ends at ``eos_token_id`` when the row produces it). Each row's greedy tokens and logits are those of its
    prompt decoded alone.

    ``mode``: "recurrent" (prefill in ``prefill`` mode, then one decode step per token) or "parallel" /
    "chunked" (recompute everything per token; ``chunk_size`` for "chunked" and a chunked prefill). Temperature
    0 is greedy; ``top_k`` / ``top_p`` restrict the draw (``sampling.sample_next``). Sequences that produced
    ``eos_token_id`` are padded with it; generation stops when all have (off the CPU, looked at every
    ``EOS_CHECK_EVERY`` tokens, a host sync each: the same output). ``vocab_limit``: the tokenizer's
    vocabulary size; ids from it up to ``vocab_size`` (padding rows of the embedding) are never produced, in any
    sampling mode (default: every id may be produced).

    ``draft``: a smaller ``HybridLM`` over the same vocabulary (or this model with fewer layers) for speculative
    decoding: it proposes ``lookahead`` tokens, the model verifies them in one forward, and the output is
    exactly the model's (greedy: its tokens; sampled: its distribution). Mode "recurrent" only; a model or
    draft with ``dynamic`` / ``longrope`` rotary scaling is refused (``speculative.fixed_rotary``).

    ``compile``: True, or a dict of ``torch.compile`` options, runs every decode step under
    ``torch.compile(model, dynamic=True, ...)`` (``decode_step``); "cuda-graph" records the step once as a CUDA
    graph and replays it (``decoding/graphed_step.py``; a global cache holds the longest prompt plus
    ``max_new_tokens``), and "compiled-cuda-graph" records it as ``torch.compile`` runs it (fewer kernels). The
    prefill stays eager. Mode "recurrent", without a draft.
    """
    ragged = not isinstance(input_ids, torch.Tensor) or attention_mask is not None or lengths is not None
    if ragged:
        prompts = check_prompts(model, prompt_list(input_ids, attention_mask, lengths))
    else:
        model.check_ids(input_ids)
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids: expected a prompt of at least one token, got an empty sequence")
    check_int("max_new_tokens", max_new_tokens, low=0)
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if prefill not in PREFILL_MODES:
        raise ValueError(f"prefill: expected 'parallel' or 'chunked', got {prefill!r}")
    check_sampling(temperature, top_k, top_p)
    if compile is not False and (mode != "recurrent" or draft is not None):
        raise ValueError(f"compile: compiles the decode steps of mode 'recurrent' without a draft model, got mode "
                         f"{mode!r}{' with a draft' if draft is not None else ''}")
    longest = max(len(p) for p in prompts) if ragged else input_ids.shape[1]
    step = decode_step(model, compile, capacity=longest + max_new_tokens)
    vocab_limit = check_vocab_limit(vocab_limit, eos_token_id, model.config.vocab_size)
    if draft is not None:
        if mode != "recurrent":
            raise ValueError(f"mode: expected 'recurrent' with a draft model (speculative decoding), got {mode!r}")
        check_draft(model, draft, lookahead, target_name="model")
        rows = prompts if ragged else list(input_ids)
        new, _ = speculative_decode(model, draft, rows, max_new_tokens, lookahead, temperature=temperature,
                                    top_k=top_k, top_p=top_p, generator=generator, eos_token_id=eos_token_id,
                                    vocab_limit=vocab_limit, prefill_mode=prefill, chunk_size=chunk_size)
        if ragged:
            return [torch.cat([p, n]) for p, n in zip(rows, new)]
        return torch.cat([input_ids, _pad_rows(new, max_new_tokens, eos_token_id, input_ids)], dim=1)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                    eos_token_id=eos_token_id, vocab_limit=vocab_limit)
    if ragged:
        pick = TokenPicker(len(prompts), prompts[0].device, **sampling)
        if mode == "recurrent":
            _decode_prompts(model, prompts, max_new_tokens, pick, prefill, chunk_size, step)
        else:
            _recompute_rows(model, prompts, max_new_tokens, pick, mode, chunk_size)
        tokens = pick.stacked()  # (B, n)
        keep = _lengths_until_eos(tokens, eos_token_id)
        return [torch.cat([p, row[:n]]) for p, row, n in zip(prompts, tokens, keep)]
    pick = TokenPicker(input_ids.shape[0], input_ids.device, **sampling)
    if mode == "recurrent":
        _decode(model, input_ids, max_new_tokens, pick, prefill, chunk_size, step)
    else:
        _recompute(model, input_ids, max_new_tokens, pick, mode, chunk_size)
    if not pick.tokens:
        return input_ids
    return torch.cat([input_ids, pick.columns()], dim=1)


def _pad_rows(rows: list[torch.Tensor], n: int, eos_token_id, like: torch.Tensor) -> torch.Tensor:
    """New tokens of each row as ``(B, n')`` (n' the longest row), shorter rows padded with ``eos_token_id`` (rows
    end short only at it)."""
    width = max(r.numel() for r in rows)
    out = like.new_full((len(rows), width), 0 if eos_token_id is None else eos_token_id)
    for b, r in enumerate(rows):
        out[b, :r.numel()] = r
    return out


def _lengths_until_eos(tokens: torch.Tensor, eos_token_id) -> list[int]:
    """How many of each row's new tokens ``(B, n)`` to keep: up to and including its first ``eos_token_id`` (all
    without one), read back once for the batch."""
    B, n = tokens.shape
    if eos_token_id is None or not n:
        return [n] * B
    hit = tokens == eos_token_id  # (B, n)
    return torch.where(hit.any(1), hit.long().argmax(1) + 1, n).tolist()


def _decode_prompts(model, prompts: list[torch.Tensor], max_new_tokens: int, pick: TokenPicker, prefill: str,
                    chunk_size, step) -> None:
    """Prompts of any lengths prefilled as one packed forward, then one decode step (``step``, ``decode_step``'s)
    per new token for the whole batch, every row at its own position."""
    logits, state = prefill_prompts(model, prompts, prefill, chunk_size)
    for i in range(max_new_tokens):
        token = pick(logits)
        if i + 1 == max_new_tokens or pick.ended(i):
            return
        logits, state = step(token[:, None], state=state)  # (B, 1, V): the decode step
        logits = logits[:, 0]


def _decode(model: torch.nn.Module, input_ids, max_new_tokens: int, pick: TokenPicker, prefill: str, chunk_size,
            step) -> None:
    """Prefill the prompt, then one decode step (``step``, ``decode_step``'s) per new token, each continuing the
    state."""
    logits, state = model(input_ids, mode=prefill, chunk_size=chunk_size)
    for i in range(max_new_tokens):
        token = pick(logits[:, -1])
        if i + 1 == max_new_tokens or pick.ended(i):
            return
        logits, state = step(token[:, None], state=state)  # (B, 1, V): the decode step


def _recompute_rows(model: torch.nn.Module, prompts: list, max_new_tokens: int, pick: TokenPicker, mode: str,
                    chunk_size) -> None:
    """A ragged batch's reference: each row's whole sequence again for every new token, in ``mode``, row by row;
    the rows' tokens picked together, as the recurrent loop picks them (so a seeded generator gives the same
    tokens in every mode)."""
    sequences = list(prompts)
    for i in range(max_new_tokens):
        last = torch.cat([model(s[None], mode=mode, chunk_size=chunk_size)[0][:, -1] for s in sequences])  # (B, V)
        token = pick(last)  # (B,)
        sequences = [torch.cat([s, t[None]]) for s, t in zip(sequences, token)]
        if pick.ended(i):
            return


def _recompute(model: torch.nn.Module, input_ids, max_new_tokens: int, pick: TokenPicker, mode: str, chunk_size) -> None:
    """The whole sequence again for every new token, in ``mode``, without a state."""
    sequence = input_ids
    for i in range(max_new_tokens):
        logits, _ = model(sequence, mode=mode, chunk_size=chunk_size)
        sequence = torch.cat([sequence, pick(logits[:, -1]).unsqueeze(1)], dim=1)
        if pick.ended(i):
            return
