"""Where exactly a passkey model fails: exact match and per-digit accuracy by the key marker's position.

The test grid's depths 0 % and 100 % are single positions (the key first in the sequence; the key's last digit
right before the query), and 11 depths put two of their cells there. This scores a run's model at chosen key
positions of one length, on fresh sequences (``samples`` haystacks and keys, the key moved to each position, as
the test grid does: ``Passkey.test_set`` with another seed), so a failure at an edge can be told from one that
spreads inward:

    python -m hybrid.train.cli.studies.passkey_positions runs/pk/a runs/pk/b --length 256 [--positions 0,1,2,-2,-1]

Positions count filler tokens before the key marker, 0 … F (F = L − 2k − 1); negative ones count from F as Python
indexes do (−1 is F, the key touching the query). By default: 0 … k, the middle, and F − k … F. The sequences come
from ``numpy.random.default_rng([seed, length])`` with the task's test-split filler (default seed: the task's
``test_seed`` + 1, so they are not the test set's). ``--yarn`` reads the length with YaRN as ``score_passkey`` does.
"""
from __future__ import annotations

from .. import make_task

__all__ = ["default_positions", "resolve_positions", "score_positions"]

SAMPLES = 32


def default_positions(task, length: int) -> list[int]:
    """0 … k, the middle and F − k … F (each once) of sequences of ``length``."""
    F_ = task.filler_count(length)
    return sorted(set(range(min(task.k, F_) + 1)) | {F_ // 2} | set(range(max(F_ - task.k, 0), F_ + 1)))


def resolve_positions(task, length: int, positions) -> list[int]:
    """Key-marker positions in 0 … F, negative ones counted from F + 1 (−1 is F)."""
    F_ = task.filler_count(length)
    out = []
    for p in positions:
        if not -(F_ + 1) <= p <= F_:
            raise ValueError(f"positions: expected key positions in [{-(F_ + 1)}, {F_}] at length {length}, got {p}")
        out.append(p if p >= 0 else F_ + 1 + p)
    return out


def score_positions(model, task, length: int, positions=None, *, samples: int = SAMPLES, seed: int | None = None,
                    rope_scaling: str | None = None, device="cpu") -> list[dict]:
    """One row per key position at ``length``: ``{"position", "distance", "exact", "digit", "sequences"}``
    (distance: tokens from the key's last digit to the query marker; exact and digit: means over ``samples``
    sequences, the same haystacks and keys at every position)."""
    from .scoring import score_passkey

    positions = default_positions(task, length) if positions is None else resolve_positions(task, length, positions)
    F_ = task.filler_count(length)
    # each position as the depth that lands on it: ⌊(p / F) · F + 0.5⌋ = p
    depths = [p / F_ for p in positions]
    # the task's own test set at this one length, with these depths, samples and seed
    probe = make_task(task.name, **{**task.params(), "test_lengths": [length], "depths": depths, "samples": samples,
                                    "test_seed": task.test_seed + 1 if seed is None else seed})
    assert [probe.key_position(length, d) for d in probe.depths] == positions
    grid = score_passkey(model, probe, device, rope_scaling=rope_scaling)["passkey"]
    return [{"position": p, "distance": probe.key_distance(length, d), "exact": grid["exact"][0][i],
             "digit": grid["digit"][0][i], "sequences": samples} for i, (p, d) in enumerate(zip(positions, depths))]
