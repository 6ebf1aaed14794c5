"""Fixtures for the training tests: a private cache directory, tiny corpora on disk, a tiny trained run, the
one-line CLI error check."""
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


@pytest.fixture
def one_line_error():
    """``one_line_error(capsys, prog, *needles)``: asserts that stderr, read from ``capsys``, is the one line
    ``{prog}: error: …`` without a traceback and holds every needle; returns it."""
    def check(capsys, prog: str, *needles: str) -> str:
        err = capsys.readouterr().err
        assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
        for needle in needles:
            assert needle in err, err
        return err
    return check


@pytest.fixture
def train_run(corpus, tmp_path_factory):
    """``train_run(name, steps, flags)``: ``hybrid-train --quiet`` for ``steps`` steps on ``corpus`` into a new
    ``runs*/name`` directory, which it returns."""
    from hybrid.train.cli.lm import train_main

    def train(name: str, steps: int, flags: list[str]):
        out = tmp_path_factory.mktemp("runs") / name
        assert train_main(["--data", str(corpus), "--out", str(out), "--steps", str(steps), *flags, "--quiet"]) == 0
        return out
    return train
