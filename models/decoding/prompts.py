"""Prompts of any lengths: the forms ``generate`` takes, and their prefill as one packed forward.

A batch of prompts arrives as a list of 1-D token sequences, or a padded ``(B, T)`` tensor with an
``attention_mask`` (1 = token, padding on either side, transformers' convention) or ``lengths`` (the first
``lengths[b]`` tokens of row b are its prompt). ``prefill`` runs them as one packed forward (``cu_seqlens``: no
padding computed, every prompt from position 0) and joins their states into one batch (``HybridState.cat``):
a ragged batch when the lengths differ, whose rows then decode together, each at its own position.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..state import HybridState

PREFILL_MODES = ("parallel", "chunked")  # how a prompt is read: prefill's ``mode``


def prompt_list(input_ids, attention_mask=None, lengths=None, *, name: str = "input_ids") -> list[Tensor]:
    """The prompts as a list of 1-D int64 tensors: ``input_ids`` a list of sequences (``attention_mask`` and
    ``lengths`` None), or a ``(B, T)`` tensor with an ``attention_mask`` ``(B, T)`` or ``lengths`` ``(B,)``. Errors
    name the prompts ``name``."""
    if not isinstance(input_ids, Tensor):
        if attention_mask is not None or lengths is not None:
            raise ValueError("attention_mask: expected None with a list of prompts (each is all tokens), got a mask"
                             if attention_mask is not None else
                             "lengths: expected None with a list of prompts (each is all tokens), got lengths")
        if isinstance(input_ids, (str, bytes)):
            raise ValueError(f"{name}: expected a (B, T) tensor or a non-empty list of token sequences (token ids), "
                             f"got a {type(input_ids).__name__} (encode text with a tokenizer first)")
        if not isinstance(input_ids, Sequence) or not input_ids:
            raise ValueError(f"{name}: expected a (B, T) tensor or a non-empty list of token sequences, got "
                             f"{type(input_ids).__name__ if not isinstance(input_ids, Sequence) else 'an empty list'}")
        return [token_ids(p, f"{name}[{i}]") for i, p in enumerate(input_ids)]
    if input_ids.dim() != 2:
        raise ValueError(f"{name}: expected shape (B, T), got {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if attention_mask is not None and lengths is not None:
        raise ValueError("lengths: expected either attention_mask or lengths, got both")
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != (B, T):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask: expected a (B, T) = ({B}, {T}) tensor of 0 and 1, got {got}")
        mask = attention_mask.bool()
        return [input_ids[b][mask[b]] for b in range(B)]
    if lengths is not None:
        lengths = torch.as_tensor(lengths)
        if lengths.shape != (B,) or lengths.is_floating_point() or int(lengths.min()) < 0 or int(lengths.max()) > T:
            raise ValueError(f"lengths: expected {B} ints in [0, {T}] (each row's prompt length), got "
                             f"{lengths.tolist() if lengths.dim() <= 1 else tuple(lengths.shape)}")
        return [input_ids[b, :int(n)] for b, n in enumerate(lengths.tolist())]
    return list(input_ids)


def token_ids(prompt, name: str) -> Tensor:
    """One prompt, a 1-D tensor of an int dtype or a sequence of ints, as a 1-D int64 tensor ``(T,)``. Text, floats
    and bools are refused (never truncated to ids); errors name the prompt ``name``."""
    if isinstance(prompt, (str, bytes)):
        raise ValueError(f"{name}: expected a sequence of token ids, got a {type(prompt).__name__} "
                         f"(encode text with a tokenizer first)")
    listed = not isinstance(prompt, Tensor)
    if listed:
        try:
            values = list(prompt)
            prompt = torch.tensor(values) if values else torch.zeros(0, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise ValueError(f"{name}: expected a sequence of token ids, got {type(prompt).__name__}") from None
    if prompt.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of token ids, got shape {tuple(prompt.shape)}")
    if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
        raise ValueError(f"{name}: expected a sequence of int token ids, got {prompt.dtype} values" if listed else
                         f"{name}: expected an int64 tensor of shape (T,), got {prompt.dtype}")
    return prompt.long()


def check_prompts(model, prompts: list[Tensor], name=lambda i: f"input_ids[{i}]") -> list[Tensor]:
    """Every prompt holds at least one id, each in ``[0, vocab_size)``; returned on the model's device. Errors name
    prompt i ``name(i)``."""
    device = model.embed.weight.device
    out = []
    for i, p in enumerate(prompts):
        if p.numel() == 0:
            raise ValueError(f"{name(i)}: expected a prompt of at least one token, got an empty sequence")
        p = p.to(device)
        model.check_ids(p, name(i), "(T,)")
        out.append(p)
    return out


def prefill(model, prompts: list[Tensor], mode: str = "parallel", chunk_size: int | None = None):
    """Run ``prompts`` (1-D, any lengths, empty ones included) as one packed forward.

    Returns the logits after each prompt's last token ``(N, V)`` (zeros for an empty prompt) and the batch state
    (``HybridState``, rows in prompt order; an empty prompt's row is a fresh state at position 0). Prompts of one
    length run as a plain ``(N, T)`` batch instead, and their state keeps one position.
    """
    V = model.config.vocab_size
    if len({p.numel() for p in prompts}) == 1 and prompts[0].numel():  # one length: a plain batch, one position
        logits, state = model(torch.stack(prompts), mode=mode, chunk_size=chunk_size)
        return logits[:, -1], state
    filled = [i for i, p in enumerate(prompts) if p.numel()]
    device = model.embed.weight.device
    logits = model.lm_head.weight.new_zeros(len(prompts), V)
    states: list[HybridState | None] = [None] * len(prompts)
    if filled:
        lengths = torch.tensor([prompts[i].numel() for i in filled])
        cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(device)  # (N+1,)
        packed = torch.cat([prompts[i] for i in filled])[None]  # (1, total)
        packed_logits, packed_states = model(packed, mode=mode, chunk_size=chunk_size, cu_seqlens=cu_seqlens)
        logits[filled] = packed_logits[0, cu_seqlens[1:] - 1]
        for i, state in zip(filled, packed_states):
            states[i] = state
    for i, state in enumerate(states):
        if state is None:
            states[i] = model.init_state(1)
    return logits, HybridState.cat(states)
