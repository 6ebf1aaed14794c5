"""Passkey retrieval (Mohtashami & Jaggi, arXiv 2305.16300; Samba's long-context test, arXiv 2406.07522): find a
k-digit key hidden at some depth of a long haystack and repeat it after a query marker.

A sequence of length L (k = ``key_digits``, F = L − 2k − 1 filler tokens):

    f_1 … f_p  <key> d_1 … d_k  f_{p+1} … f_F  <query> d_1 … d_{k−1}
    labels:                                    d_1     d_2 … d_k          (IGNORE everywhere else)

- the key marker sits at position ``p = round(depth · F)``: depth 0 puts it first, depth 1 right before the query
  (``depth`` is the share of the filler that comes before the key, the needle-in-a-haystack "depth percent");
- the query marker sits at ``L − k``; the last k positions are labelled, teacher-forced: the answer digit j is
  predicted at the position of the query (j = 1) or of digit j − 1, so the exact match (every digit right) is the
  greedy answer;
- the filler: ``passkey`` draws tokens uniformly from ``filler_vocab`` filler tokens that are neither digits nor
  markers; ``passkey-text`` takes a contiguous stretch of bytes of a corpus (the standard library's sources by
  default, ``hybrid.train.data.prepare_data``; training filler from its training split, test filler from its
  validation split) with ``<key>`` and ``<query>`` as two extra token ids after the byte tokenizer's 259: an LM
  passkey test, as in Samba. Natural text holds digits of its own; the markers are what single out the key.

Training draws sequences of ``train_length`` with the key marker uniform over 0 … F, except that a share
``edge_share`` of them (default 0) put it within ``k`` positions of an edge: uniform over 0 … k (the key at the
sequence's start) or F − k … F (the key touching the query), each half the time. Uniform positions draw those
two layouts once in F/(k + 1) sequences, and trained models fail them most (docs/research/passkey/why.md). A run's first
``curriculum_steps`` (``TaskRunConfig``) draw them at ``curriculum_length`` (default a quarter of ``train_length``),
where the retrieval is found several times faster, as MQAR's curriculum (docs/research/synthetic-tasks.md). A list of increasing
lengths (e.g. ``[64, 256]`` before 1024) is a curriculum in stages: the curriculum steps are split into equal runs
of consecutive steps, one per length, in order. Testing covers every
``test_lengths`` × ``depths`` cell with ``samples`` sequences; sample s of a length is one haystack and one key
(drawn from ``numpy.random.default_rng([test_seed, length])``) with the key moved to each depth, so the depths of
a length differ only in where the key is.

Scoring (``scoring.py``): ``score_passkey`` runs the model in chunked mode (``chunk_size`` tokens at a time, each continuing the state), so
memory stays bounded by the chunk and the model's state (a window, a recurrence, or a growing KV cache) whatever the
length; it keeps logits only at the k answer positions. ``task.json`` (``Passkey.to_json``) holds the parameters,
the test keys and a SHA-256 of the test set; for ``passkey-text`` it also holds the test haystacks (base64 of
little-endian uint16 ids), since the corpus differs between machines. ``score_task_json`` scores a model on it.
"""
from __future__ import annotations

import base64
import hashlib
import math
import os
from pathlib import Path

import numpy as np
import torch

from hybrid.checks import check_int

from ..base import IGNORE, Batch, Task
from .scoring import plot_heatmap, score_passkey

KEY_DIGITS = 5
TRAIN_LENGTH = 256
TEST_LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
DEPTHS = 11  # 0 %, 10 %, …, 100 %
SAMPLES = 4
FILLER_VOCAB = 64
TEST_SEED = 3_000_017
FILLERS = ("random", "text")

_STREAMS: dict = {}  # (corpus, cache dir) -> (train stream, valid stream, fingerprint): one load per process


def depth_list(depths) -> tuple[float, ...]:
    """``depths``: a count n (n evenly spaced depths from 0 to 1; one depth is 0.5) or a list of numbers in [0, 1]."""
    if isinstance(depths, (list, tuple)):
        if not depths or not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0.0 <= d <= 1.0
                                 for d in depths):
            raise ValueError(f"depths: expected a count >= 1 or numbers in [0, 1], got {depths!r}")
        return tuple(float(d) for d in depths)
    n = check_int("depths", depths, low=1, what="a count >= 1 or numbers in [0, 1]")
    return (0.5,) if n == 1 else tuple(round(float(d), 6) for d in np.linspace(0.0, 1.0, n))


class Passkey(Task):
    """``passkey`` (``filler="random"``) or ``passkey-text`` (``filler="text"``); see the module docstring."""

    score = "exact"  # every answer digit right (also reported: per-digit accuracy)

    def __init__(self, filler: str = "random", key_digits: int = KEY_DIGITS, train_length: int = TRAIN_LENGTH,
                 test_lengths=TEST_LENGTHS, depths=DEPTHS, samples: int = SAMPLES, filler_vocab: int | None = None,
                 corpus: str | None = None, test_seed: int = TEST_SEED, curriculum_length=None,
                 edge_share: float = 0.0):
        if filler not in FILLERS:
            raise ValueError(f"filler: expected one of {FILLERS}, got {filler!r}")
        self.filler = filler
        self.name = "passkey-text" if filler == "text" else "passkey"
        self.k = check_int("key_digits", key_digits, low=1, high=32)
        shortest = 2 * self.k + 2  # at least one filler token
        at_least = f"an int >= {shortest} (2·key_digits + 2)"
        self.train_length = check_int("train_length", train_length, low=shortest, what=at_least)
        if not isinstance(test_lengths, (list, tuple)) or not test_lengths:
            raise ValueError(f"test_lengths: expected a non-empty list of ints >= {shortest}, got {test_lengths!r}")
        self.test_lengths = tuple(check_int("test_lengths", n, low=shortest, what=at_least) for n in test_lengths)
        if len(set(self.test_lengths)) != len(self.test_lengths):
            raise ValueError(f"test_lengths: expected distinct lengths, got {list(test_lengths)}")
        self.curriculum_lengths = self._curriculum(curriculum_length, shortest)
        self.depths = depth_list(depths)
        self.samples = check_int("samples", samples, low=1, what="a positive int")
        self.test_seed = check_int("test_seed", test_seed, low=0, what="an int >= 0")
        if isinstance(edge_share, bool) or not isinstance(edge_share, (int, float)) or not 0.0 <= edge_share <= 1.0:
            raise ValueError(f"edge_share: expected a share in [0, 1], got {edge_share!r}")
        self.edge_share = float(edge_share)
        if filler == "random":
            if corpus is not None:
                raise ValueError(f"corpus: only the text filler (passkey-text) reads a corpus, got {corpus!r}")
            self.filler_vocab = check_int("filler_vocab", FILLER_VOCAB if filler_vocab is None else filler_vocab,
                                          low=1, what="a positive int")
            self.corpus = None
            symbols = [str(d) for d in range(10)] + ["<key>", "<query>", "<pad>"]
            symbols += [f"<f{i}>" for i in range(self.filler_vocab)]
            self.tokens = {s: i for i, s in enumerate(symbols)}
            self.filler_ids = np.arange(13, 13 + self.filler_vocab, dtype=np.int64)
            self.digit_ids = np.arange(10, dtype=np.int64)
        else:
            if filler_vocab is not None:
                raise ValueError(f"filler_vocab: the text filler takes its tokens from the corpus, got "
                                 f"{filler_vocab!r}")
            if corpus is not None and not isinstance(corpus, (str, os.PathLike)):
                raise ValueError(f"corpus: expected None (the standard library) or a path / hub name, got {corpus!r}")
            self.filler_vocab, self.corpus = None, None if corpus is None else str(corpus)
            from ...data.tokenizer import ByteTokenizer

            byte = ByteTokenizer()
            names = {b: (chr(b) if 48 <= b <= 57 else f"<0x{b:02X}>") for b in range(256)}  # digits by name
            self.tokens = {names[b]: b for b in range(256)}
            self.tokens.update({byte.specials[i]: i for i in sorted(byte.specials)})
            self.tokens.update({"<key>": byte.vocab_size, "<query>": byte.vocab_size + 1})
            self.digit_ids = np.arange(ord("0"), ord("9") + 1, dtype=np.int64)
        self.key_id, self.query_id = self.tokens["<key>"], self.tokens["<query>"]
        self.chance = 0.1 ** self.k  # a uniform guess of all k digits

    def _curriculum(self, lengths, shortest: int) -> tuple[int, ...]:
        """``curriculum_length``: None (a quarter of ``train_length``), one length, or a list of increasing lengths
        (the stages), each in [shortest, train_length]."""
        if lengths is None:
            return (max(shortest, self.train_length // 4),)
        what = f"an int in [{shortest}, train_length={self.train_length}] or a list of increasing ones"
        if isinstance(lengths, (list, tuple)):
            if not lengths:
                raise ValueError(f"curriculum_length: expected {what}, got {lengths!r}")
            stages = tuple(check_int("curriculum_length", n, low=shortest, high=self.train_length, what=what)
                           for n in lengths)
            if any(a >= b for a, b in zip(stages, stages[1:])):
                raise ValueError(f"curriculum_length: expected {what}, got {list(lengths)}")
            return stages
        return (check_int("curriculum_length", lengths, low=shortest, high=self.train_length, what=what),)

    @property
    def curriculum_length(self) -> int:
        """The first (shortest) curriculum length."""
        return self.curriculum_lengths[0]

    # ------------------------------------------------------------------------------------------ description

    def params(self) -> dict:
        stages = self.curriculum_lengths
        out = {"key_digits": self.k, "train_length": self.train_length,
               "curriculum_length": stages[0] if len(stages) == 1 else list(stages),
               "test_lengths": list(self.test_lengths),
               "depths": list(self.depths), "samples": self.samples, "test_seed": self.test_seed}
        if self.edge_share:  # absent at 0, so the task.json of a run without it reads as before
            out["edge_share"] = self.edge_share
        if self.filler == "random":
            out["filler_vocab"] = self.filler_vocab
        else:
            out["corpus"] = self.corpus
        return out

    def describe(self) -> dict:
        k = self.k
        return {
            "sequence": "filler[:p] <key> d_1 … d_k filler[p:] <query> d_1 … d_(k−1); length L, "
                        "F = L − 2k − 1 filler tokens",
            "key_marker_at": "p = floor(depth · F + 0.5)", "key_digits_at": "p + 1 … p + k",
            "query_at": "L − k",
            "label_at": f"the last {k} positions, L − k … L − 1: d_1 … d_k (teacher-forced)",
            "digits": {str(d): int(i) for d, i in zip(range(10), self.digit_ids)},
            "filler": (f"uniform over the {self.filler_vocab} tokens <f0> … <f{self.filler_vocab - 1}> (no digit, no "
                       "marker)" if self.filler == "random" else
                       "a contiguous stretch of the corpus's byte stream (training split for training, validation "
                       "split for the test set; documents joined by <eos>)"),
            "train": f"length {self.train_length} (a run's first curriculum steps: "
                     f"{', then '.join(map(str, self.curriculum_lengths))}"
                     f"{' in equal shares' if len(self.curriculum_lengths) > 1 else ''}), "
                     + ("p uniform over 0 … F" if not self.edge_share else
                        f"p uniform over 0 … F, except a share {self.edge_share:g} with p uniform over 0 … k or "
                        "F − k … F (each half the time)") + ", digits uniform",
            "test": "every (length, depth) cell: sample s of a length is one haystack and one key, the key moved "
                    "to each depth; haystacks and keys from numpy.random.default_rng([test_seed, length]): "
                    + ("filler = rng.choice(filler ids, size=(samples, F)), then keys = rng.integers(0, 10, "
                       "size=(samples, k))" if self.filler == "random" else
                       "for each sample, a start uniform in [0, len(valid) − F), then the keys"),
            "score": "exact match (all k digits the argmax) and per-digit accuracy, per cell",
        }

    def test_points(self) -> list[str]:
        return [str(n) for n in self.test_lengths]

    def filler_count(self, length: int) -> int:
        return length - 2 * self.k - 1

    def key_position(self, length: int, depth: float) -> int:
        """Where the key marker of a sequence of ``length`` at ``depth`` sits (its digits follow)."""
        return int(math.floor(depth * self.filler_count(length) + 0.5))

    def key_distance(self, length: int, depth: float) -> int:
        """Tokens from the key's last digit to the query marker (1: the key right before the query)."""
        return self.query_position(length) - (self.key_position(length, depth) + self.k)

    def query_position(self, length: int) -> int:
        return length - self.k

    def beyond_window_share(self, window: int) -> float:
        """The share of training sequences whose key marker is more than ``window`` − 1 tokens before the query,
        i.e. outside a sliding window of ``window`` tokens seen from the query."""
        F_ = self.filler_count(self.train_length)
        return sum(1 for p in range(F_ + 1) if self.query_position(self.train_length) - p >= window) / (F_ + 1)

    # ------------------------------------------------------------------------------------------ the filler

    def filler_streams(self) -> tuple[np.ndarray, np.ndarray, str]:
        """The corpus's training and validation byte streams (text filler), prepared once per process."""
        from ...data import default_cache_dir, prepare_data
        from ...data.tokenizer import ByteTokenizer

        key = (self.corpus, str(default_cache_dir()))
        if key not in _STREAMS:
            data = prepare_data(self.corpus, tokenizer=ByteTokenizer())
            _STREAMS[key] = (np.asarray(data.train), np.asarray(data.valid), data.stats["fingerprint"])
        return _STREAMS[key]

    def haystacks(self, length: int, n: int, rng: np.random.Generator, split: str = "train") -> np.ndarray:
        """``(n, F)`` int64 filler rows for sequences of ``length``."""
        F_ = self.filler_count(length)
        if self.filler == "random":
            return rng.choice(self.filler_ids, size=(n, F_))
        train, valid, _ = self.filler_streams()
        stream = train if split == "train" else valid
        if len(stream) <= F_:
            raise ValueError(f"test_lengths: the corpus's {split} split has {len(stream)} tokens, too few for "
                             f"{F_} filler tokens (length {length})")
        starts = rng.integers(0, len(stream) - F_, size=n)
        return np.stack([stream[s : s + F_] for s in starts]).astype(np.int64)

    # ------------------------------------------------------------------------------------------ sequences

    def build(self, haystacks: np.ndarray, keys: np.ndarray, positions) -> Batch:
        """Sequences from filler rows ``(n, F)``, key digits ``(n, k)`` (values 0–9) and key-marker positions
        ``(n,)`` (each in 0 … F): ids and labels ``(n, F + 2k + 1)``."""
        n, F_ = haystacks.shape
        k, L = self.k, F_ + 2 * self.k + 1
        positions = np.broadcast_to(np.asarray(positions, dtype=np.int64), (n,))
        digits = self.digit_ids[keys]  # (n, k) token ids
        ids = np.empty((n, L), dtype=np.int64)
        for i in range(n):
            p = int(positions[i])
            if not 0 <= p <= F_:
                raise ValueError(f"positions: expected key positions in [0, {F_}], got {p}")
            ids[i] = np.concatenate([haystacks[i, :p], [self.key_id], digits[i], haystacks[i, p:], [self.query_id],
                                     digits[i, :-1]])
        labels = np.full((n, L), IGNORE, dtype=np.int64)
        labels[:, L - k:] = digits
        return Batch(torch.from_numpy(ids), torch.from_numpy(labels))

    def sample(self, length: int, n: int, rng: np.random.Generator, split: str = "train",
               edge_share: float = 0.0) -> Batch:
        """``n`` sequences of ``length`` with the key marker uniform over 0 … F, or with probability
        ``edge_share`` uniform over the k + 1 positions at one edge (0 … k or F − k … F, either edge alike)."""
        haystacks = self.haystacks(length, n, rng, split)
        keys = rng.integers(0, 10, size=(n, self.k))
        F_ = self.filler_count(length)
        positions = rng.integers(0, F_ + 1, size=n)
        if edge_share:  # no extra draws at 0: the sequences of a run without it are unchanged
            band = min(self.k, F_)  # (n,) offsets 0 … k from the chosen edge
            at_edge = rng.random(n) < edge_share
            offset = rng.integers(0, band + 1, size=n)
            at_end = rng.random(n) < 0.5
            positions = np.where(at_edge, np.where(at_end, F_ - offset, offset), positions)
        return self.build(haystacks, keys, positions)

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        return self.sample(self.train_length, batch_size, rng, "train", self.edge_share)

    def curriculum_stage(self, step: int, steps: int) -> int:
        """The curriculum length of curriculum step ``step`` (0-based) of ``steps``: stage ``step · n // steps`` of
        the n lengths, so each length gets an equal run of consecutive steps (when n does not divide ``steps``, some
        get one step more: 3 lengths over 4 steps take 2, 1, 1; 4 over 10 take 3, 2, 3, 2)."""
        return self.curriculum_lengths[min(step * len(self.curriculum_lengths) // max(steps, 1),
                                           len(self.curriculum_lengths) - 1)]

    def curriculum_batch(self, batch_size: int, rng: np.random.Generator, step: int = 0, steps: int = 1) -> Batch:
        """The easier setting a run starts with: sequences of the curriculum length of this stage (the key nearer
        the query)."""
        return self.sample(self.curriculum_stage(step, steps), batch_size, rng, "train", self.edge_share)

    def test_batch(self, point: str, batch_size: int, rng: np.random.Generator) -> Batch:
        """Sequences of length ``point`` at random depths, from the test split (the test set proper is ``test_set``)."""
        return self.sample(int(point), batch_size, rng, "valid")

    def test_set(self) -> dict:
        """``{length: (haystacks (samples, F), keys (samples, k))}``, regenerated from ``test_seed``."""
        out = {}
        for length in self.test_lengths:
            rng = np.random.default_rng([self.test_seed, length])
            haystacks = self.haystacks(length, self.samples, rng, "valid")
            out[length] = (haystacks, rng.integers(0, 10, size=(self.samples, self.k)))
        return out

    def cell_batch(self, test_set: dict, length: int) -> Batch:
        """Every sequence of one length: row ``d · samples + s`` is sample s at depth ``depths[d]``."""
        haystacks, keys = test_set[length]
        positions = [self.key_position(length, d) for d in self.depths for _ in range(self.samples)]
        reps = len(self.depths)
        return self.build(np.tile(haystacks, (reps, 1)), np.tile(keys, (reps, 1)), positions)

    # ------------------------------------------------------------------------------------------ task.json

    def to_json(self, test_set: dict | None = None) -> dict:
        test_set = self.test_set() if test_set is None else test_set
        out = super().to_json()
        spec = {
            "seed": self.test_seed, "sha256": test_set_digest(test_set),
            "keys": {str(n): ["".join(map(str, row)) for row in keys.tolist()] for n, (_, keys) in test_set.items()},
            "key_positions": {str(n): [self.key_position(n, d) for d in self.depths] for n in test_set},
            "rows": "for each length, row d·samples + s is sample s at depths[d]",
        }
        if self.filler == "text":
            spec["corpus_fingerprint"] = self.filler_streams()[2]
            spec["haystacks"] = {str(n): base64.b64encode(h.astype("<u2").tobytes()).decode("ascii")
                                 for n, (h, _) in test_set.items()}
            spec["haystack_encoding"] = "base64 of little-endian uint16 ids, shape (samples, length − 2k − 1)"
        out["test_set"] = spec
        return out

    def test_set_from_json(self, spec: dict) -> dict:
        """The test set a ``to_json()`` dict describes: decoded haystacks when it holds them, else regenerated
        from the seed; checked against its SHA-256."""
        stored = spec.get("test_set", {})
        if "haystacks" in stored:
            test_set = {}
            for n in self.test_lengths:
                raw = np.frombuffer(base64.b64decode(stored["haystacks"][str(n)]), dtype="<u2").astype(np.int64)
                keys = np.array([[int(c) for c in key] for key in stored["keys"][str(n)]], dtype=np.int64)
                test_set[n] = (raw.reshape(self.samples, self.filler_count(n)), keys)
        else:
            test_set = self.test_set()
        digest = test_set_digest(test_set)
        if stored.get("sha256") not in (None, digest):
            raise ValueError(f"task.json: expected test sequences with sha256 {stored['sha256']}, regenerated {digest} "
                             "(a different numpy generator or generator version)")
        return test_set

    # ------------------------------------------------------------------------------------------ scoring hooks

    def evaluate(self, model, eval_size: int, device) -> dict:
        """``train_task``'s scoring (``eval_size`` is unused: the test set is the task's own)."""
        return score_passkey(model, self, device)

    def write_figures(self, out, results: dict) -> None:
        """``train_task``'s figures: the needle-in-a-haystack heatmap of a run, ``passkey.png``."""
        grid = results["passkey"]
        plot_heatmap(Path(out) / "passkey.png", grid["lengths"], grid["depths"], grid["exact"],
                     title=f"{self.name}: exact match")


def test_set_digest(test_set: dict) -> str:
    """SHA-256 over each length's haystacks (uint16 LE) and keys (uint8), in order of length."""
    h = hashlib.sha256()
    for n in sorted(test_set):
        haystacks, keys = test_set[n]
        h.update(str(n).encode())
        h.update(np.ascontiguousarray(haystacks, dtype="<u2").tobytes())
        h.update(np.ascontiguousarray(keys, dtype="u1").tobytes())
    return h.hexdigest()
