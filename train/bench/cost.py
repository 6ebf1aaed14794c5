"""What a model costs: training memory at the training length, decoding time and state size after a context.

    memory = training_memory(model, batch_size=16, seq_len=256)   # {"train_memory_bytes", "memory_kind"}
    decode = decode_cost(model, context=4096, new_tokens=16)       # {"ms_per_token", "state_bytes", ...}

Training memory, one forward + backward of the cross-entropy at ``(batch_size, seq_len)``:

- on CUDA, ``torch.cuda.max_memory_allocated`` over that step (the model and its gradients included);
- on CPU, where torch keeps no allocator statistics, the bytes counted by hand: parameters, their gradients,
  AdamW's two moments, and every distinct tensor storage autograd saves for the backward pass (a
  ``saved_tensors_hooks`` pack hook sees each one) that is not a parameter's own: a layer that saves its weight
  for the backward pass holds no new memory, and the weights are already counted (a cast copy under autocast
  is new memory, and counted). It leaves out the short-lived temporaries of one op and the interpreter, so it
  is a lower bound of the process's growth, identical on every machine.

Decoding: a chunked prefill of ``context`` tokens, one warm-up step, then the mean wall time of
``new_tokens`` recurrent steps (greedy), each continuing the newest state, and the state's bytes after the
context (``HybridState.nbytes``).
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F

__all__ = ["training_memory", "decode_cost"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ids(model, batch_size: int, length: int, seed: int = 0) -> torch.Tensor:
    device = model.embed.weight.device
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch_size, length), generator=generator).to(device)


def training_memory(model: torch.nn.Module, *, batch_size: int, seq_len: int,
                    autocast=contextlib.nullcontext) -> dict:
    """Peak training memory of one step (its forward under ``autocast()``, as the trainer runs it); see the
    module docstring for what is counted on each device."""
    device = model.embed.weight.device
    ids = _ids(model, batch_size, seq_len + 1)
    x, y = ids[:, :-1], ids[:, 1:]
    was_training = model.training
    model.train()
    saved: dict[int, int] = {}
    weights_at = {p.untyped_storage().data_ptr() for p in model.parameters()}  # counted apart, in 4 × weights

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights_at:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    try:
        if device.type == "cuda":
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            with autocast():
                logits, _ = model(x)
            F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
            _sync(device)
            result = {"train_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
                      "memory_kind": "cuda max allocated"}
        else:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
                logits, _ = model(x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            # parameters + gradients + AdamW's exp_avg and exp_avg_sq (one each, the parameters' size)
            result = {"train_memory_bytes": int(4 * weights + sum(saved.values())),
                      "memory_kind": "counted: weights, grads, AdamW moments, saved activations"}
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return result


@torch.no_grad()
def decode_cost(model: torch.nn.Module, *, context: int, new_tokens: int, chunk_size: int = 1024) -> dict:
    """``{"context", "prefill_s", "ms_per_token", "state_bytes"}`` for one sequence after ``context`` tokens."""
    device = model.embed.weight.device
    was_training = model.training
    model.eval()
    try:
        ids = _ids(model, 1, context)
        _sync(device)
        start = time.perf_counter()
        logits, state = model(ids, mode="chunked", chunk_size=chunk_size)
        _sync(device)
        prefill = time.perf_counter() - start
        state_bytes = state.nbytes
        token = logits[:, -1].argmax(-1)
        logits, state = model.step(token, state)  # warm-up; a windowed state is continued only once
        token = logits.argmax(-1)
        _sync(device)
        start = time.perf_counter()
        for _ in range(new_tokens):
            logits, state = model.step(token, state)
            token = logits.argmax(-1)
        _sync(device)
        per_token = (time.perf_counter() - start) / max(new_tokens, 1)
    finally:
        model.train(was_training)
    return {"context": context, "prefill_s": prefill, "ms_per_token": per_token * 1e3, "state_bytes": int(state_bytes)}
