"""Multi-query associative recall (MQAR), as Zoology defines it (Arora et al., arXiv 2312.04927).

A sequence of length L holds ``pairs`` key-value pairs, then the queries:

    k_1 v_1 k_2 v_2 … k_p v_p  |  x x k_3 x x x k_1 x …      labels: the value of k_i AT the query k_i

- keys are drawn without replacement from the lower half of the vocabulary (``1 … V/2 − 1``), values without
  replacement from the upper half (``V/2 … V − 1``);
- every key is queried once, in a random order; query i sits at ``2·p + 2·g_i`` where the gaps ``g_i`` are drawn
  without replacement from ``0 … (L − 2p)/2 − 1`` with probability ``∝ a·j^(a−1)`` (j = g + 1, a = 0.01): a
  power law that puts most queries close to the pairs and some far away;
- every other position after the pairs holds a uniformly random token (Zoology's ``random_non_queries``), or
  with ``random_filler=False`` the token 0, which is neither a key nor a value; only the queries are labelled.
  Random filler draws keys too, each of which adds a decoy pair ``k x`` to the context; at Zoology's vocabulary
  of 8192 they are rare, at a small one (the ``cpu`` budget's) they are not.

The grid points are named ``"{L}x{pairs}"``; ``train_batch`` draws each batch at one grid point, chosen at random,
and ``curriculum_batch`` at the easiest point (the fewest pairs, then the shortest). Zoology trains one model per
point; one model trained on the mixed grid from the start stalls at accuracy 1/pairs (it answers with some value
of the context, not the queried key's), and a few hundred steps at the easiest point first form the recall
circuit, which the longer points then reuse (docs/research/synthetic-tasks.md).
"""
from __future__ import annotations

import numpy as np
import torch

from hybrid.checks import check_int

from .base import IGNORE, Batch, Task

ZOOLOGY_GRID = ((64, 4), (128, 8), (256, 16))
POWER_A = 0.01


def point_name(length: int, pairs: int) -> str:
    return f"{length}x{pairs}"


def parse_point(point: str) -> tuple[int, int]:
    try:
        length, pairs = (int(v) for v in point.split("x"))
    except ValueError:
        raise ValueError(f"point: expected 'LENGTHxPAIRS' (e.g. '64x4'), got {point!r}") from None
    return length, pairs


class MQAR(Task):
    name = "mqar"
    score = "all"

    def __init__(self, grid=ZOOLOGY_GRID, vocab_size: int = 8192, power_a: float = POWER_A, random_filler: bool = True):
        self.grid = tuple((int(L), int(p)) for L, p in grid)
        if not self.grid:
            raise ValueError("grid: expected at least one (length, pairs) point, got none")
        if check_int("vocab_size", vocab_size, low=8, what="an even int >= 8") % 2:
            raise ValueError(f"vocab_size: expected an even int >= 8, got {vocab_size!r}")
        for L, p in self.grid:
            if p < 1 or L % 2 or 4 * p > L:
                raise ValueError(f"grid: expected even lengths with 1 <= 4·pairs <= length, got ({L}, {p})")
            if p > vocab_size // 2 - 1:
                raise ValueError(f"vocab_size: {vocab_size} has only {vocab_size // 2 - 1} keys, got pairs={p}")
        if not 0.0 < power_a < 1.0:
            raise ValueError(f"power_a: expected a number in (0, 1), got {power_a!r}")
        if not isinstance(random_filler, bool):
            raise ValueError(f"random_filler: expected True or False, got {random_filler!r}")
        self.V, self.power_a, self.random_filler = vocab_size, float(power_a), random_filler
        self.chance = 2.0 / vocab_size  # a uniform guess among the values
        # tokens are their own ids; the key/value halves and <pad> are named in task.json's params
        self.tokens = {str(i): i for i in range(vocab_size)}

    @property
    def pad_id(self) -> int:
        return 0  # never used: every MQAR sequence at a grid point has the same length

    def params(self) -> dict:
        return {"grid": [list(p) for p in self.grid], "vocab_size": self.V, "power_a": self.power_a,
                "random_filler": self.random_filler}

    def describe(self) -> dict:
        return {"sequence": "k_1 v_1 … k_p v_p, then queries among random tokens", "tokens": "a token is its id",
                "keys": [1, self.V // 2 - 1], "values": [self.V // 2, self.V - 1], "label_at": "each query key",
                "queries": "at 2·pairs + 2·gap, gaps without replacement, P(gap) ∝ a·(gap + 1)^(a − 1)",
                "filler": "uniformly random tokens" if self.random_filler else "token 0"}

    def test_points(self) -> list[str]:
        return [point_name(L, p) for L, p in self.grid]

    def gap_probabilities(self, length: int, pairs: int) -> np.ndarray:
        space = (length - 2 * pairs) // 2
        j = np.arange(1, space + 1, dtype=np.float64)
        p = self.power_a * j ** (self.power_a - 1.0)
        return p / p.sum()

    def sample(self, length: int, pairs: int, n: int, rng: np.random.Generator) -> Batch:
        half = self.V // 2
        keys = np.stack([rng.choice(np.arange(1, half), size=pairs, replace=False) for _ in range(n)])  # (n, p)
        values = np.stack([rng.choice(np.arange(half, self.V), size=pairs, replace=False) for _ in range(n)])
        probs = self.gap_probabilities(length, pairs)
        gaps = np.stack([rng.choice(len(probs), size=pairs, replace=False, p=probs) for _ in range(n)])  # (n, p)
        # the filler (n, L); pairs and queries overwrite it
        ids = rng.integers(0, self.V, size=(n, length)) if self.random_filler else np.zeros((n, length), np.int64)
        ids[:, 0 : 2 * pairs : 2], ids[:, 1 : 2 * pairs : 2] = keys, values
        labels = np.full((n, length), IGNORE, dtype=np.int64)
        query_pos = 2 * pairs + 2 * gaps  # (n, p): key i is queried at query_pos[:, i]
        rows = np.arange(n)[:, None]
        ids[rows, query_pos] = keys
        labels[rows, query_pos] = values
        return Batch(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(labels))

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        L, p = self.grid[int(rng.integers(0, len(self.grid)))]
        return self.sample(L, p, batch_size, rng)

    def valid_batches(self, size: int, rng: np.random.Generator) -> list[Batch]:
        """One batch per grid point, ``size`` split over them: training draws one point a batch, so one training
        batch validated only the point it drew (64x4 under the validation seed, the easiest)."""
        per_point = max(1, -(-size // len(self.grid)))
        return [self.sample(L, p, per_point, rng) for L, p in self.grid]

    def curriculum_batch(self, batch_size: int, rng: np.random.Generator, step: int = 0, steps: int = 1) -> Batch:
        pairs, length = min((p, L) for L, p in self.grid)
        return self.sample(length, pairs, batch_size, rng)

    def test_batch(self, point: str, batch_size: int, rng: np.random.Generator) -> Batch:
        L, p = parse_point(point)
        return self.sample(L, p, batch_size, rng)
