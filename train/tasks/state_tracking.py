"""State-tracking tasks (Grazzi et al., arXiv 2411.12537; Deletang et al., arXiv 2207.02098): parity and modular
arithmetic mod 5, trained on lengths 3–40 and tested at 40, 64, 128 and 256.

Every sequence starts with ``<bos>`` (position 0, never labelled); its length is the number of task tokens after
it. The answer at a test length is read at the last labelled position.

- ``parity``: bits ``0`` / ``1``; the label at every bit is the parity of the bits so far (token ``0`` or ``1``).
- ``mod5``: ``d (op d)* =`` with digits 0–4 and ops ``+ - *``, evaluated left to right mod 5 (``2 + 3 * 4`` is
  ``(2 + 3) * 4 = 0``); the label is the value, at ``=``.
- ``mod5-brackets``: the same with brackets; inside each bracket pair, left to right.
  Grammar: ``E = T (op T)*``, ``T = d | ( E )``.

A modular expression has an odd number of tokens (1, 3, 5, …), so with ``=`` a sequence has an even length; a
requested odd length gives the next shorter one.
"""
from __future__ import annotations

import numpy as np

from .base import IGNORE, Batch, Task, pad_batch

TRAIN_LENGTHS = (3, 40)  # inclusive range of training lengths
TEST_LENGTHS = (40, 64, 128, 256)
MODULUS = 5
OPS = ("+", "-", "*")


def _check_lengths(train_lengths, test_lengths, shortest: int) -> tuple[tuple[int, int], tuple[int, ...]]:
    lo, hi = (int(v) for v in train_lengths)
    if not shortest <= lo <= hi:
        raise ValueError(f"train_lengths: expected {shortest} <= low <= high, got {tuple(train_lengths)}")
    tests = tuple(int(v) for v in test_lengths)
    if not tests or min(tests) < shortest:
        raise ValueError(f"test_lengths: expected lengths >= {shortest}, got {tests}")
    return (lo, hi), tests


class LengthTask(Task):
    """A task trained on lengths ``train_lengths`` (inclusive range) and tested at ``test_lengths``; subclasses
    give ``sample(length, rng) -> (ids, labels)``. Any length is a test point (``test_batch("80", …)``)."""

    train_lengths: tuple[int, int]
    test_lengths: tuple[int, ...]

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        raise NotImplementedError

    def test_points(self) -> list[str]:
        return [str(n) for n in self.test_lengths]

    @property
    def longest_train_length(self) -> int:
        return self.train_lengths[1]

    def train_batch(self, batch_size: int, rng: np.random.Generator, longest: int | None = None) -> Batch:
        """Lengths uniform in ``train_lengths``, or up to ``longest`` instead (a length curriculum)."""
        hi = self.train_lengths[1] if longest is None else max(int(longest), self.train_lengths[0])
        lengths = rng.integers(self.train_lengths[0], hi + 1, size=batch_size)
        return pad_batch([self.sample(int(n), rng) for n in lengths], self.pad_id)

    def test_batch(self, point: str, batch_size: int, rng: np.random.Generator) -> Batch:
        return pad_batch([self.sample(int(point), rng) for _ in range(batch_size)], self.pad_id)


class Parity(LengthTask):
    name = "parity"
    chance = 0.5
    score = "last"

    def __init__(self, train_lengths=TRAIN_LENGTHS, test_lengths=TEST_LENGTHS):
        self.train_lengths, self.test_lengths = _check_lengths(train_lengths, test_lengths, 1)
        self.tokens = {"0": 0, "1": 1, "<bos>": 2, "<pad>": 3}

    def params(self) -> dict:
        return {"train_lengths": list(self.train_lengths), "test_lengths": list(self.test_lengths)}

    def describe(self) -> dict:
        return {"sequence": "<bos> bits", "label_at": "every bit: the parity of the bits so far",
                "length": "bits after <bos>"}

    def example(self, bits) -> tuple[list[int], list[int]]:
        """``(ids, labels)`` of one bit sequence: ``[<bos>, b_1 … b_n]`` and ``[IGNORE, b_1, b_1⊕b_2, …]``."""
        bits = [int(b) for b in bits]
        parity = np.cumsum(bits) % 2
        return [self.tokens["<bos>"]] + bits, [IGNORE] + [int(p) for p in parity]

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        return self.example(rng.integers(0, 2, size=length))



def evaluate_expression(tokens: list[str], modulus: int = MODULUS) -> int:
    """Value of ``tokens`` (digits, ``+ - *``, brackets), left to right inside each bracket pair, mod ``modulus``."""
    stack: list[tuple[int, str | None]] = []
    value, pending = 0, None  # running value of the current bracket level; the operator waiting for its operand

    def apply(left: int, op: str | None, right: int) -> int:
        if op is None:
            return right
        if op == "+":
            return (left + right) % modulus
        if op == "-":
            return (left - right) % modulus
        return (left * right) % modulus

    def broken() -> ValueError:
        return ValueError(f"tokens: expected a complete expression, got {' '.join(tokens)!r}")

    want_operand = True  # at the start, after an operator and after "("
    for tok in tokens:
        is_operand_start = tok in ("(",) or (len(tok) == 1 and tok.isdigit())
        if is_operand_start != want_operand:
            raise broken()
        if tok.isdigit():
            value, pending, want_operand = apply(value, pending, int(tok)), None, False
        elif tok in OPS:
            pending, want_operand = tok, True
        elif tok == "(":
            stack.append((value, pending))
            value, pending = 0, None
        elif tok == ")":
            if not stack:
                raise broken()
            inner = value
            value, pending = stack.pop()
            value, pending = apply(value, pending, inner), None
        else:
            raise ValueError(f"tokens: expected digits, {OPS} or brackets, got {tok!r}")
    if stack or want_operand:
        raise broken()
    return value


class ModularArithmetic(LengthTask):
    """``mod5`` (``brackets=False``) or ``mod5-brackets``."""

    chance = 1.0 / MODULUS
    score = "last"

    def __init__(self, brackets: bool = False, train_lengths=TRAIN_LENGTHS, test_lengths=TEST_LENGTHS,
                 bracket_probability: float = 0.3):
        self.brackets = bool(brackets)
        self.name = "mod5-brackets" if self.brackets else "mod5"
        self.train_lengths, self.test_lengths = _check_lengths(train_lengths, test_lengths, 2)
        if not 0.0 <= bracket_probability < 1.0:
            raise ValueError(f"bracket_probability: expected a number in [0, 1), got {bracket_probability!r}")
        self.bracket_probability = float(bracket_probability)
        symbols = [str(d) for d in range(MODULUS)] + list(OPS) + (["(", ")"] if self.brackets else [])
        symbols += ["=", "<bos>", "<pad>"]
        self.tokens = {s: i for i, s in enumerate(symbols)}

    def params(self) -> dict:
        return {"bracket_probability": self.bracket_probability, "train_lengths": list(self.train_lengths),
                "test_lengths": list(self.test_lengths)}

    def describe(self) -> dict:
        return {"sequence": "<bos> expression =", "modulus": MODULUS, "brackets": self.brackets,
                "evaluation": "left to right inside each bracket pair", "label_at": "=",
                "length": "tokens after <bos>; even (an odd request gives one fewer)"}

    def example(self, expression: list[str]) -> tuple[list[int], list[int]]:
        """``(ids, labels)`` of ``[<bos>] + expression + [=]``, labelled with the value at ``=`` only."""
        ids = [self.tokens["<bos>"]] + [self.tokens[s] for s in expression] + [self.tokens["="]]
        labels = [IGNORE] * (len(ids) - 1) + [self.tokens[str(evaluate_expression(expression))]]
        return ids, labels

    def expression(self, n_tokens: int, rng: np.random.Generator) -> list[str]:
        """A random expression of exactly ``n_tokens`` tokens (odd; an even count gives one fewer)."""
        n_tokens -= 1 - n_tokens % 2
        if not self.brackets:
            digits = rng.integers(0, MODULUS, size=(n_tokens + 1) // 2)
            ops = rng.integers(0, len(OPS), size=len(digits) - 1)
            out = [str(digits[0])]
            for op, d in zip(ops, digits[1:]):
                out += [OPS[op], str(d)]
            return out
        return self._bracketed(n_tokens, rng)

    def _bracketed(self, n: int, rng: np.random.Generator) -> list[str]:
        """``E = T (op T)*`` of n (odd) tokens, iteratively: terms are digits or ``( E )`` of odd length ≥ 3."""
        out: list[str] = []
        while True:
            # the next term's length: the whole rest (if it is the last term), or an odd length leaving ≥ 1
            if n >= 3 and rng.random() < self.bracket_probability:
                term = int(rng.integers(0, (n - 1) // 2)) * 2 + 3  # odd, 3 … n
                out += ["("] + self._bracketed(term - 2, rng) + [")"]
            else:
                term = 1
                out.append(str(int(rng.integers(0, MODULUS))))
            n -= term
            if n == 0:
                return out
            out.append(OPS[int(rng.integers(0, len(OPS)))])
            n -= 1

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """A sequence of ``length`` task tokens (expression and ``=``; an odd length gives one fewer)."""
        return self.example(self.expression(length - 1, rng))

