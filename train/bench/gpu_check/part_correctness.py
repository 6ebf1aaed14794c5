"""Part 1, correctness: the host syncs of a training step, the compiled hybrid against eager, and every CUDA path
against its float64 reference (the test suites on the GPU: ``part_tests``)."""
from __future__ import annotations

import contextlib
import os
import traceback
import warnings

import torch

from .context import CheckContext, rel_error
from .numerics import conv_errors, scan_errors, tolerance_for, window_errors

WINDOW_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}
CONV_TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
COMPILE_TOL = 1e-4  # float32: the compiled graph reorders float32 sums


def _scan_cases(ctx: CheckContext):
    """(dtype, T, mode, kwargs): every dtype × decay mode at short lengths, long lengths for each dtype, an
    autotuned size (B·T·H·P ≥ 2^22), and packed rows with boundaries at the tiles' edges. In the order that
    covers the most first when the part's time runs out (most of it goes to compiling each case's kernels: on
    the H100, 29 cases in 170 s): each dtype × mode once at T = 1000, the packed edges, the long and autotuned
    sizes, then T = 1 and 65."""
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    modes = ("static", "dependent", "mixed")
    if ctx.dry_run:  # the interpreter: a few tiny cases, one per branch
        small = {"B": 1, "H": 2, "D": 6}
        return [(f32, 9, m, small) for m in modes] + [(bf16, 1, "dependent", small),
                                                        (f16, 17, "mixed", small),
                                                        (f32, 30, "dependent", {"packed_edge": 8, **small})]
    cases = [(dt, 1000, m, {}) for dt in (f32, bf16, f16) for m in modes]
    for edge in (32, 64, 128):  # every time tile the kernels may use
        cases.append((f32, 4 * edge + 3, "dependent", {"packed_edge": edge}))
    cases.append((bf16, 1000, "mixed", {"packed_edge": 64}))
    cases.append((f32, 8192, "static", {"packed_edge": 64, "H": 4, "D": 64}))
    cases += [(bf16, 8192, "dependent", {"B": 4, "H": 4, "D": 64}),  # autotuned: 4·8192·4·32 = 2^22 pair-steps
              (f32, 65536, "dependent", {"B": 1, "H": 2}), (bf16, 65536, "static", {"B": 1, "H": 2}),
              (f16, 65536, "mixed", {"B": 1, "H": 2}),
              (f32, 8192, "dependent", {}), (bf16, 8192, "mixed", {}), (f16, 8192, "static", {})]
    cases += [(dt, T, m, {}) for dt in (f32, bf16, f16) for m in modes for T in (1, 65)]
    return cases


# The scan cases of a first pass (``_scan_cases``' order): every dtype × decay mode once and the packed edges.
FIRST_PASS = 14


def check_scan(ctx: CheckContext, layout: str, stages: int = 1, cases: slice = slice(None)) -> None:
    """The cases (all, or a slice of ``_scan_cases``) in one layout of the kernels: "tile" (``triton_scan``) or
    "runs" (``triton_runs``, its loop pipelined over ``stages``)."""
    from hybrid.kernels.complex_scan.triton_scan import scan_layout, scan_setting

    with scan_layout(layout, stages=stages):  # forward and backward
        _check_scan_layout(ctx, scan_setting(), _scan_cases(ctx)[cases])


def _check_scan_layout(ctx: CheckContext, layout: str, cases) -> None:
    for dtype, T, mode, kw in cases:
        label = dict(layout=layout, dtype=str(dtype).replace("torch.", ""), T=T, mode=mode, **kw)
        if not ctx.has_time(5 if T < 10_000 else 20, "scan", f"{label}"):
            continue
        try:
            errors = scan_errors(ctx.device, dtype, T, mode, **kw)
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            ctx.record("scan", **label, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
            continue
        truncating = ctx.dry_run  # Triton's interpreter truncates to bfloat16 (numerics.tolerance_for)
        ok = all(err <= tolerance_for(dtype, name, truncating) for name, err in errors.items())
        ctx.record("scan", **label, ok=ok, errors=errors)


def _window_backends(device) -> list[str]:
    from hybrid.kernels.window_attention.flash import flash_supports
    from hybrid.kernels.window_attention.flex import FLEX_AVAILABLE

    out = ["blocked"]
    if FLEX_AVAILABLE:
        out.append("flex")
    probe = torch.empty(1, 1, 1, 64, device=device, dtype=torch.bfloat16)
    if flash_supports(probe):
        out.append("flash")
    return out


def check_windows(ctx: CheckContext) -> None:
    backends = _window_backends(ctx.device)
    if "flash" not in backends:
        ctx.record("window", skipped="flash", reason="flash-attn not installed")
    if ctx.device.type == "cpu" and "flex" in backends:
        backends.remove("flex")
        ctx.record("window", skipped="flex", reason="FlexAttention has no backward on the CPU")
    T = 45 if ctx.dry_run else 777
    dtypes = (torch.float32,) if ctx.device.type == "cpu" else (torch.float32, torch.bfloat16)
    windows = (None, 16) if ctx.dry_run else (None, 64, T + 10)
    for backend in backends:
        for dtype in dtypes:
            if backend == "flash" and dtype == torch.float32:
                continue
            for window in windows:
                for packed in (False, True):
                    label = dict(backend=backend, dtype=str(dtype).replace("torch.", ""), T=T, window=window,
                                 packed=packed)
                    if not ctx.has_time(5, "window", f"{label}"):
                        return
                    try:
                        errors = window_errors(ctx.device, dtype, backend, T, window, packed=packed,
                                               D=16 if ctx.dry_run else 64)
                    except Exception as exc:  # noqa: BLE001
                        ctx.record("window", **label, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                        continue
                    ok = all(e <= WINDOW_TOL[dtype] for e in errors.values())
                    ctx.record("window", **label, ok=ok, errors=errors)


def check_conv(ctx: CheckContext) -> None:
    from hybrid.kernels.causal_conv.interface import select_conv_backend

    backends = ["torch"]
    if select_conv_backend(ctx.device, 64, 4, torch.bfloat16) == "causal_conv1d":
        backends.append("causal_conv1d")
    else:
        ctx.record("conv", skipped="causal_conv1d", reason="causal-conv1d not installed (the torch path runs)")
    dtypes = (torch.float32,) if ctx.device.type == "cpu" else (torch.float32, torch.bfloat16)
    for backend in backends:
        for dtype in dtypes:
            for packed in (False, True):
                label = dict(backend=backend, dtype=str(dtype).replace("torch.", ""), packed=packed)
                try:
                    errors = conv_errors(ctx.device, dtype, backend, packed=packed, T=50 if ctx.dry_run else 300)
                except Exception as exc:  # noqa: BLE001
                    ctx.record("conv", **label, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                    continue
                ctx.record("conv", **label, ok=all(e <= CONV_TOL[dtype] for e in errors.values()), errors=errors)


def _tiny_hybrid(ctx: CheckContext, preset: str = "hybrid", **overrides):
    from hybrid.models import HybridConfig, HybridLM

    size = "tiny"
    config = HybridConfig.preset(preset, size, **({"window": 32} if preset == "hybrid" else {}), **overrides)
    torch.manual_seed(0)
    return HybridLM(config).to(ctx.device)


# The models whose training step the sync count runs: every mixer (R static and selective, with its conv; windowed
# A; M, retention; G, VO-RoPE gated linear attention), each padded and packed.
SYNC_MODELS = (("hybrid", dict(rnn_selective=False)), ("hybrid", dict(rnn_selective=True)), ("retnet", {}),
               ("vo-gla", {}))
# G counts our chunkwise form: fla-core's Triton kernels (G's default on CUDA) autotune on first use, minutes of
# device time, and their syncs are fla's (given the host offsets, fla 0.6 reads none back).
SYNC_ENV = {"vo-gla": {"HYBRID_GLA_BACKEND": "torch"}}


@contextlib.contextmanager
def environment(values: dict):
    """``os.environ`` with ``values`` set inside the block, as it was after it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _batches(ctx: CheckContext, model, T: int):
    g = torch.Generator().manual_seed(3)
    V = model.config.vocab_size
    padded = torch.randint(0, V, (2, T), generator=g).to(ctx.device)
    packed = padded.reshape(1, 2 * T)
    cu = torch.tensor([0, 5, T, T + 1, 2 * T], device=ctx.device)
    return {"padded": (padded, None), "packed": (packed, cu)}


def _loss_and_grads(model, ids, cu):
    logits, _ = model(ids, cu_seqlens=cu, output_final_state=False) if cu is not None else model(ids, output_final_state=False)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    return logits, grads


def packed_mask_breaks_graph(model, cu) -> bool:
    """A packed batch (``cu`` given) whose window layers run on FlexAttention: its document mask is built outside
    the compiled graph (``window_attention/flex.py``: one graph break per attention layer, so that no frame
    recompiles for every packing), which ``fullgraph=True`` refuses. Seen on an H200, 2026-11-28; on the CPU the
    windows run blocked, with no break."""
    from hybrid.kernels.window_attention.interface import resolve_window_backend

    if cu is None:
        return False
    like = torch.empty(1, 1, 1, model.config.resolved_head_dim, device=cu.device)  # (B, T, H, D) of a query
    backends = {getattr(layer, "window_backend", None) for layer in model.modules() if hasattr(layer, "window")}
    return any(resolve_window_backend(b, like) == "flex" for b in backends)


def compiled_for(model, cu, **options):
    """``torch.compile(model, fullgraph=True, **options)``, without ``fullgraph`` where the packed mask breaks the
    graph by design (``packed_mask_breaks_graph``)."""
    return torch.compile(model, fullgraph=not packed_mask_breaks_graph(model, cu), **options)


def check_compile(ctx: CheckContext) -> None:
    """``torch.compile(fullgraph=True)`` of the tiny hybrid (static and selective decay) equals eager: logits
    and every parameter's gradient, padded and packed (packed on FlexAttention without ``fullgraph``:
    ``packed_mask_breaks_graph``). A dry run traces with dynamo only (backend "eager"): the same graph breaks
    fail, without the CPU's slow code generation."""
    if not ctx.has_time(60, "compile", "torch.compile(fullgraph=True) of the hybrid"):
        return
    T = 24 if ctx.dry_run else 200
    backend = "eager" if ctx.dry_run else "inductor"
    for selective in ((False,) if ctx.dry_run else (False, True)):
        model = _tiny_hybrid(ctx, rnn_selective=selective).train()
        for kind, (ids, cu) in _batches(ctx, model, T).items():
            compiled = compiled_for(model, cu, dynamic=False, backend=backend)
            label = dict(selective=selective, batch=kind, backend=backend,
                         fullgraph=not packed_mask_breaks_graph(model, cu))
            if not ctx.has_time(30, "compile", f"{label}"):
                return
            try:
                want_logits, want_grads = _loss_and_grads(model, ids, cu)
                got_logits, got_grads = _loss_and_grads(compiled, ids, cu)
            except Exception as exc:  # noqa: BLE001
                ctx.record("compile", **label, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                continue
            errors = {"logits": rel_error(got_logits, want_logits),
                      "grads (worst parameter)": max(rel_error(a, b) for a, b in zip(got_grads, want_grads))}
            ctx.record("compile", **label, ok=all(e <= COMPILE_TOL for e in errors.values()), errors=errors)


def _library_roots() -> tuple[str, ...]:
    """The library's folders (the gpu_check's own frames are the caller, never the cause)."""
    import hybrid
    import hybrid.kernels
    import hybrid.models
    import hybrid.train

    return tuple(os.path.dirname(m.__file__) + os.sep for m in (hybrid, hybrid.kernels, hybrid.models, hybrid.train))


def _caller(stack: list, roots: tuple[str, ...]) -> str:
    """The innermost frame under ``roots`` (else the innermost one outside ``warnings``): where a sync was
    asked for, as ``folder/file.py:line (function)``."""
    here = os.path.dirname(__file__) + os.sep
    inside = [f for f in stack if f.filename.startswith(roots) and not f.filename.startswith(here)]
    outside = [f for f in stack if not f.filename.endswith(("warnings.py", "part_correctness.py"))]
    frame = (inside or outside or stack)[-1]
    return f"{'/'.join(frame.filename.split(os.sep)[-2:])}:{frame.lineno} ({frame.name})"


# What c10 warns at each host sync under the "warn" debug mode. Only that: the first call of
# ``set_sync_debug_mode`` in a process also warns, once, that "Synchronization debug mode is a prototype feature
# and does not yet detect all synchronizing operations", which is no sync (the H100 sessions of 2026-11-26 to
# 2026-11-28 counted that notice as the padded static step's one sync).
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_syncs(step, roots: tuple[str, ...] | None = None, stacks: dict | None = None) -> list[str]:
    """Run ``step`` under ``torch.cuda.set_sync_debug_mode("warn")``; returns one call site per host sync (the
    innermost frame under ``roots``, default the library's folders).

    ``step`` is a callable, or a dict of named phases run in order, each under its own debug mode, with sites
    named ``"phase: site"``. A sync raised where no Python frame of ours is on the stack (torch's C++ code, the
    autograd engine) surfaces at the next call back into Python, so the phase is what places it. ``stacks``, if
    given, receives each site's innermost frames (the first time it is seen), to read where a site outside the
    library came from."""
    roots = _library_roots() if roots is None else roots
    phases = step if isinstance(step, dict) else {"": step}
    sites = []
    shown = warnings.showwarning
    phase = ""

    def hook(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            frames = traceback.extract_stack()[:-1]
            site = _caller(frames, roots)
            site = f"{phase}: {site}" if phase else site
            sites.append(site)
            if stacks is not None and site not in stacks:
                shown_frames = [f for f in frames if not f.filename.endswith("warnings.py")][-8:]
                stacks[site] = [f"{'/'.join(f.filename.split(os.sep)[-2:])}:{f.lineno} ({f.name})" for f in shown_frames]
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        try:
            for phase, run in phases.items():
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    run()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
        finally:
            warnings.showwarning = shown
    return sites


def training_step_phases(model, opt, ids, cu, device):
    """One bf16 training step as the trainer runs it (packed offsets handed over with their host values,
    ``packed_on_device``), as the phases ``count_syncs`` times: forward and loss, backward, optimizer."""
    from hybrid.train.data.packing import packed_on_device

    held = {}

    def forward():
        kwargs = {} if cu is None else {"cu_seqlens": packed_on_device(cu, device, compiled=False)}
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits, _ = model(ids, output_final_state=False, **kwargs)
        held["loss"] = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())

    def backward():
        held.pop("loss").backward()

    def optimizer():
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"forward": forward, "backward": backward, "optimizer": optimizer}


def check_syncs(ctx: CheckContext) -> None:
    """Host syncs of one training step (forward, loss, backward, AdamW step) under bf16 autocast, counted by
    ``torch.cuda.set_sync_debug_mode``, each with the innermost frame of ours that asked for it."""
    if ctx.device.type != "cuda":
        ctx.record("syncs", skipped="sync count", reason="needs CUDA (torch.cuda.set_sync_debug_mode)")
        return
    for preset, overrides in SYNC_MODELS:
        model = _tiny_hybrid(ctx, preset, **overrides).train()
        selective = overrides.get("rnn_selective")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        for kind, (ids, cu) in _batches(ctx, model, 256).items():
            if not ctx.has_time(20, "syncs", f"{preset} selective={selective} {kind}"):
                return
            phases = training_step_phases(model, opt, ids, None if cu is None else cu.cpu(), ctx.device)
            with environment(SYNC_ENV.get(preset, {})):
                for run in phases.values():  # warm-up: first-call work (autotuning, lazy init) is not a step's
                    run()
                ctx.sync()
                stacks = {}
                sites = count_syncs(phases, stacks=stacks)
            counts = {s: sites.count(s) for s in dict.fromkeys(sites)}
            ctx.record("syncs", model=preset, selective=selective, batch=kind, syncs_per_step=len(sites),
                       sites=[f"{s} ×{n}" for s, n in counts.items()][:12], stacks=stacks, ok=len(sites) == 0)


def run(ctx: CheckContext) -> None:
    """A first pass of the scan grid at the default setting (the runs layout, its loop pipelined over 3 stages),
    the compiled model, the syncs, the windows and the conv; then the rest of the default's grid, and the grid in
    the tile layout. The test suites on the GPU are a part of their own (``part_tests``)."""
    check_scan(ctx, "runs", stages=3, cases=slice(None, FIRST_PASS))
    check_compile(ctx)
    check_syncs(ctx)
    check_windows(ctx)
    check_conv(ctx)
    check_scan(ctx, "runs", stages=3, cases=slice(FIRST_PASS, None))
    check_scan(ctx, "tile")
