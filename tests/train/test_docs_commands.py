"""The offline tokenizer recipe of docs/training.md ("A tokenizer.json") works as written."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.train.cli.lm import train_main

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "training.md").read_text(encoding="utf-8")


def tokenizer_commands() -> list[str]:
    section = DOC[DOC.index("### A `tokenizer.json`"):]
    (block,) = re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)[:1]
    return [line for line in block.splitlines() if line.strip()]


def test_the_documented_tokenizer_is_trained_offline_and_trains_a_model(tmp_path, corpus):
    pytest.importorskip("tokenizers", reason="tokenizers not installed (it is in the test extra: pip install -e '.[test]')")
    train_tokenizer, train_model = tokenizer_commands()
    assert train_tokenizer.startswith(".venv/bin/python -c ") and "stdlib_files()" in train_tokenizer
    command = train_tokenizer.replace(".venv/bin/python", sys.executable, 1)
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]

    from hybrid.train.data.tokenizer import FileTokenizer

    tok = FileTokenizer(tmp_path / "tokenizer.json")
    from tokenizers import Tokenizer as HFTokenizer

    eos = HFTokenizer.from_file(str(tmp_path / "tokenizer.json")).token_to_id("<|endoftext|>")  # read from the file
    assert tok.vocab_size == 4096 and tok.eos_id == eos
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text)) == text and len(tok.encode(text)) < len(text.encode()) / 2

    assert train_model.startswith(".venv/bin/hybrid-train --tokenizer tokenizer.json")
    words = train_model.split()[1:]
    tiny = ["--data", str(corpus), "--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads",
            "2", "--seq-len", "16", "--batch-size", "2", "--steps", "2", "--eval-batches", "1", "--device", "cpu",
            "--quiet"]
    monkey = pytest.MonkeyPatch()
    monkey.chdir(tmp_path)
    try:
        assert train_main([*words, *tiny]) == 0
    finally:
        monkey.undo()
    import json

    config = json.loads((tmp_path / "runs" / "bpe" / "checkpoint" / "config.json").read_text())
    assert config["vocab_size"] == 4096
