"""What a trained VO-RoPE recurrence does along a sequence: each pair's rotation θ_t and decay γ_t per token, and,
for parity, how far they sit from the exact automaton and what that adds up to at a length.

Parity's automaton in one complex pair: a ``1`` turns the pair by π and a ``0`` holds it, both with γ_t = 1. A
trained model is close, not exact; over a sequence of n₁ ones and n₀ zeros, a pair that flips (its mean angle on
``1`` above 3π/4; a pair that turns by π/2 per ``1`` counts mod 4 instead, and is not one)
carries

    drift = wrap(Σ_t θ_t − π·n₁) ∈ (−π, π]          the angle error the readout sees (|drift| > π/2 inverts it)
    kept  = exp(Σ_t log γ_t)                        the magnitude left of what was written at the start

counted from the first token after ``<bos>``. ``parity_probe`` reports them for its carrier pair, with the share
of bits on which the carrier holds exactly: the failure modes of the parity study (docs/research/synthetic-tasks.md, "Parity,
reliably"), angle drift and a state that leaks through gates that never quite shut.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from hybrid.recurrence import RecurrenceState, VORecurrence
from hybrid.rotary import DataPhase

from .base import rng_of
from .train import TEST_SEED

__all__ = ["parity_probe", "record_transitions", "rounded_angles", "state_magnitudes"]

FLIP_ABOVE = 0.75  # a pair flips when its mean angle on ``1`` is above this many π (a quarter-turn pair is not)
HELD_SHARE = 0.1  # a pair "holds something" when its magnitude is at least this share of the largest pair's
CARRIER_DRIFT_TIE = 0.01  # flip pairs whose mean |drift| is this close (units of π) to the least tie


@contextmanager
def _spy_scan_inputs(model: torch.nn.Module, seen: list, with_writes: bool = False):
    """Record ``(θ, log γ)`` of every VORecurrence's ``scan_inputs`` while the block runs, in layer order
    (``with_writes``: ``(v, log γ, θ)``, the writes too)."""
    mixers = [m for m in model.modules() if isinstance(m, VORecurrence)]
    originals = [m.scan_inputs for m in mixers]

    def spy(original):
        def scan_inputs(x, u):
            v, log_decay, theta = original(x, u)
            seen.append((v, log_decay, theta) if with_writes else (theta, log_decay))
            return v, log_decay, theta
        return scan_inputs

    try:
        for m, original in zip(mixers, originals):
            m.scan_inputs = spy(original)  # an instance attribute shadows the method
        yield mixers
    finally:
        for m in mixers:
            del m.scan_inputs


@torch.no_grad()
def _run(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list]:
    """One parallel-mode forward over ``ids`` ``(B, T)``: per recurrence layer, (θ, log γ) each ``(B, T, H, P)``
    float64 (a static θ or γ broadcast over B and T), and the layers' final `RecurrenceState`s."""
    seen: list = []
    with _spy_scan_inputs(model, seen) as mixers:
        if not mixers:
            raise ValueError("model: expected a model with a VO-RoPE recurrence layer, got none")
        model.eval()
        _, state = model(ids)
    B, T = ids.shape
    transitions = []
    for theta, log_decay in seen:
        shape = (B, T, *theta.shape[-2:])
        transitions.append((theta.double().expand(shape), log_decay.double().expand(shape)))
    return transitions, [s for s in state.layers if isinstance(s, RecurrenceState)]


def record_transitions(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per recurrence layer, (θ, log γ) along ``ids`` ``(B, T)`` in parallel mode, each ``(B, T, H, P)`` float64
    (a static θ or γ is broadcast over B and T)."""
    return _run(model, ids)[0]


def _wrap(angle: torch.Tensor) -> torch.Tensor:
    """Angles wrapped to (−π, π]."""
    return math.pi - torch.remainder(math.pi - angle, 2 * math.pi)


def _parity_transitions(model, task, length: int, n: int, layer: int):
    """Recurrence layer ``layer`` on the ``TEST_SEED`` parity sequences of ``length`` bits: θ and log γ after
    ``<bos>``, each ``(n, length, H, P)``, the bits ``(n, length, 1, 1)`` and the final state's pair magnitudes
    ``(n, H, P)``."""
    ids = task.test_batch(str(length), n, rng_of(TEST_SEED)).ids  # (n, length + 1), <bos> first
    transitions, states = _run(model, ids.to(next(model.parameters()).device))
    theta, log_decay = transitions[layer]
    return theta[:, 1:].cpu(), log_decay[:, 1:].cpu(), ids[:, 1:, None, None], _pair_magnitudes(states[layer])


def _pair_magnitudes(state: RecurrenceState) -> torch.Tensor:
    """|s_T| per sequence and pair, ``(n, H, P)`` float64, of a recurrence layer's final state."""
    return state.scan.double().cpu().unflatten(-1, (-1, 2)).norm(dim=-1)  # (n, H, hd) with pairs interleaved


def _drift(theta: torch.Tensor, bits: torch.Tensor, one: int) -> torch.Tensor:
    """|wrap(Σ_t θ_t − π·n₁)|, summed over the tokens (dim 1): ``(n, H, P)`` per sequence and pair, or ``(n,)``
    for one pair's ``(n, length)``."""
    return _wrap(theta.sum(1) - math.pi * (bits == one).double().sum(1)).abs()


@torch.no_grad()
def parity_probe(model: torch.nn.Module, task, length: int, n: int = 64, *, layer: int = 0) -> dict:
    """The transitions of recurrence layer ``layer`` on ``n`` parity test sequences of ``length`` bits (the test
    sequences of ``TEST_SEED``), against parity's automaton.

    The carrier is the flip pair (mean θ on ``1`` above ``FLIP_ABOVE``·π) with the smallest mean |drift| at the
    longest training length, where the model is exact; of pairs within ``CARRIER_DRIFT_TIE``·π of it (rounded
    angles all drift 0), the one that keeps the most magnitude there. Returns ``flip_pairs`` (how many pairs flip), ``pair`` (the
    carrier's head and pair), and for the carrier at ``length``: ``theta_one`` / ``theta_zero`` (mean θ on ``1`` /
    ``0``, units of π), ``step_error`` (the mean of θ_t − π·bit_t per bit, units of π: its drift per token),
    ``drift`` (mean |drift|, units of π), ``inverted`` (the share of sequences with |drift| > π/2),
    ``log_gamma_one`` / ``log_gamma_zero`` (mean log γ_t on each bit), ``kept`` (the median of exp Σ log γ_t) and
    ``held`` (the share of bits that hold it exactly, γ_t = 1: the hard gate closed);
    then ``carrier_growth`` (its final state magnitude at ``length`` over that at the training length,
    `state_magnitudes`) and, of the pairs holding at least ``HELD_SHARE`` of the largest magnitude there,
    ``most_changed_pair`` and its ``most_changed_growth``: a pair that integrates over the length (γ near 1,
    not exactly 1) is a feature the readout has never seen at this size.
    """
    one, zero = task.tokens["1"], task.tokens["0"]
    theta, log_decay, bits, short = _parity_transitions(model, task, task.longest_train_length, n, layer)
    is_one = (bits == one).double()
    flips = (theta * is_one).sum((0, 1)) / is_one.sum((0, 1)).clamp_min(1) > FLIP_ABOVE * math.pi  # (H, P)
    result = {"length": length, "sequences": n, "flip_pairs": int(flips.sum())}
    if not bool(flips.any()):
        return result
    drift = _drift(theta, bits, one).mean(0).masked_fill(~flips, math.inf)  # (H, P)
    kept = log_decay.sum(1).exp().median(0).values  # (H, P)
    near_best = drift <= drift.min() + CARRIER_DRIFT_TIE * math.pi  # exact angles tie: the most kept decides
    h, p = divmod(int(kept.masked_fill(~near_best, -1.0).argmax()), flips.shape[1])
    theta, log_decay, bits, long = _parity_transitions(model, task, length, n, layer)
    theta, log_decay = theta[..., h, p], log_decay[..., h, p]  # (n, length)
    bits = bits[..., 0, 0]
    on_one, on_zero = bits == one, bits == zero
    drift = _drift(theta, bits, one)  # (n,)
    result.update({
        "pair": [h, p],
        "theta_one": float(theta[on_one].mean()) / math.pi,
        "theta_zero": float(theta[on_zero].mean()) / math.pi,
        "step_error": float((theta - math.pi * on_one.double()).mean()) / math.pi,
        "drift": float(drift.mean()) / math.pi,
        "inverted": float((drift > math.pi / 2).double().mean()),
        "log_gamma_one": float(log_decay[on_one].mean()),
        "log_gamma_zero": float(log_decay[on_zero].mean()),
        "kept": float(log_decay.sum(1).exp().median()),
        "held": float((log_decay == 0).double().mean()),
    })
    short, long = short.median(0).values, long.median(0).values  # (H, P), as state_magnitudes gives them
    ratio = long / short.clamp_min(1e-30)  # (H, P)
    held = short >= HELD_SHARE * short.max()  # the pairs that hold something at the training length
    change = ratio.log().abs().masked_fill(~held, -1.0)
    hc, pc = divmod(int(change.argmax()), change.shape[1])
    result.update({"carrier_growth": float(ratio[h, p]), "most_changed_pair": [hc, pc],
                   "most_changed_growth": float(ratio[hc, pc])})
    return result


def state_magnitudes(model: torch.nn.Module, task, length: int, n: int = 64, layer: int = 0) -> torch.Tensor:
    """The median over ``n`` test sequences of ``length`` bits of each pair's final state magnitude ``|s_T|`` in
    recurrence layer ``layer``, ``(H, P)`` float64: a pair whose magnitude depends on the length is a feature the
    readout never saw at the training lengths."""
    return _parity_transitions(model, task, length, n, layer)[3].median(0).values


@contextmanager
def rounded_angles(model: torch.nn.Module, round_to: int = 2):
    """Every data-dependent phase of ``model`` rounds its angles to multiples of 2π/round_to at inference inside
    the block (the test of whether a model fails by its angles' precision); restored after."""
    phases = [m for m in model.modules() if isinstance(m, DataPhase)]
    saved = [(m.round_to, m.round_at_inference) for m in phases]
    try:
        for m in phases:
            m.round_to, m.round_at_inference = round_to, True
        yield len(phases)
    finally:
        for m, (r, a) in zip(phases, saved):
            m.round_to, m.round_at_inference = r, a


# ------------------------------------------------------------------------------------------ the command

PROBE_COLUMNS = ["run", "acc", "acc rounded", "flip pairs", "θ on 1 (π)", "θ on 0 (π)", "step error (π)",
                 "drift (π)", "inverted", "log γ on 1", "log γ on 0", "kept", "held", "carrier growth",
                 "most changed growth"]


def probe_run(run_dir, length: int, n: int = 256) -> list:
    """One row of ``PROBE_COLUMNS`` for a parity run directory of ``train_task``: the accuracy at ``length`` on
    its test sequences, the same with the angles rounded to {0, π} at inference, and `parity_probe`'s carrier."""
    from .train import accuracy, load_task_run

    model, task = load_task_run(run_dir)
    if task.name != "parity":
        raise ValueError(f"run: expected a parity run directory, got a {task.name} run at {run_dir}")
    batch = task.test_batch(str(length), n, rng_of(TEST_SEED))
    cpu = torch.device("cpu")
    acc = accuracy(model, batch, "last", cpu)[0]
    with rounded_angles(model):
        rounded = accuracy(model, batch, "last", cpu)[0]
    p = parity_probe(model, task, length, min(n, 64))
    if "pair" not in p:
        return [str(run_dir), f"{acc:.3f}", f"{rounded:.3f}", "0"] + ["–"] * (len(PROBE_COLUMNS) - 4)
    return [str(run_dir), f"{acc:.3f}", f"{rounded:.3f}", str(p["flip_pairs"]), f"{p['theta_one']:.4f}",
            f"{p['theta_zero']:.4f}", f"{p['step_error']:+.4f}", f"{p['drift']:.3f}", f"{p['inverted']:.2f}",
            f"{p['log_gamma_one']:.4f}", f"{p['log_gamma_zero']:.4f}", f"{p['kept']:.3f}", f"{p['held']:.3f}",
            f"{p['carrier_growth']:.2f}", f"{p['most_changed_growth']:.2f}"]
