"""Next-token sampling: greedy, temperature, top-k and top-p (nucleus), over the ids a tokenizer can decode."""
from __future__ import annotations

import torch

from hybrid.checks import check_int, check_number, reads_back


def check_sampling(temperature, top_k, top_p) -> None:
    check_number("temperature", temperature, low=0)  # 0 = greedy; NaN and inf are refused
    check_int("top_k", top_k, low=1, allow_none=True, what="a positive int")
    check_number("top_p", top_p, low=0, low_open=True, high=1, allow_none=True)


def check_vocab_limit(vocab_limit, eos_token_id, vocab_size: int) -> int | None:
    """``vocab_limit`` in ``[1, vocab_size]`` or None (returned as an int) and ``eos_token_id`` an id below it, or
    None."""
    vocab_limit = check_int("vocab_limit", vocab_limit, low=1, high=vocab_size, allow_none=True)
    check_int("eos_token_id", eos_token_id, low=0, high=(vocab_limit or vocab_size) - 1, allow_none=True)
    return vocab_limit


def scaled_scores(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in float32 ``(…, V)``. A row where that overflows (a temperature so small that a
    finite logit over it is ±inf, or NaN once the temperature rounds to 0 in float32) becomes its greedy choice:
    0 at its argmax, −inf elsewhere, the limit of softmax(logits / t) as t → 0 (up to ties). Other rows are
    exactly logits / t."""
    logits = logits.float()
    scores = logits / temperature
    if temperature >= 1:  # |logit| / t <= |logit|: no overflow
        return scores
    overflow = (~scores.isfinite() & logits.isfinite()).any(dim=-1, keepdim=True)  # (…, 1): inf, or 0 / 0
    greedy = torch.full_like(scores, float("-inf")).scatter(-1, logits.argmax(dim=-1, keepdim=True), 0.0)
    return torch.where(overflow, greedy, scores)


def mask_padding(logits: torch.Tensor, vocab_limit: int | None) -> torch.Tensor:
    """``logits`` ``(B, V)`` with the ids ``>= vocab_limit`` set to −inf (the embedding rows a padded
    vocabulary adds beyond the tokenizer's: no tokenizer can decode them). None or ``V``: unchanged."""
    if vocab_limit is None or vocab_limit >= logits.shape[-1]:
        return logits
    return logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= vocab_limit, float("-inf"))


def sampling_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """The distribution ``sample_next`` draws from, float32 ``(…, V)`` from logits ``(…, V)``: softmax(logits /
    temperature) restricted to the ``top_k`` most likely ids and the smallest set reaching ``top_p``, ids
    ``>= vocab_limit`` excluded. Temperature 0 (greedy), or one so small that logits / temperature overflows
    (``scaled_scores``), is the one-hot of the argmax."""
    logits = mask_padding(logits, vocab_limit)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    scores = scaled_scores(logits, temperature)  # (…, V) float32
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # (…, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - torch.softmax(sorted_scores, dim=-1) >= top_p  # mass before this token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """Pick one token per row of ``logits`` ``(B, V)``; returns ``(B,)`` int64, every id ``< vocab_limit``.

    The ids ``>= vocab_limit`` are masked out first (``mask_padding``). Temperature 0 is greedy (argmax);
    otherwise a draw from ``sampling_probs``: softmax(logits / temperature) restricted to the ``top_k`` most
    likely tokens and to the smallest set whose probability reaches ``top_p``.
    """
    if temperature == 0:
        return mask_padding(logits, vocab_limit).argmax(dim=-1)
    probs = sampling_probs(logits, temperature, top_k, top_p, vocab_limit)
    return draw(probs, generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id per row of ``probs`` ``(…, V)`` (non-negative, finite; need not sum to 1), ``(…)`` int64: the id
    ``torch.multinomial(probs, 1, generator=generator)`` draws, bit for bit, and the generator left as it leaves
    it, without its host sync.

    ``torch.multinomial`` draws one sample as an exponential race, argmax(p / E) with E ~ Exp(1) drawn by
    ``generator`` (``aten/src/ATen/native/Distributions.cpp``; P(id i) = p_i / sum p), after reading back whether
    ``probs`` is valid: a sync at every sampled token on a GPU (gpt-fast samples the same way for that reason).
    Here the race is the same, and the check an assertion on the device there (a ValueError on the CPU)."""
    check_probs(probs)
    exponential = torch.empty_like(probs).exponential_(1, generator=generator)  # (…, V): E ~ Exp(1)
    return (probs / exponential).argmax(dim=-1)


def draw_rows(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """``draw(probs[i:i + 1], generators[i])[0]`` for every row i of ``probs`` ``(n, V)``, ``(n,)`` int64, as one
    race: each row's exponentials come from its own generator (continuous batching: a request's own seed), the
    division and the argmax are one kernel each for the rows."""
    if len(generators) != probs.shape[0]:
        raise ValueError(f"generators: expected one per row of probs ({probs.shape[0]}), got {len(generators)}")
    if len(generators) == 1:
        return draw(probs, generators[0])
    check_probs(probs)
    exponential = torch.empty_like(probs)  # (n, V): row i's E ~ Exp(1) from generators[i]
    for row, generator in zip(exponential, generators):
        row.exponential_(1, generator=generator)
    return (probs / exponential).argmax(dim=-1)


def check_probs(probs: torch.Tensor) -> None:
    """``probs`` holds no NaN, inf or negative value, and no row of zeros (what ``torch.multinomial`` refuses): a
    one-line ValueError on the CPU, an assertion on the device elsewhere (no host sync)."""
    valid = ((probs >= 0) & (probs < float("inf"))).all() & (probs.sum(-1) > 0).all()  # NaN fails both
    if not reads_back(probs):
        torch._assert_async(valid, "probs: expected non-negative finite probabilities, each row's sum > 0, got NaN, "
                                   "inf, < 0 or a row of zeros")
    elif not bool(valid):
        counts = {"NaN": probs.isnan(), "inf": probs.isinf(), "negative": probs < 0}
        found = ", ".join(f"{int(mask.sum())} {name}" for name, mask in counts.items() if bool(mask.any()))
        if found:
            raise ValueError(f"probs: expected non-negative finite probabilities, got {found} among {probs.numel()}")
        zero_rows = int((probs.sum(-1) == 0).sum())
        raise ValueError(f"probs: expected rows with a positive sum, got {zero_rows} row(s) of zeros")
