"""Speculative decoding (Leviathan et al. 2023; gpt-fast's ``generate.py``): a draft model proposes, the target
verifies several tokens in one forward, and the output is exactly the target's (its greedy tokens, or a sample
from its distribution).

One round, for every row of a batch at once (rows at their own positions: a ragged batch):

1. Both models hold the state of the row's committed tokens minus its *pending* ones (1 … k+1 tokens they have
   not read yet: the last token chosen, plus any tokens a rejected round must read again).
2. The draft reads the pending tokens and then proposes, one recurrent step a token, until the row's chunk
   (pending + proposals) is k + 1 tokens long; it also reads the last proposal, so both models see the same chunk.
3. The target reads the chunk in one forward from its state: its distributions p after every position.
4. Each proposal x at chunk position c is accepted with probability min(1, p(x) / q(x)) (q: the draft's
   distribution that proposed it; greedy: accepted when it is the target's argmax), in order, until the first
   rejection; there the target's own token is drawn from norm(max(0, p − q)), or from p after the last position
   when every proposal was accepted. The output is then distributed as the target's own samples.
5. Rollback, exact: a row whose proposals were all accepted keeps both states (they read exactly its new tokens,
   but the last, which becomes pending). Any other row goes back to the states before the round
   (``HybridState.fork`` / ``rewind``: R and M states are never written, a global cache is truncated by its
   length, a window's ring is restored from a copy), and its pending tokens become the old pending ones, the
   accepted proposals and the target's token: the next round reads them again within its k + 1 tokens.

Every forward is one chunk of k + 1 tokens per row, whatever each row accepted: the batch stays rectangular.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from hybrid.checks import check_int
from hybrid.kernels.varlen import on_device

from ..sampling import check_sampling, check_vocab_limit, draw, sampling_probs
from ..state import HybridState
from .graph_state import bound_global_spans
from .prompts import PREFILL_MODES, check_prompts, prefill, prompt_list


@dataclass
class SpeculativeStats:
    """What a speculative run did: rounds (target forwards), proposals made and accepted, tokens produced."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    produced: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # accepted proposals, by position in the round

    @property
    def acceptance_rate(self) -> float:
        """Accepted proposals over proposals made."""
        return self.accepted / self.proposed if self.proposed else 0.0


def draft_from_layers(model, n_layers: int):
    """The draft "the same model with fewer layers": a ``HybridLM`` made of ``model``'s embedding, its first
    ``n_layers`` blocks, its final norm and its head (shared, not copied; self-speculative decoding)."""
    check_int("n_layers", n_layers, low=1, high=model.config.n_layers)
    draft = type(model)(model.config.replace(n_layers=n_layers, meta={**model.config.meta, "draft_of_layers": n_layers}))
    draft.embed, draft.abs_pos, draft.norm, draft.lm_head = model.embed, model.abs_pos, model.norm, model.lm_head
    draft.blocks = torch.nn.ModuleList(model.blocks[:n_layers])
    return draft.train(model.training)


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """Where a proposal was rejected, the target's token is drawn from norm(max(0, p − q)) ``(…, V)``."""
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p)


def accepts(p_token: Tensor, q_token: Tensor, uniform: Tensor) -> Tensor:
    """Accept a proposal with probability min(1, p(x) / q(x)): ``uniform · q(x) < p(x)``."""
    return uniform * q_token < p_token


def check_draft(target, draft, lookahead, target_name: str = "target") -> int:
    """``draft`` can propose for ``target`` (a ``HybridLM`` of its class over the same vocabulary), ``lookahead``
    >= 1 (returned as an int), and neither model's rotary frequencies depend on the call's length (``fixed_rotary``).
    Errors name the target ``target_name``."""
    if not isinstance(draft, type(target)):  # a HybridLM, as the target is (no import back up to models/lm.py)
        raise ValueError(f"draft: expected a HybridLM, got {type(draft).__name__}")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft: expected a model over the same vocabulary (vocab_size={target.config.vocab_size}), "
                         f"got vocab_size={draft.config.vocab_size}")
    lookahead = check_int("lookahead", lookahead, low=1)
    fixed_rotary(target, target_name)
    fixed_rotary(draft, "draft")
    return lookahead


def fixed_rotary(model, name: str) -> None:
    """Refuse a model with a rotary scaling whose frequencies depend on the call's total length (``dynamic``,
    ``longrope``: ``Rotary.length_dependent``, the property the CUDA-graph step refuses too): a round reads k + 1
    tokens in one forward, where the model decoding alone reads one, so the frequencies, and the output, differ."""
    for module_name, module in model.named_modules():
        if getattr(module, "length_dependent", False):
            raise ValueError(f"{name}: expected rotary frequencies that do not depend on the call's length "
                             f"(speculative decoding verifies k + 1 tokens a forward, so its output would differ "
                             f"from decoding alone), got {module_name}'s {module._rope_type} scaling")


@torch.no_grad()
def speculative_decode(target, draft, prompts: list[Tensor], max_new_tokens: int, lookahead: int, *,
                       temperature: float = 1.0, top_k=None, top_p=None, generator=None, eos_token_id=None,
                       vocab_limit=None, prefill_mode: str = "parallel", chunk_size=None):
    """Continue each prompt (1-D, any lengths) by up to ``max_new_tokens`` tokens of ``target``, ``draft`` proposing
    ``lookahead`` at a time. Returns the new tokens of each row (a list of 1-D tensors, each ending at
    ``eos_token_id`` when produced) and the ``SpeculativeStats``. The arguments are checked as ``generate``'s
    (``generate(target, prompts, ..., draft=draft)`` calls this); a model whose rotary frequencies depend on the
    call's length (``dynamic`` / ``longrope`` scaling) is refused (``fixed_rotary``)."""
    prompts = check_prompts(target, prompt_list(prompts, name="prompts"), name=lambda i: f"prompts[{i}]")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=0)
    lookahead = check_draft(target, draft, lookahead)
    check_sampling(temperature, top_k, top_p)
    vocab_limit = check_vocab_limit(vocab_limit, eos_token_id, target.config.vocab_size)
    if prefill_mode not in PREFILL_MODES:
        raise ValueError(f"prefill_mode: expected 'parallel' or 'chunked', got {prefill_mode!r}")
    chunk_size = check_int("chunk_size", chunk_size, low=1, allow_none=True)
    stats = SpeculativeStats(accepted_per_position=[0] * lookahead)
    if max_new_tokens == 0:
        return [p[:0] for p in prompts], stats
    B, K = len(prompts), lookahead + 1
    device = target.embed.weight.device
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, vocab_limit=vocab_limit)
    heads = [p[:-1] for p in prompts]  # the models read all but the last prompt token, which is pending
    _, target_state = prefill(target, heads, prefill_mode, chunk_size)
    _, draft_state = prefill(draft, heads, prefill_mode, chunk_size)
    target_state, draft_state = target_state.ragged_copy(), draft_state.ragged_copy()
    pending = torch.zeros(B, K, dtype=torch.long, device=device)  # (B, K): the row's pending tokens first
    pending[:, 0] = torch.stack([p[-1] for p in prompts])
    n_pending = torch.ones(B, dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)  # the prompt each batch row decodes
    # each prompt's new tokens, and K columns of room: a round writes all its K positions (those past the row's
    # count are written again by the next round, or cut at the end), so the write selects nothing by a mask
    out = torch.zeros(B, max_new_tokens + K, dtype=torch.long, device=device)  # (B, max_new_tokens + K)
    produced = torch.zeros(B, dtype=torch.long, device=device)
    counts = torch.zeros(3 + lookahead, dtype=torch.long, device=device)  # the stats, read back once at the end
    while rows.numel():
        draft_fork, target_fork = draft_state.fork(), target_state.fork()
        chunk, q, draft_state = _propose(draft, draft_state, pending, n_pending, K, sampling, generator)
        logits, target_state = target(chunk, state=target_state)  # (b, K, V): the verification, one forward
        n_accepted, token = _verify(logits, chunk, q, n_pending, K, sampling, generator)
        keep = n_pending + n_accepted == K  # every proposal accepted: both states read exactly the row's tokens
        target_state = target_state.rewind(keep, target_fork)
        draft_state = draft_state.rewind(keep, draft_fork)
        done = _record(out, produced, rows, chunk, n_pending, n_accepted, token, eos_token_id, counts)
        stats.rounds += 1
        # pending next round: the token alone, or (rolled back) the old pending tokens, the accepted ones and it
        reread = torch.where(keep, torch.zeros_like(n_pending), n_pending + n_accepted)  # (b,)
        position = torch.arange(K, device=device)
        pending = torch.where(position[None] < reread[:, None], chunk, torch.zeros_like(chunk))
        pending[torch.arange(rows.numel(), device=device), reread] = token
        n_pending = reread + 1
        # the round's one read back: which rows are done (the batch shrinks) and the longest row, the bound of the
        # global caches' lengths (a cache's span grows by K a round otherwise, whatever its rows kept)
        *finished, longest = torch.cat([done.long(), target_state.positions().max()[None]]).tolist()
        bound_global_spans(target_state, longest)
        bound_global_spans(draft_state, longest)  # the draft has read the same tokens
        if any(finished):
            live = on_device([i for i, d in enumerate(finished) if not d], device)
            rows, pending, n_pending = rows[live], pending[live], n_pending[live]
            target_state, draft_state = target_state.select(live), draft_state.select(live)
    stats.proposed, stats.accepted, stats.produced, *stats.accepted_per_position = counts.tolist()
    return [row[:n] for row, n in zip(out, produced.tolist())], stats


def _propose(draft, state: HybridState, pending: Tensor, n_pending: Tensor, K: int, sampling: dict, generator):
    """The draft reads each row's pending tokens, then proposes until the chunk holds K tokens, and reads the last
    proposal too (K recurrent steps for every row). Returns the chunk ``(b, K)``, q ``(b, K, V)`` (the draft's
    distribution that proposed the token at each chunk position, from 1) and the draft's state."""
    tokens = pending.clone()
    q = None
    for i in range(K):
        logits, state = draft(tokens[:, i:i + 1], state=state)  # (b, 1, V): the decode step
        if i + 1 == K:
            break
        probs = sampling_probs(logits[:, 0], **sampling)  # (b, V)
        if q is None:
            q = probs.new_zeros(probs.shape[0], K, probs.shape[1])  # (b, K, V)
        # position i + 1 is a proposal (not a pending token) for these rows; the others keep theirs. Every row
        # draws (no host read of whether any row proposes: a sync a step on a GPU)
        proposes = i + 1 >= n_pending
        drawn = probs.argmax(-1) if sampling["temperature"] == 0 else draw(probs, generator)
        tokens[:, i + 1] = torch.where(proposes, drawn, tokens[:, i + 1])
        q[:, i + 1] = probs
    return tokens, q, state


def _verify(logits: Tensor, tokens: Tensor, q: Tensor, n_pending: Tensor, K: int, sampling: dict, generator):
    """The accepted proposals of each row ``(b,)`` and the target's own token ``(b,)`` (see the module docstring)."""
    b, device = tokens.shape[0], tokens.device
    p = sampling_probs(logits, **sampling)  # (b, K, V): p[:, c] is the distribution of position c + 1
    candidate = tokens[:, 1:]  # (b, K − 1): chunk positions 1 … K − 1
    is_proposal = torch.arange(1, K, device=device)[None] >= n_pending[:, None]
    if sampling["temperature"] == 0:
        ok = p[:, :-1].argmax(-1) == candidate  # p is the one-hot of the target's argmax
    else:
        p_token = p[:, :-1].gather(-1, candidate[..., None])[..., 0]  # (b, K − 1)
        q_token = q[:, 1:].gather(-1, candidate[..., None])[..., 0]
        uniform = torch.rand(b, K - 1, generator=generator, device=device)
        ok = accepts(p_token, q_token, uniform)
    ok = ok | ~is_proposal  # a pending token is the row's own: nothing to accept
    leading = torch.cumprod(ok.long(), dim=1).sum(1)  # (b,): leading positions passed
    n_accepted = leading - (n_pending - 1)
    stop = n_pending + n_accepted  # the chunk position of the first rejected proposal, K when none
    row = torch.arange(b, device=device)
    p_at = p[row, stop - 1]  # (b, V): the target's distribution at that position
    if sampling["temperature"] == 0:
        return n_accepted, p_at.argmax(-1)
    rejected = stop < K
    q_at = q[row, stop.clamp(max=K - 1)]
    draw_from = torch.where(rejected[:, None], residual_distribution(p_at, q_at), p_at)
    return n_accepted, draw(draw_from, generator)


def _record(out: Tensor, produced: Tensor, rows: Tensor, chunk: Tensor, n_pending: Tensor, n_accepted: Tensor,
            token: Tensor, eos, counts: Tensor) -> Tensor:
    """Write each row's accepted proposals and its token into ``out`` ``(B, max_new_tokens + K)`` after the
    ``produced`` tokens of its prompt (up to ``max_new_tokens``, up to ``eos``), and add the round to ``counts``
    (proposed, accepted, produced, then accepted by position in the round); returns which rows are done. Nothing is
    read back: every position of the round is written (those past the row's count are overwritten later or cut),
    and the counts stay on the device."""
    b, K = chunk.shape
    max_new_tokens = out.shape[1] - K
    i = torch.arange(K, device=chunk.device)
    source = torch.clamp(n_pending[:, None] + i, max=K - 1)  # (b, K): proposals start after the pending tokens
    new = torch.where(i[None] < n_accepted[:, None], chunk.gather(1, source), token[:, None])  # (b, K)
    count = n_accepted + 1  # accepted proposals, then the target's token
    hit = torch.zeros(b, dtype=torch.bool, device=chunk.device)
    if eos is not None:
        is_eos = (new == eos) & (i[None] < count[:, None])
        hit = is_eos.any(1)
        count = torch.where(hit, is_eos.long().argmax(1) + 1, count)  # up to and including the first eos
    room = max_new_tokens - produced[rows]
    count = torch.minimum(count, room)
    out[rows[:, None], produced[rows][:, None] + i] = new  # (b, K) positions, each < max_new_tokens + K
    produced[rows] += count
    position_in_round = torch.arange(counts.numel() - 3, device=chunk.device)
    counts += torch.cat([torch.stack([(K - n_pending).sum(), n_accepted.sum(), count.sum()]),
                         (n_accepted[:, None] > position_in_round).sum(0)])
    return hit | (produced[rows] >= max_new_tokens)
