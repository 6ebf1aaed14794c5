"""The scan calls a benchmark suite's models make in a training step, for ``prewarm``: recorded from tiny steps
on the CPU (the trainer's packed row and padded rows, bf16 autocast as on a GPU), then replayed at the budget's
batch.

What a Triton compile depends on is the same in both: the dtypes, which of decay and angle vary in time or
batch, the initial state, which inputs need gradients, and whether the sizes are multiples of 16. Only the
autotuner's choice depends on the size itself, so the replay takes the budget's tokens a step (``gpu-long``:
32 × 2048, as 32 rows, and as one row: the trainer's packed batch reaches the scan as one row per window, which its
offsets know, and as one row where they do not, under a whole-model compile). The final state is never used in
training (no ``dfinal``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

__all__ = ["ScanCall", "recorded_scan_calls", "replay", "suite_scan_calls"]


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

    def label(self) -> str:
        kinds = ["static" if s else "dependent" for s in self.time_static]
        grads = "".join(n for n, g in zip(("x", "d", "t", "h"), self.needs_grad) if g) or "-"
        return (f"{str(self.dtype).replace('torch.', '')} H{self.heads} D{self.head_dim} decay {kinds[0]}, "
                f"angle {kinds[1]}, grads {grads}")


def _record(x, log_decay, theta, initial_state) -> ScanCall:
    from hybrid.kernels.complex_scan.interface import normalise_decay_like

    B, T, H, D = x.shape
    gates = [normalise_decay_like(g, B, T, H, D // 2) for g in (log_decay, theta)]  # (Bd, Td, H, P)
    grad = torch.is_grad_enabled()
    return ScanCall(dtype=x.dtype, heads=H, head_dim=D,
                    batch_broadcast=tuple(g.shape[0] == 1 and B > 1 for g in gates),
                    time_static=tuple(g.shape[1] == 1 for g in gates),
                    gate_dtypes=tuple(g.dtype for g in gates), has_initial_state=initial_state is not None,
                    needs_grad=tuple(grad and t is not None and t.requires_grad
                                     for t in (x, *gates, initial_state)))


@contextlib.contextmanager
def _recording(calls: list):
    from hybrid.kernels.complex_scan import interface

    scan = interface._scan

    def recorded(x, log_decay, theta, initial_state, which, block_size):
        calls.append(_record(x, log_decay, theta, initial_state))
        return scan(x, log_decay, theta, initial_state, which, block_size)
    interface._scan = recorded
    try:
        yield
    finally:
        interface._scan = scan


def recorded_scan_calls(config, tokens: int = 64) -> list[ScanCall]:
    """The distinct scan calls of a ``HybridLM(config)``'s training steps, in bf16 autocast (the trainer's on a
    GPU), forward and backward, on the CPU: a packed row of ``tokens`` tokens in three documents (the trainer's
    batches), then two padded rows of half as many (the GPU check's padded rows)."""
    import torch.nn.functional as F

    from hybrid.models import HybridLM

    torch.manual_seed(0)
    model = HybridLM(config).train()
    calls: list = []
    for rows, cu in ((1, torch.tensor([0, tokens // 4, tokens // 2, tokens])), (2, None)):
        ids = torch.randint(0, config.vocab_size, (rows, tokens // rows + 1))
        with _recording(calls), torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(ids[:, :-1], cu_seqlens=cu, output_final_state=False)
        F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
    return list(dict.fromkeys(calls))


def replay(call: ScanCall, batch: int, steps: int, backend: str = "triton") -> None:
    """``call`` on ``backend`` at ``batch`` × ``steps``, forward and backward (gradients of y alone)."""
    from hybrid.kernels.complex_scan import interface

    B, T, H, D = batch, steps, call.heads, call.head_dim
    x = torch.randn(B, T, H, D).to(call.dtype)

    def gate(i, scale):
        shape = (1 if call.batch_broadcast[i] else B, 1 if call.time_static[i] else T, H, D // 2)
        return (scale * torch.rand(shape)).to(call.gate_dtypes[i])
    leaves = [x, -(1e-3 + gate(0, 0.5)), gate(1, 3.0), torch.randn(B, H, D) if call.has_initial_state else None]
    for t, needs in zip(leaves, call.needs_grad):
        if t is not None:
            t.requires_grad_(needs)
    y, _ = interface._scan(*leaves, backend, None)
    wrt = [t for t, needs in zip(leaves, call.needs_grad) if needs]
    if wrt:
        torch.autograd.grad(y, wrt, torch.randn_like(y))


def suite_scan_calls(suite: str = "baselines", budget: str = "gpu-long",
                     models=("hybrid", "hybrid-selective", "vo-rnn")):
    """(label, call) replaying each model's recorded scan calls at the budget's tokens a step: as one row (a packed
    batch whose window length is not known) and as ``batch_size`` rows (padded, or packed by windows)."""
    import dataclasses

    from hybrid.train.bench.budgets import bench_budget
    from hybrid.train.bench.harness import suite_configs
    from hybrid.train.bench.suites import SUITES

    chosen = dataclasses.replace(bench_budget(budget, suite), models=tuple(models))
    configs = suite_configs(SUITES[suite], chosen, vocab_size=320)  # the byte tokenizer's rounded size
    shapes = ((1, chosen.batch_size * chosen.seq_len), (chosen.batch_size, chosen.seq_len))
    for name in models:
        for call in recorded_scan_calls(configs[name]):
            for batch, steps in shapes:
                yield (f"{budget} {name}: {call.label()}, {batch} x {steps}",
                       lambda call=call, batch=batch, steps=steps: replay(call, batch, steps))
