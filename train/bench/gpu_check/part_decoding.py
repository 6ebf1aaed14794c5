"""Part 4, decoding: after a prompt of 4K, 16K and 64K tokens (a chunked prefill), the mean time of one
recurrent step for the whole batch, tokens/s (batch / step time) and the state's bytes, at batch 1 and 16,
and the prefill's seconds after a warm-up prefill of two chunks (whose seconds, the first calls' compiling and
tuning, are recorded apart: on the H100 the hybrid's first 16K prefill took 39 s),
the hybrid (window 512) against the Transformer (a growing KV cache; global attention through SDPA), both
``small`` in bf16 weights.
The step is run eagerly, one Python call per token, as ``generate`` does."""
from __future__ import annotations

import time

import torch

from .context import CheckContext
from .part_models import window_backend

BACKENDS = {"hybrid": None, "transformer": "blocked"}  # global attention through SDPA, as in the models part

CHUNK = 2048


def _model(name: str, size: str, device):
    from hybrid.models import HybridConfig, HybridLM

    config = HybridConfig.preset(name, size, dtype="bfloat16" if device.type == "cuda" else "float32")
    torch.manual_seed(0)
    return HybridLM(config).to(device).eval()


@torch.no_grad()
def measure(ctx: CheckContext, model, batch: int, context: int, new_tokens: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=g).to(ctx.device)
    chunk = min(CHUNK, context)
    ctx.sync()
    start = time.perf_counter()  # a first and a later chunk's shapes: the one-off compiles and tuning
    model(ids[:, :min(context, 2 * chunk)], mode="chunked", chunk_size=chunk)
    ctx.sync()
    warm_up = time.perf_counter() - start
    start = time.perf_counter()
    logits, state = model(ids, mode="chunked", chunk_size=chunk)
    ctx.sync()
    prefill = time.perf_counter() - start
    state_bytes = state.nbytes
    token = logits[:, -1].argmax(-1)
    for _ in range(2):  # warm-up steps
        logits, state = model.step(token, state)
        token = logits.argmax(-1)
    ctx.sync()
    start = time.perf_counter()
    for _ in range(new_tokens):
        logits, state = model.step(token, state)
        token = logits.argmax(-1)
    ctx.sync()
    step = (time.perf_counter() - start) / new_tokens
    return dict(prefill_s=prefill, prefill_tokens_per_s=batch * context / prefill, warm_up_s=warm_up,
                ms_per_step=step * 1e3, tokens_per_s=batch / step, state_bytes=int(state_bytes))


def run(ctx: CheckContext) -> None:
    if ctx.dry_run:
        size, contexts, batches, new_tokens = "tiny", (40,), (1, 2), 3
    else:
        size, contexts, batches, new_tokens = "small", (16384, 4096, 65536), (16, 1), 32
    models = {name: _model(name, size, ctx.device) for name in ("hybrid", "transformer")}
    for context in contexts:
        for batch in batches:
            for name, model in models.items():
                label = dict(model=name, size=size, context=context, batch=batch)
                if ctx.measured_before("decoding", label):
                    continue
                if not ctx.has_time(20, "decoding", f"{label}"):
                    continue
                try:
                    with window_backend(BACKENDS[name]):
                        result = measure(ctx, model, batch, context, new_tokens)
                except torch.cuda.OutOfMemoryError:
                    result = dict(error="out of memory")
                except Exception as exc:  # noqa: BLE001
                    result = dict(error=f"{type(exc).__name__}: {exc}"[:400])
                ctx.record("decoding", **label, **result)
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
