"""Part 4, models: training tokens/s and peak memory of one optimizer step (forward, loss, backward, AdamW)
under bf16 autocast, as ``hybrid-train`` runs it on a GPU, for the hybrid, the selective hybrid, RetNet and
vo-rnn against the Transformer (global attention through SDPA). Every model has the Transformer's width and
head size, and its MLP width (``matched``) brings it to the Transformer's non-embedding size. Each row runs a
fixed number of tokens per step (B = tokens / T), eager or with each block under ``torch.compile``
("compiled blocks": ``CompiledBlocks``, what ``hybrid-train --compile`` runs since 2026-11-28; the rows
"compiled" of earlier reports compiled the whole model), padded ``(B, T)`` or packed ``(1, B·T)`` with
``cu_seqlens`` at every T (the same tokens, through the packed path; the offsets handed over as the trainer does,
with their host values: earlier reports' eager packed rows read them back once a step). Rows run most
informative first (T = 8K and 16K eager), so that a part stopped at its time limit has measured what matters
most; the rest are listed as skipped."""
from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.nn.functional as F

from .context import CheckContext

MODELS = {  # name → (preset, overrides, window backend: None = the library's choice, "auto")
    "transformer": ("transformer", {}, "blocked"),  # global attention: SDPA's causal kernel (flash on CUDA)
    "hybrid": ("hybrid", {}, None),
    "hybrid (windows by SDPA)": ("hybrid", {}, "blocked"),  # the windows through block-local SDPA, not flex
    "hybrid-selective": ("hybrid", {"rnn_selective": True}, None),
    "retnet": ("retnet", {}, None),
    "vo-rnn": ("vo-rnn", {}, None),
}


COMPILED = "compiled blocks"  # hybrid-train --compile: each block under torch.compile (CompiledBlocks)

# The models whose layers run the complex scan: R, and retention's carry across tiles (since 2026-11-28, a Python
# loop before). Their rows name the scan's kernels, so that ``--skip-measured`` measures rows of other kernels again.
SCAN_MODELS = ("hybrid", "hybrid (windows by SDPA)", "hybrid-selective", "retnet", "vo-rnn")


def plan(ctx: CheckContext) -> list[dict]:
    """The rows, in the order they run."""
    if ctx.dry_run:  # every model once, the packed and the compiled path once each
        Ts, tokens, size = (32,), 64, "tiny"
        order = [("eager", "padded", 32), ("eager", "packed", 32), (COMPILED, "padded", 32)]
    else:
        Ts, tokens, size = (8192, 16384, 2048, 32768), 65536, "small"
        order = [("eager", "padded", T) for T in Ts[:2]]
        order += [(COMPILED, "padded", T) for T in Ts[:2]]
        order += [("eager", "packed", T) for T in Ts[:2]]
        order += [("eager", "padded", T) for T in Ts[2:]]
        order += [(COMPILED, "packed", T) for T in Ts[:2]]
        order += [(COMPILED, "padded", T) for T in Ts[2:]] + [("eager", "packed", T) for T in Ts[2:]]
    from hybrid.kernels.complex_scan.triton_scan import scan_setting

    rows = []
    for execution, batch, T in order:
        for name in MODELS:
            if ctx.dry_run and (batch, execution) != ("padded", "eager") and name != "hybrid":
                continue
            if "SDPA" in name and (execution, batch) != ("eager", "padded"):
                continue  # the window backend's cost is read off the eager padded rows
            scan = {"scan": scan_setting()} if name in SCAN_MODELS else {}  # (re-measured when the kernels change)
            rows.append(dict(model=name, execution=execution, batch=batch, T=T, B=max(1, tokens // T), size=size,
                             **scan))
    return rows


def matched(config, target: int):
    """``config`` at the Transformer's width and head size (head_dim 64 in ``small``), with the SwiGLU width (a
    multiple of 64) whose non-embedding size is closest to ``target`` (``speed.match_mlp``)."""
    from ..speed import match_mlp

    return match_mlp(config, target)


def build(name: str, size: str, device, dry_run: bool):
    from hybrid.models import HybridConfig, HybridLM

    from ..speed import non_embedding_parameters

    preset, overrides, _ = MODELS[name]
    config = HybridConfig.preset(preset, size, **overrides)
    if name != "transformer":
        config = matched(config, non_embedding_parameters(HybridConfig.preset("transformer", size)))
    torch.manual_seed(0)
    return HybridLM(config).to(device)


@contextlib.contextmanager
def window_backend(backend: str | None):
    """``$HYBRID_WINDOW_BACKEND`` set to ``backend`` (None: left as it is) for the block."""
    old = os.environ.get("HYBRID_WINDOW_BACKEND")
    if backend is not None:
        os.environ["HYBRID_WINDOW_BACKEND"] = backend
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HYBRID_WINDOW_BACKEND", None)
        else:
            os.environ["HYBRID_WINDOW_BACKEND"] = old


def _step_fn(model, forward, ids, cu, autocast, opt):
    x, y = ids[:, :-1], ids[:, 1:]

    def step():
        with autocast():
            logits, _ = forward(x, cu_seqlens=cu, output_final_state=False) if cu is not None else \
                forward(x, output_final_state=False)
        F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def measure(ctx: CheckContext, row: dict, steps: int) -> dict:
    """tokens/s (median step), peak memory and the first step's seconds (compilation, autotuning)."""
    from hybrid.models import CompiledBlocks
    from hybrid.train.data.packing import packed_on_device

    model = build(row["model"], row["size"], ctx.device, ctx.dry_run).train()
    # a dry run traces with dynamo only (backend "eager"): CPU code generation would take minutes
    backend = "eager" if ctx.dry_run else "inductor"
    forward = CompiledBlocks(model, dynamic=False, backend=backend) if row["execution"] == COMPILED else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=ctx.device.type == "cuda")
    B, T = row["B"], row["T"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=g)
    cu = None
    if row["batch"] == "packed":  # the same B sequences laid end to end: (1, B·T) with boundaries every T
        ids = torch.cat([ids[:, :-1].reshape(1, B * T), ids[-1:, -1:]], 1)
        cu = packed_on_device(torch.arange(0, B * T + 1, T), ctx.device, compiled=False)  # as the trainer
    ids = ids.to(ctx.device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if ctx.device.type == "cuda" else contextlib.nullcontext
    step = _step_fn(model, forward, ids, cu, autocast, opt)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    start = time.perf_counter()
    step()
    ctx.sync()
    first = time.perf_counter() - start
    step()
    ctx.sync()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        ctx.sync()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    out = dict(tokens_per_s=B * T / median, step_ms=median * 1e3, first_step_s=first,
               params_non_embedding=model.num_parameters(True), pattern=model.config.layer_types,
               d_model=model.config.d_model, mlp_hidden=model.config.mlp_hidden)
    if ctx.device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(ctx.device) / 2 ** 30
    return out


def run(ctx: CheckContext) -> None:
    rows = plan(ctx)
    steps = 1 if ctx.dry_run else 5
    for i, row in enumerate(rows):
        if ctx.measured_before("models", row):
            continue
        want = 5 if ctx.dry_run else 60 if row["execution"] == COMPILED else 15
        if not ctx.has_time(want, "models", f"{row}"):
            for rest in rows[i + 1:]:
                ctx.record("models", skipped=f"{rest}", reason="time")
            return
        with window_backend(MODELS[row["model"]][2]):
            try:
                result = measure(ctx, row, steps)
            except torch.cuda.OutOfMemoryError:
                result = dict(error="out of memory")
            except Exception as exc:  # noqa: BLE001 - one failing model is a finding, the part goes on
                result = dict(error=f"{type(exc).__name__}: {exc}"[:400])
        ctx.record("models", **row, **result)
        if row["execution"] == COMPILED:
            torch._dynamo.reset()  # each model compiles afresh, within dynamo's cache limit
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
