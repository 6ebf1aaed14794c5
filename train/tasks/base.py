"""What every synthetic task provides: a token map, seeded batches with labels at the task's positions, and the
points it is tested at.

A batch is ``(ids, labels)``, both ``(N, T)`` int64. ``labels[n, t]`` is the token the model must predict AT
position t (not the next input), or ``IGNORE`` (-100) where the task asks nothing. Sequences of different lengths
are right-padded with the task's ``<pad>`` token and ``IGNORE`` labels; a causal model never sees the padding
from a real position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

IGNORE = -100


@dataclass(frozen=True)
class Batch:
    ids: torch.Tensor  # (N, T) int64
    labels: torch.Tensor  # (N, T) int64, IGNORE where unlabelled


def pad_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> Batch:
    """Right-pad ``[(ids, labels), …]`` (each a list of equal length per row) to one ``(N, T_max)`` batch."""
    t_max = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), t_max), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), t_max), IGNORE, dtype=torch.long)
    for n, (row_ids, row_labels) in enumerate(rows):
        ids[n, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
        labels[n, : len(row_labels)] = torch.tensor(row_labels, dtype=torch.long)
    return Batch(ids, labels)


def rng_of(seed: int) -> np.random.Generator:
    """The one random source of every generator: ``numpy.random.default_rng(seed)`` (PCG64)."""
    return np.random.default_rng(seed)


class Task:
    """Base of the synthetic tasks. Subclasses set ``name``, ``tokens`` (the token map: token string -> id, ids
    ``0 … vocab_size − 1``), ``chance`` (accuracy of a uniform guess over the answer set), ``score`` ("last":
    the last labelled position of each test sequence; "all": every labelled position), and implement
    ``train_batch`` and ``test_batch``."""

    name: str
    tokens: dict[str, int]
    chance: float
    score: str = "last"

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def pad_id(self) -> int:
        return self.tokens["<pad>"]

    def test_points(self) -> list[str]:
        """Names of the test points, in order (e.g. the test lengths "40", "64", … or MQAR's "64x4")."""
        raise NotImplementedError

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        raise NotImplementedError

    def valid_batches(self, size: int, rng: np.random.Generator) -> list[Batch]:
        """Fresh sequences of the training distribution for validation, ``size`` in all: batches whose figures are
        averaged, each batch's own mean taken as training takes it. By default one training batch (a task whose
        training batch mixes its lengths in one batch)."""
        return [self.train_batch(size, rng)]

    def curriculum_batch(self, batch_size: int, rng: np.random.Generator, step: int = 0, steps: int = 1) -> Batch:
        """A training batch of the task's easiest setting, drawn for a run's first ``curriculum_steps`` steps
        (``TaskRunConfig``); this is curriculum step ``step`` (0-based) of ``steps``, for a task whose curriculum has
        stages (passkey). By default the ordinary training batch: no curriculum."""
        return self.train_batch(batch_size, rng)

    def test_batch(self, point: str, batch_size: int, rng: np.random.Generator) -> Batch:
        raise NotImplementedError

    @property
    def longest_train_length(self) -> int | None:
        """The longest training length of a task that is tested on longer sequences (state tracking), whose
        ``train_batch`` then takes ``longest=`` (a length curriculum) and whose ``test_batch`` takes any length as
        its point; None for the others."""
        return None

    def params(self) -> dict:
        """The generator's constructor arguments: ``make_task(name, **params())`` rebuilds it (task.json)."""
        raise NotImplementedError

    def describe(self) -> dict:
        """How sequences are laid out, in words and numbers, for readers of task.json."""
        return {}

    def to_json(self) -> dict:
        """Everything needed to score a trained model on sequences generated elsewhere (task.json)."""
        return {
            "task": self.name, "params": self.params(), "format": self.describe(), "tokens": dict(self.tokens),
            "vocab_size": self.vocab_size, "pad": self.pad_id,
            "ignore_label": IGNORE, "score": self.score, "chance": self.chance, "test_points": self.test_points(),
            "labels": "labels[t] is the token to predict at position t (its own position, not the next one); "
                      f"{IGNORE} where nothing is asked",
        }


def scaled_accuracy(accuracy: float, chance: float) -> float:
    """Grazzi et al.'s scaling: (acc − chance) / (1 − chance); 1 = perfect, 0 = chance."""
    if not 0.0 <= chance < 1.0 or math.isnan(accuracy):
        return float("nan")
    return (accuracy - chance) / (1.0 - chance)
