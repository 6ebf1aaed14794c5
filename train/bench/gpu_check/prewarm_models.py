"""The scan calls a benchmark suite's models make in a training step, and the decoding part's prefill makes, for
``prewarm``: recorded from tiny steps on the CPU (the trainer's packed row and padded rows, bf16 autocast as on a
GPU; the prefill's chunks in bf16 weights), then replayed at the device's sizes.

What a Triton compile depends on is the same in both: the dtypes, which of decay and angle vary in time or
batch, the initial state, which inputs need gradients, and whether the sizes are multiples of 16. Only the
autotuner's choice depends on the size itself, and whether the scan is split in time (``time_split``: few long
rows, on the GPU), so the replay takes the device's tokens a step (``gpu-long``: 32 × 2048, as 32 rows: the
trainer's packed batch reaches the scan as one row per window, which its offsets know; the check's models part:
its rows from 32 × 2048 to 2 × 32768, the last split in time). A call whose steps are not the tokens'
(retention's carry across tiles: one step a tile) keeps their ratio. The final state is never used in training
(no ``dfinal``).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from hybrid.kernels.complex_scan.checks import state_dtype

__all__ = ["ScanCall", "recorded_scan_calls", "recorded_prefill_calls", "recorded_eval_calls", "replay",
           "suite_scan_calls",
           "check_model_scan_calls", "prefill_scan_calls", "tiny_model_scan_calls"]


@dataclass(frozen=True)
class ScanCall:
    """One call of ``complex_scan``'s backend runner (``interface._scan``), with the sizes left out."""

    dtype: torch.dtype  # of x
    heads: int
    head_dim: int
    batch_broadcast: tuple  # (log_decay, theta): one row for the whole batch
    time_static: tuple  # (log_decay, theta): one value for every step
    gate_dtypes: tuple
    has_initial_state: bool
    needs_grad: tuple  # x, log_decay, theta, initial_state
    time_ratio: Fraction = Fraction(1)  # the scan's steps over the tokens of a row (retention's carry: 1 / tile)

    def steps(self, tokens: int) -> int:
        """The scan's steps in a row of ``tokens`` tokens."""
        return max(1, math.ceil(tokens * self.time_ratio))

    def label(self) -> str:
        kinds = ["static" if s else "dependent" for s in self.time_static]
        grads = "".join(n for n, g in zip(("x", "d", "t", "h"), self.needs_grad) if g) or "-"
        ratio = f", {self.time_ratio} step a token" if self.time_ratio != 1 else ""
        return (f"{str(self.dtype).replace('torch.', '')} H{self.heads} D{self.head_dim} decay {kinds[0]}, "
                f"angle {kinds[1]}, {'an initial state, ' if self.has_initial_state else ''}grads {grads}{ratio}")


def _record(x, log_decay, theta, initial_state, tokens: int | None = None) -> ScanCall:
    from hybrid.kernels.complex_scan.interface import normalise_decay_like

    B, T, H, D = x.shape
    gates = [normalise_decay_like(g, B, T, H, D // 2) for g in (log_decay, theta)]  # (Bd, Td, H, P)
    grad = torch.is_grad_enabled()
    return ScanCall(dtype=x.dtype, heads=H, head_dim=D,
                    batch_broadcast=tuple(g.shape[0] == 1 and B > 1 for g in gates),
                    time_static=tuple(g.shape[1] == 1 for g in gates),
                    gate_dtypes=tuple(g.dtype for g in gates), has_initial_state=initial_state is not None,
                    needs_grad=tuple(grad and t is not None and t.requires_grad
                                     for t in (x, *gates, initial_state)),
                    time_ratio=Fraction(T, tokens) if tokens else Fraction(1))


@contextlib.contextmanager
def _recording(calls: list, tokens: int | None = None, sizes: bool = False):
    """Inside, each scan call is appended to ``calls``; ``tokens``: the tokens of a row of the model's input, from
    which each call's ``time_ratio`` is taken (None: 1); ``sizes``: append ``(call, rows, steps)`` instead."""
    from hybrid.kernels.complex_scan import interface

    scan = interface._scan

    def recorded(x, log_decay, theta, initial_state, which, block_size):
        call = _record(x, log_decay, theta, initial_state, tokens)
        calls.append((call, *x.shape[:2]) if sizes else call)
        return scan(x, log_decay, theta, initial_state, which, block_size)
    interface._scan = recorded
    try:
        yield
    finally:
        interface._scan = scan


def recorded_scan_calls(config, tokens: int = 256) -> list[ScanCall]:
    """The distinct scan calls of a ``HybridLM(config)``'s training steps, in bf16 autocast (the trainer's on a
    GPU), forward and backward, on the CPU: a packed row of ``tokens`` tokens in three documents (the trainer's
    batches: two windows of half as many), then two padded rows of half as many (the GPU check's padded rows).
    Each call's ``time_ratio`` is over a window's (a row's) tokens."""
    import torch.nn.functional as F

    from hybrid.models import HybridLM

    torch.manual_seed(0)
    model = HybridLM(config).train()
    calls: list = []
    for rows, cu in ((1, torch.tensor([0, tokens // 4, tokens // 2, tokens])), (2, None)):
        ids = torch.randint(0, config.vocab_size, (rows, tokens // rows + 1))
        with _recording(calls, tokens // 2), torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(ids[:, :-1], cu_seqlens=cu, output_final_state=False)
        F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
    return list(dict.fromkeys(calls))


def recorded_prefill_calls(config, chunk: int = 32) -> list[ScanCall]:
    """The distinct scan calls of a chunked prefill (``mode="chunked"``, the decoding part's) of two chunks by a
    ``HybridLM(config)`` in the config's weights, without gradients: the first chunk from no state, the next from
    the state the first left. ``time_ratio`` is over a chunk's tokens."""
    from hybrid.models import HybridLM

    torch.manual_seed(0)
    model = HybridLM(config).eval()
    calls: list = []
    ids = torch.randint(0, config.vocab_size, (2, 2 * chunk))
    with _recording(calls, chunk), torch.no_grad():
        model(ids, mode="chunked", chunk_size=chunk)
    return list(dict.fromkeys(calls))


def recorded_eval_calls(config, tokens: int = 256) -> list[ScanCall]:
    """The distinct scan calls of a ``HybridLM(config)``'s evaluations, without gradients: the trainer's validation
    (bf16 autocast, a packed row of two windows of ``tokens / 2``: ``lm.evaluate``), then the bench harness's
    measurements after training (``measure_run``: bpb at k × the training length, by position, past the window,
    the decoding cost) in its float32 weights: a parallel forward of two rows of ``tokens / 2`` (``time_ratio`` over
    a row) and their chunked forward in chunks of ``tokens / 4`` (over a chunk)."""
    from hybrid.models import HybridLM

    torch.manual_seed(0)
    model = HybridLM(config).eval()
    calls: list = []
    ids = torch.randint(0, config.vocab_size, (2, tokens // 2))
    cu = torch.tensor([0, tokens // 4, tokens // 2, tokens])
    with torch.no_grad():
        with _recording(calls, tokens // 2), torch.autocast("cpu", dtype=torch.bfloat16):
            model(ids.reshape(1, tokens), cu_seqlens=cu, output_final_state=False)
        with _recording(calls, tokens // 2):
            model(ids)
        with _recording(calls, tokens // 4):
            model(ids, mode="chunked", chunk_size=tokens // 4)
    return list(dict.fromkeys(calls))


def replay(call: ScanCall, batch: int, steps: int, backend: str = "triton") -> None:
    """``call`` on ``backend`` at ``batch`` × ``steps`` (the scan's own steps), forward, and backward when it
    needs gradients (of y alone)."""
    from hybrid.kernels.complex_scan import interface

    B, T, H, D = batch, steps, call.heads, call.head_dim
    x = torch.randn(B, T, H, D).to(call.dtype)

    def gate(i, scale):
        shape = (1 if call.batch_broadcast[i] else B, 1 if call.time_static[i] else T, H, D // 2)
        return (scale * torch.rand(shape)).to(call.gate_dtypes[i])
    state = torch.randn(B, H, D, dtype=state_dtype(call.dtype)) if call.has_initial_state else None
    leaves = [x, -(1e-3 + gate(0, 0.5)), gate(1, 3.0), state]
    for t, needs in zip(leaves, call.needs_grad):
        if t is not None:
            t.requires_grad_(needs)
    with torch.set_grad_enabled(any(call.needs_grad)):
        y, _ = interface._scan(*leaves, backend, None)
    wrt = [t for t, needs in zip(leaves, call.needs_grad) if needs]
    if wrt:
        torch.autograd.grad(y, wrt, torch.randn_like(y))


def _replays(prefix: str, calls, shapes):
    """(label, call) for each of ``calls`` at each ``(rows, tokens a row)`` of ``shapes``."""
    for call in calls:
        for batch, tokens in shapes:
            steps = call.steps(tokens)
            yield (f"{prefix}: {call.label()}, {batch} x {steps}",
                   lambda call=call, batch=batch, steps=steps: replay(call, batch, steps))


def suite_scan_calls(suite: str = "baselines", budget: str = "gpu-long",
                     models=("hybrid", "hybrid-selective", "vo-rnn")):
    """(label, call) replaying each model's recorded scan calls at the budget's tokens a step, as ``batch_size`` rows
    (padded, or packed by windows: the trainer's offsets know their window length, ``--compile``'s blocks too)."""
    import dataclasses
    import inspect

    from hybrid.train.bench.budgets import bench_budget
    from hybrid.train.bench.cost import decode_cost
    from hybrid.train.bench.harness import suite_configs
    from hybrid.train.bench.suites import SUITES

    chosen = dataclasses.replace(bench_budget(budget, suite), models=tuple(models))
    configs = suite_configs(SUITES[suite], chosen, vocab_size=320)  # the byte tokenizer's rounded size
    shapes = ((chosen.batch_size, chosen.seq_len),)
    # after training: long sequences in batches of 8 read in parallel and in chunks of the training length, and
    # one sequence prefilled in the decoding cost's chunks
    chunk = inspect.signature(decode_cost).parameters["chunk_size"].default
    measured = ((min(8, chosen.extra["long_seqs"]), chosen.seq_len), (1, chunk))
    for name in models:
        yield from _replays(f"{budget} {name}", recorded_scan_calls(configs[name]), shapes)
        yield from _replays(f"{budget} {name} measured", recorded_eval_calls(configs[name]), measured)


def check_model_scan_calls():
    """(label, call) replaying the scan calls of the check's models part (its models that run the scan, R layers
    and retention's carry, at ``small``) at its rows: the shortest and the longest, which "auto" splits in time on
    the GPU (``part_models.plan``: 65,536 tokens a step, as 32 × 2048 up to 2 × 32768)."""
    from hybrid.models import HybridConfig

    from .part_models import MODELS, SCAN_MODELS

    shapes = ((32, 2048), (2, 32768))
    presets = dict.fromkeys((MODELS[name][0], tuple(MODELS[name][1].items())) for name in SCAN_MODELS)
    for preset, overrides in presets:  # (the hybrid with its windows by SDPA runs the hybrid's scan)
        config = HybridConfig.preset(preset, "small", **dict(overrides))
        name = preset + "".join(f", {k}={v}" for k, v in overrides)
        yield from _replays(f"models part {name}", recorded_scan_calls(config), shapes)


def prefill_scan_calls():
    """(label, call) replaying the scan calls of the decoding part's chunked prefills (the hybrid at ``small`` in
    bf16 weights, chunks of ``part_decoding.CHUNK``) at its batches, 16 and 1."""
    from hybrid.models import HybridConfig

    from .part_decoding import CHUNK

    config = HybridConfig.preset("hybrid", "small", dtype="bfloat16")
    yield from _replays("decoding part hybrid prefill", recorded_prefill_calls(config), ((16, CHUNK), (1, CHUNK)))


def _tiny_model_runs():
    """The tiny models' passes of the correctness part's model checks and the CUDA model tests
    (tests/cuda/test_model_cuda.py), on the CPU: the compile check's eager side (float32, padded and packed rows of
    200, gradients), the sync count's bf16-autocast training step of every model it runs (rows of 256), and the
    three modes (2 × 53, chunks of 20)."""
    from types import SimpleNamespace

    from hybrid.models import HybridConfig, HybridLM

    from .part_correctness import SYNC_MODELS, _batches, _loss_and_grads, _tiny_hybrid, training_step_phases

    cpu = SimpleNamespace(device=torch.device("cpu"))
    for selective in (False, True):
        model = _tiny_hybrid(cpu, rnn_selective=selective).train()
        for ids, cu in _batches(cpu, model, 200).values():
            _loss_and_grads(model, ids, cu)
    for preset, overrides in SYNC_MODELS:  # the sync count's steps: every mixer (RetNet's carry: a scan)
        model = _tiny_hybrid(cpu, preset, **overrides).train()
        for ids, cu in _batches(cpu, model, 256).values():
            phases = training_step_phases(model, None, ids, cu, cpu.device)  # (no optimizer step: no scan)
            phases["forward"]()
            phases["backward"]()
    for preset in ("hybrid", "retnet", "vo-rnn"):
        torch.manual_seed(0)
        model = HybridLM(HybridConfig.preset(preset, "tiny", **({"window": 16} if preset == "hybrid" else {})))
        ids = torch.randint(0, model.config.vocab_size, (2, 53))
        with torch.no_grad():
            model.eval()(ids)
            model(ids, mode="chunked", chunk_size=20)


def tiny_model_scan_calls():
    """(label, call) replaying the scan calls of ``_tiny_model_runs`` at their own sizes."""
    found: list = []
    with _recording(found, sizes=True):
        _tiny_model_runs()
    for call, rows, steps in dict.fromkeys(found):  # (recorded without tokens: a step a token)
        yield from _replays("tiny models", (call,), ((rows, steps),))
