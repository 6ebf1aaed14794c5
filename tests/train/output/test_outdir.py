"""Nothing is overwritten without --overwrite; an overwrite replaces a directory whole; a failed command leaves
nothing behind (hybrid.train.output.outdir): hybrid-import, hybrid-export, hybrid-synthetic, hybrid-bench."""
import json
from pathlib import Path

import pytest
import torch

from hybrid.train.output.outdir import staged_output_dir

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from hybrid.train import load_run  # noqa: E402
from hybrid.train.cli.bench import bench_main  # noqa: E402
from hybrid.train.cli.lm import train_main  # noqa: E402
from hybrid.train.cli.hf import export_main, import_main  # noqa: E402
from hybrid.train.cli import synthetic  # noqa: E402

TINY = ["--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--warmup", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


def snapshot(root: Path) -> dict:
    """Every file's bytes and every folder under ``root``, by relative path."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A trained run with a kept checkpoint: checkpoint/, checkpoint-step-2/, metrics.jsonl, train_config.json."""
    root = tmp_path_factory.mktemp("overwrite")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"doc{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 3)
    out = root / "runs" / "mine"
    mp = pytest.MonkeyPatch()
    mp.setenv("HYBRID_CACHE", str(root / "cache"))
    try:
        assert train_main(["--data", str(corpus), "--steps", "4", "--save-every", "2", "--out", str(out), *TINY]) == 0
    finally:
        mp.undo()
    assert (out / "checkpoint-step-2").is_dir() and (out / "metrics.jsonl").is_file()
    return out


def llama_dir(path: Path, vocab: int = 320) -> Path:
    """The issue's tiny Llama: hidden 64, 2 layers, 4 heads, 2 KV heads; no tokenizer.json."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return llama_dir(tmp_path_factory.mktemp("hf") / "llama")


def test_import_into_an_existing_run_is_refused_and_changes_nothing(run_dir, llama, capsys, one_line_error):
    before = snapshot(run_dir)
    capsys.readouterr()
    assert import_main([str(llama), str(run_dir)]) == 2
    one_line_error(capsys, "hybrid-import", str(run_dir), "not empty", "--overwrite")
    assert snapshot(run_dir) == before


def test_import_with_overwrite_replaces_the_run_whole(run_dir, llama, tmp_path, capsys):
    copy = tmp_path / "mine"
    copy.mkdir()
    for rel, data in snapshot(run_dir).items():
        (copy / rel).mkdir(parents=True, exist_ok=True) if data is None else (copy / rel).write_bytes(data)
    assert import_main([str(llama), str(copy), "--overwrite"]) == 0
    # no old file stays: not the metrics, the config, the plot, nor the kept checkpoint of step 2
    assert sorted(p.name for p in copy.iterdir()) == ["checkpoint"]
    assert load_run(copy).step == 0 and not list(tmp_path.glob(".mine.*"))  # no staging leftovers


def test_export_refuses_a_run_directory_and_a_second_export(run_dir, tmp_path, capsys, one_line_error):
    before = snapshot(run_dir)
    capsys.readouterr()
    assert export_main([str(run_dir), str(run_dir)]) == 2  # the issue's `hybrid-export runs/mine runs/llama`, worst case
    one_line_error(capsys, "hybrid-export", "out_dir")
    assert snapshot(run_dir) == before

    other = tmp_path / "other-run"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"step": 1}\n')
    kept = snapshot(other)
    assert export_main([str(run_dir), str(other)]) == 2
    one_line_error(capsys, "hybrid-export", "not empty", "--overwrite")
    assert snapshot(other) == kept

    hf = tmp_path / "hf"
    assert export_main([str(run_dir), str(hf)]) == 0
    first = snapshot(hf)
    capsys.readouterr()
    assert export_main([str(run_dir), str(hf)]) == 2  # the second export to the same folder
    one_line_error(capsys, "hybrid-export", "not empty", "--overwrite")
    assert snapshot(hf) == first
    (hf / "stale.txt").write_text("from an earlier export")
    assert export_main([str(run_dir), str(hf), "--overwrite"]) == 0
    assert set(snapshot(hf)) == set(first)  # the stale file is gone: a whole new directory


def test_a_failed_import_leaves_no_directory(tmp_path, capsys, one_line_error):
    small = llama_dir(tmp_path / "llama128", vocab=128)  # no tokenizer.json: the byte tokenizer has 259 tokens
    target = tmp_path / "runs" / "llama"
    capsys.readouterr()  # save_pretrained's bar
    assert import_main([str(small), str(target)]) == 2
    one_line_error(capsys, "hybrid-import", "expected a tokenizer.json", "got none, so the byte tokenizer was assumed",
                   "vocab_size=128", "259 tokens do not fit", "tokenizer.json into")
    assert not target.exists() and not (tmp_path / "runs").exists()  # nor the parent it would have created


def test_a_failed_overwrite_keeps_the_old_directory(tmp_path):
    old = tmp_path / "out"
    old.mkdir()
    (old / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="midway"):
        with staged_output_dir(old, overwrite=True) as stage:
            (stage / "a.txt").write_text("new")
            raise RuntimeError("midway")
    assert snapshot(old) == {"a.txt": b"old"} and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with staged_output_dir(old, overwrite=True) as stage:
        (stage / "b.txt").write_text("new")
    assert snapshot(old) == {"b.txt": b"new"}
    with pytest.raises(ValueError, match="working directory"):
        with staged_output_dir(".", overwrite=True):
            pass


def test_the_next_writer_clears_what_a_killed_one_left(tmp_path, capsys):
    """A writer killed outright (no handler runs) leaves its staging directory beside the target; the next writer
    of that target removes it (it holds the lock: no live writer owns one) and names, without touching it, an old
    target left aside between the two renames. Another target's leftovers stay."""
    target = tmp_path / "out"
    for name in (".out.tmp-dead1", ".out.tmp-dead2", ".other.tmp-live"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"partial")
    (tmp_path / ".out.old-k1" / "old").mkdir(parents=True)
    (tmp_path / ".out.old-k1" / "old" / "a.txt").write_text("the old export")
    capsys.readouterr()
    with staged_output_dir(target, overwrite=False) as stage:
        (stage / "b.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-live", ".out.old-k1", "out"]
    assert (tmp_path / ".out.old-k1" / "old" / "a.txt").read_text() == "the old export"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / '.out.old-k1' / 'old'} holds the {target}" in err


def test_synthetic_refuses_a_file_and_a_foreign_directory(tmp_path, capsys, one_line_error):
    a_file = tmp_path / "afile"
    a_file.write_text("mine\n")
    for argv in (["--task", "parity"], ["--suite", "state-tracking"]):
        assert synthetic.main([*argv, "--budget", "smoke", "--out", str(a_file)]) == 2
        one_line_error(capsys, "hybrid-synthetic", "--out: expected a directory, got the file", "afile")
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("keep me\n")
    for argv in (["--task", "parity"], ["--suite", "state-tracking"]):
        assert synthetic.main([*argv, "--budget", "smoke", "--out", str(foreign)]) == 2
        one_line_error(capsys, "hybrid-synthetic", "not empty", "--overwrite")
    assert snapshot(foreign) == {"todo.txt": b"keep me\n"}


def test_bench_refuses_a_file_and_a_foreign_suite_directory(tmp_path, capsys, one_line_error):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert bench_main(["--suite", "baselines", "--out", str(a_file)]) == 2
    one_line_error(capsys, "hybrid-bench", "--out: expected a directory, got the file")
    (tmp_path / "bench" / "baselines").mkdir(parents=True)
    (tmp_path / "bench" / "baselines" / "mine.txt").write_text("x")
    assert bench_main(["--suite", "baselines", "--out", str(tmp_path / "bench")]) == 2
    one_line_error(capsys, "hybrid-bench", "not empty", "--overwrite")
    assert json.dumps(snapshot(tmp_path / "bench"), default=str) == json.dumps({"baselines": None, "baselines/mine.txt": b"x"}, default=str)
