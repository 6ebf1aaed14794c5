"""Fixtures for the hybrid-bench tests: smoke-run flags for the tiny corpus, the records a suite wrote, and the
float64 reference of per-target losses."""
import json

import pytest
import torch


def float64_losses(model, seqs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target of ``seqs`` ``(N, T + 1)``, one sequence at a time, from log-softmax in
    float64: ``(N, T)``."""
    rows = []
    with torch.no_grad():
        for seq in seqs:
            logits, _ = model(seq[None, :-1])
            logp = torch.log_softmax(logits[0].double(), dim=-1)  # (T, V)
            rows.append(-logp.gather(1, seq[1:, None]).squeeze(1))
    return torch.stack(rows)


@pytest.fixture
def direct_losses():
    """``direct_losses(model, seqs)``: ``float64_losses``, the reference the bench's losses are checked against."""
    return float64_losses


@pytest.fixture
def smoke_flags() -> list[str]:
    """The smoke budget at L = 8 and window 4: the tiny corpus's validation split holds a few hundred tokens, so
    8 × L sequences fit; the window must be shorter than L (the budget's 8 is refused at L 8)."""
    return ["--budget", "smoke", "--seq-len", "8", "--window", "4", "--steps", "3", "--quiet"]


@pytest.fixture
def records_of():
    """``records_of(directory)``: the records of ``directory/results.jsonl``, in order."""
    return lambda directory: [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]
