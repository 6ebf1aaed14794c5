"""Few long rows, scanned as many short ones: the scan split in time, for a GPU kernel that walks time step by step.

The Triton kernels run one program per (row, head, block of 16 pairs), each walking its row's T steps one after
another. A batch of few long rows gives few programs: one row of 65,536 steps through an R layer of 8 heads of
64 is 16 programs on an H100's 132 SMs, each bound by its own walk. Cut each row into C pieces of L = T / C steps
and the same work is spread over C times the programs, at the price of a second pass:

1. every piece scanned from a zero state, for its end state ``e_c`` alone (its outputs are dropped);
2. the pieces' transitions ``A_c = Π_{t in c} a_t = exp(Σ log_decay) · e^{−i Σ θ}`` (the sums accumulated in
   float64, the angle reduced modulo 2π before it is rounded to the state's float32, so that a long piece's
   angle keeps its precision), and the state entering each piece, ``s_c = A_{c−1} s_{c−1} + e_{c−1}`` from the
   row's initial state: itself a scan of C steps;
3. every piece scanned again from the state entering it, for the outputs and the final state.

Exactly the recurrence, up to float rounding in another order; differentiable through all three (autograd over
the op's own backward). Twice the scan's memory traffic, so it pays only where the grid is far too small for the
GPU: ``$HYBRID_SCAN_SPLIT`` "auto" (the default) splits a Triton scan on CUDA whose programs would fill at most a
quarter of the SMs, once T ≥ 8192, into pieces of at least 1024 steps, aiming at two programs an SM; "off" never
splits. ``time_split(pieces)`` forces a split (any backend but the reference; tests, timing). Predicted from the
grid, not yet measured (docs/research/gpu.md).
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from ..env import read_env

__all__ = ["time_split", "pieces_for", "split_in_time"]

_SPLIT = read_env("HYBRID_SCAN_SPLIT", ("auto", "off"), "auto")
_FORCED: int | None = None  # pieces while ``time_split`` holds

MIN_T = 8192  # rows shorter than this are not split by "auto"
MIN_PIECE = 1024  # nor cut into pieces shorter than this
PAIRS_A_PROGRAM = 16  # the Triton tiles' pairs per program that the H100 tuned (BP 16)


@contextlib.contextmanager
def time_split(pieces: int):
    """Every scan started inside (any backend but the reference) is split into ``pieces`` pieces of equal length
    (1: never split). One-line ``ValueError`` at the call for a T that ``pieces`` does not divide."""
    global _FORCED
    if not isinstance(pieces, int) or isinstance(pieces, bool) or pieces < 1:
        raise ValueError(f"time_split: expected pieces, an int ≥ 1, got {pieces!r}")
    before, _FORCED = _FORCED, pieces
    try:
        yield
    finally:
        _FORCED = before


@torch.compiler.assume_constant_result
def _sm_count(index: int) -> int:
    return _cached_sm_count(index)


@functools.lru_cache(maxsize=None)
def _cached_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pieces_for(B: int, T: int, H: int, P: int, device: torch.device, backend: str) -> int:
    """How many pieces a scan of ``B`` rows of ``T`` steps and ``H × P`` pairs is split into (1: none)."""
    if _FORCED is not None:
        if T % _FORCED:
            raise ValueError(f"time_split: expected a number of pieces that divides T = {T}, got {_FORCED}")
        return _FORCED if T else 1
    if _SPLIT == "off" or backend != "triton" or device.type != "cuda" or T < MIN_T:
        return 1
    programs = B * H * math.ceil(P / PAIRS_A_PROGRAM)
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if 4 * programs > sms:
        return 1
    pieces = 1
    while programs * pieces < 2 * sms and T % (2 * pieces) == 0 and T // (2 * pieces) >= MIN_PIECE:
        pieces *= 2
    return pieces


def _in_pieces(t: torch.Tensor, B: int, pieces: int) -> torch.Tensor:
    """A contiguous ``(Bd, Td, H, P)`` decay-like tensor for the ``B·C`` rows of the pieces (``Td`` 1 or T)."""
    Bd, Td = t.shape[:2]
    if Td == 1:
        return t if Bd == 1 else t.repeat_interleave(pieces, dim=0)  # (B·C, 1, H, P)
    if Bd != B:  # one per-token tensor for every row: each row's pieces need their own copy
        t = t.expand(B, *t.shape[1:])
    return t.reshape(B * pieces, Td // pieces, *t.shape[2:])  # (B, T, ·, ·) -> (B·C, L, ·, ·)


def split_in_time(scan, x, log_decay, theta, initial_state, pieces: int):
    """``scan(x, log_decay, theta, initial_state) -> (y, final)`` over dense rows (the op, on checked and normalised
    inputs: ``x`` ``(B, T, H, D)``, decays ``(Bd, Td, H, P)`` in the state dtype), computed as ``pieces`` pieces of
    every row (module docstring): ``(y (B, T, H, D), final (B, H, D))``."""
    B, T, H, D = x.shape
    L = T // pieces
    xs = x.reshape(B * pieces, L, H, D)  # (B, T, H, D) -> (B·C, L, H, D): piece c of row b is row b·C + c
    lds, ths = _in_pieces(log_decay, B, pieces), _in_pieces(theta, B, pieces)
    _, ends = scan(xs, lds, ths, None)  # (B·C, H, D): each piece's end state from zero

    def sums(t):  # (Bd, C or 1, H, P) in float64
        if t.shape[1] == 1:
            return t.double() * L
        return t.reshape(t.shape[0], pieces, L, *t.shape[2:]).sum(2, dtype=torch.float64)
    carry_ld = sums(log_decay).to(log_decay.dtype)
    carry_th = torch.remainder(sums(theta), 2 * math.pi).to(theta.dtype)
    reached, _ = scan(ends.reshape(B, pieces, H, D).to(log_decay.dtype), carry_ld, carry_th, initial_state)
    first = (initial_state if initial_state is not None else reached.new_zeros(B, H, D)).to(reached.dtype)
    entering = torch.cat([first[:, None], reached[:, :-1]], dim=1)  # (B, C, H, D): the state entering each piece
    y, piece_finals = scan(xs, lds, ths, entering.reshape(B * pieces, H, D).to(ends.dtype))
    return y.reshape(B, T, H, D), piece_finals.reshape(B, pieces, H, D)[:, -1]
