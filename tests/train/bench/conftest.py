"""Fixtures for the hybrid-bench tests: smoke-run flags for the tiny corpus, the records a suite wrote."""
import json

import pytest


@pytest.fixture
def smoke_flags() -> list[str]:
    """The smoke budget at L = 8: the tiny corpus's validation split holds a few hundred tokens, so 8 × L
    sequences fit."""
    return ["--budget", "smoke", "--seq-len", "8", "--steps", "3", "--quiet"]


@pytest.fixture
def records_of():
    """``records_of(directory)``: the records of ``directory/results.jsonl``, in order."""
    return lambda directory: [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]
