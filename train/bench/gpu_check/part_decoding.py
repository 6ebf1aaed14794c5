"""Part 5, decoding: after a prompt of 4K, 16K and 64K tokens (a chunked prefill), the mean time of one
recurrent step for the whole batch, tokens/s (batch / step time) and the state's bytes, at batch 1 and 16,
and the prefill's seconds after a warm-up prefill of two chunks (whose seconds, the first calls' compiling and
tuning, are recorded apart: on the H100 the hybrid's first 16K prefill took 39 s),
the hybrid (window 512) against the Transformer (a growing KV cache; global attention through SDPA), both
``small`` in bf16 weights.
Each step is timed three ways from the same prefilled state: eagerly (``step="eager"``), one Python call per
token as ``generate`` does by default; replayed from a CUDA graph (``step="graphed"``,
``generate(..., compile="cuda-graph")``: the first step eager into the rows form, the second records; a global
cache attends over the prompt plus the new tokens); replayed from a CUDA graph of the compiled step
(``step="graphed-compiled"``, ``compile="compiled-cuda-graph"``: Inductor's fused kernels recorded, fewer launches
a replay); and through ``generate(..., compile=True)``'s compiled step (``step="compiled"``,
``torch.compile(model, dynamic=True)``: one compile for every context and batch, its seconds in the first row's
``warm_up_steps_s``). On a GPU an eager step is bound by its few hundred kernel launches; a graph launches them at
once, and compiled, the elementwise ones fuse. A dry run records the graphs with their CPU stand-ins
(``compile="traced-graph"``, and ``GraphedStep(..., "rerun", compiled=...)``).

Every row above picks the next token by argmax. Two more rows replay the graphed step and sample (temperature 0.8,
top-p 0.95, one CUDA generator): by ``sample_next``'s ``draw`` (``step="graphed, sampled"``, no host sync), and by
``torch.multinomial`` on the same probabilities (``"graphed, sampled by multinomial"``: it reads back whether they
are valid, a sync a token, as ``generate`` drew before 2026-11-28). Their difference is that sync's cost a token."""
from __future__ import annotations

import itertools
import time

import torch

from .context import CheckContext
from .part_models import window_backend

BACKENDS = {"hybrid": None, "transformer": "blocked"}  # global attention through SDPA, as in the models part

CHUNK = 2048


def _model(name: str, size: str, device):
    from hybrid.models import HybridConfig, HybridLM

    # bfloat16 weights in the dry run too: a float32 rehearsal hid that a cast model's rows step copied its rotary
    # frequencies from the host (found on the meta device on 2026-11-28, before any GPU ran these rows)
    config = HybridConfig.preset(name, size, dtype="bfloat16")
    torch.manual_seed(0)
    return HybridLM(config).to(device).eval()


STEPS = ("eager", "graphed", "graphed-compiled", "compiled", "graphed, sampled", "graphed, sampled by multinomial")
# both models' eager and graphed rows before the compiles, and the compiled graph before the dynamic compile; the
# sampled rows, the graphed step's again, after the target's rows
PASSES = (("eager", "graphed", "graphed, sampled", "graphed, sampled by multinomial"),
          ("graphed-compiled", "compiled"))
SAMPLING = dict(temperature=0.8, top_p=0.95)


def greedy(logits):
    return logits.argmax(-1)


def pickers(device) -> dict:
    """How each step's row picks the next token from ``logits`` ``(B, V)``: argmax, but for the sampled rows."""
    from hybrid.models.sampling import sample_next, sampling_probs

    generator = torch.Generator(device=device).manual_seed(0)

    def by_draw(logits):
        return sample_next(logits, generator=generator, **SAMPLING)

    def by_multinomial(logits):
        probs = sampling_probs(logits, SAMPLING["temperature"], None, SAMPLING["top_p"])
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    return {"graphed, sampled": by_draw, "graphed, sampled by multinomial": by_multinomial}


def steppers(model, dry_run: bool, capacity: int) -> dict:
    """The ways to run a decode step, ``(token (B,), state) → (logits (B, V), state)``: the model's own ``step``,
    ``generate``'s CUDA-graph steps (a global cache of ``capacity`` slots), eager and compiled, and its compiled
    step. In a dry run the graphs are the CPU stand-ins', and Dynamo hands its graphs to the eager backend: the
    traces are rehearsed, Inductor's CPU compile would cost the test a minute."""
    from hybrid.models.decoding import decode_step
    from hybrid.models.decoding.graphed_step import GraphedStep

    def wrapped(step):
        def one(token, state):
            logits, state = step(token[:, None], state=state)  # (B, 1, V)
            return logits[:, 0], state
        return one

    graphed = decode_step(model, "traced-graph" if dry_run else "cuda-graph", capacity=capacity)
    if dry_run:
        graphed_compiled = GraphedStep(model, "rerun", capacity, compiled={"backend": "eager"})
    else:
        graphed_compiled = decode_step(model, "compiled-cuda-graph", capacity=capacity)
    compiled = decode_step(model, {"backend": "eager"} if dry_run else True)
    return {"eager": model.step, "graphed": wrapped(graphed), "graphed-compiled": wrapped(graphed_compiled),
            "compiled": wrapped(compiled), "graphed, sampled": wrapped(graphed),
            "graphed, sampled by multinomial": wrapped(graphed)}


def _time_steps(ctx: CheckContext, step, token, state, new_tokens: int, pick=greedy) -> dict:
    ctx.sync()
    start = time.perf_counter()
    for _ in range(2):  # warm-up steps (the compiled step's first calls compile)
        logits, state = step(token, state)
        token = pick(logits)
    ctx.sync()
    warm_up = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new_tokens):
        logits, state = step(token, state)
        token = pick(logits)
    ctx.sync()
    per_step = (time.perf_counter() - start) / new_tokens
    return dict(ms_per_step=per_step * 1e3, tokens_per_s=token.shape[0] / per_step, warm_up_steps_s=warm_up)


def measure(ctx: CheckContext, model, batch: int, context: int, new_tokens: int, steps: dict):
    """One prefill of ``batch`` random prompts of ``context`` tokens, then each of ``steps`` (name → step) timed
    from a copy of its state. Yields (name, the row's figures) as each is measured (a killed part keeps them)."""
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
    shared = dict(prefill_s=prefill, prefill_tokens_per_s=batch * context / prefill, warm_up_s=warm_up,
                  state_bytes=int(state.nbytes))
    token = logits[:, -1].argmax(-1)
    picks = pickers(ctx.device)
    for name, step in steps.items():
        yield name, {**shared, **_time_steps(ctx, step, token, state.clone(), new_tokens, picks.get(name, greedy))}


def run(ctx: CheckContext) -> None:
    if ctx.dry_run:
        size, contexts, batches, new_tokens = "tiny", (40,), (2,), 3  # one batch: each is a compile
    else:
        size, contexts, batches, new_tokens = "small", (16384, 4096, 65536), (16, 1), 32
    models = {name: _model(name, size, ctx.device) for name in ("hybrid", "transformer")}
    for context, batch, steps, (name, model) in itertools.product(contexts, batches, PASSES, models.items()):
        labels = {step: dict(model=name, size=size, context=context, batch=batch, step=step)
                  for step in steps}
        if "compiled" in steps:  # each row compiles afresh: Dynamo's limit of 8 compiles of HybridLM.forward,
            torch.compiler.reset()  # all models together, would otherwise turn later rows eager without a word
        ways = steppers(model, ctx.dry_run, capacity=context + new_tokens + 2)
        todo = {step: ways[step] for step in steps if not ctx.measured_before("decoding", labels[step])}
        if not todo or not ctx.has_time(20, "decoding", f"{labels[next(iter(todo))]}"):
            continue
        done = []
        try:
            with window_backend(BACKENDS[name]), torch.no_grad():
                for step, result in measure(ctx, model, batch, context, new_tokens, todo):
                    ctx.record("decoding", **labels[step], **result)
                    done.append(step)
        except Exception as exc:  # noqa: BLE001
            oom = isinstance(exc, torch.cuda.OutOfMemoryError)
            error = "out of memory" if oom else f"{type(exc).__name__}: {exc}"[:400]
            for step in [s for s in todo if s not in done]:
                ctx.record("decoding", **labels[step], error=error)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
