"""Fixtures for the training tests: a private cache directory and tiny corpora on disk."""
import random

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Nothing a test prepares lands in ~/.cache; no test reaches the network."""
    monkeypatch.setenv("HYBRID_CACHE", str(tmp_path / "hybrid-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _words(rng: random.Random, n: int) -> str:
    vocab = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "λ", "μ", "ü"]
    return " ".join(rng.choice(vocab) for _ in range(n))


@pytest.fixture
def corpus_dir(tmp_path):
    """12 small text documents (.txt/.md/.py, two of them in a subdirectory), one binary file, one hidden
    file and one empty file (the last three contribute no documents)."""
    rng = random.Random(0)
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    texts = {}
    for i in range(12):
        name = f"sub/doc{i:02d}.md" if i < 2 else f"doc{i:02d}." + ("txt" if i % 2 else "py")
        texts[name] = f"# document {i}\n" + _words(rng, 40 + 7 * i) + "\n"
        (root / name).write_text(texts[name], encoding="utf-8")
    (root / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (root / ".hidden.txt").write_text("not a document\n")
    (root / "empty.txt").write_text("")
    return root, texts


@pytest.fixture
def corpus(tmp_path):
    """60 small, very regular documents (≈ 9 KB): a tiny model learns them in a few dozen steps."""
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(60):
        body = "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n" for j in range(3))
        (root / f"doc{i:02d}.py").write_text(f"# module {i}\nimport os\n\n{body}", encoding="utf-8")
    return root
