"""The output-path rule for every command (hybrid.train.outdir.check_apart): no output path is, holds or lies inside
an input path (a run, a teacher, a model folder, data, a tokenizer, a config file, an include path), with or without
--overwrite, symlinks resolved. Each command is called with its output at each of those places relative to each of
its inputs; every call is one line and exit 2, and the input is left exactly as it was.

hybrid-generate writes no file (it prints), so it has no output to check."""
import json
import os
from pathlib import Path

import pytest

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.cli.bench import bench_main
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint
from hybrid.train.cli.lm import train_main
from hybrid.train.cli.distill import main as distill_main
from hybrid.train.cli.hf import eval_main, export_main, import_main
from hybrid.train.cli.rope_analyze import analyze_main
from hybrid.train.cli.synthetic import main as synthetic_main
from hybrid.train.data.tokenizer import ByteTokenizer


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def inputs(tmp_path):
    """Every kind of input a command reads, each in a folder of its own under ``tmp_path/in``."""
    root = tmp_path / "in"
    run = root / "run"  # a run directory (a teacher, an --init-from run, a model to export or analyse)
    config = HybridConfig.preset("transformer", d_model=16, n_layers=2, n_heads=2, vocab_size=320)
    save_checkpoint(run, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()})
    (run / "config.json").write_text("{}")  # read as a transformers folder by hybrid-import
    texts = root / "texts"
    texts.mkdir()
    for i in range(4):
        (texts / f"doc{i}.txt").write_text(f"document {i}\n" * 20)
    tokdir = root / "tok"
    tokdir.mkdir()
    (tokdir / "tokenizer.json").write_text("{}")
    confdir = root / "conf"
    confdir.mkdir()
    (confdir / "run.toml").write_text("steps = 3\n")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "t.yaml").write_text("task: t\n")
    return {"run": run, "texts": texts, "tokenizer": tokdir / "tokenizer.json", "config": confdir / "run.toml",
            "tasks": tasks}


TINY = ["--preset", "transformer", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--steps", "1",
        "--device", "cpu", "--quiet"]

# (program, main, the input it reads, argv(input paths, out)); each command names its input as given
CASES = [
    ("hybrid-train", train_main, "texts", lambda p, out: ["--data", str(p["texts"]), *TINY, "--out", out]),
    ("hybrid-train", train_main, "run", lambda p, out: ["--init-from", str(p["run"]), "--steps", "1", "--quiet",
                                                        "--out", out]),
    ("hybrid-train", train_main, "tokenizer", lambda p, out: ["--tokenizer", str(p["tokenizer"]), *TINY, "--out", out]),
    ("hybrid-train", train_main, "config", lambda p, out: ["--config", str(p["config"]), "--quiet", "--out", out]),
    ("hybrid-distill", distill_main, "run", lambda p, out: ["--teacher", str(p["run"]), "--pattern", "R", "--quiet",
                                                            "--out", out]),
    ("hybrid-distill", distill_main, "texts", lambda p, out: ["--teacher", str(p["run"]), "--data", str(p["texts"]),
                                                              "--pattern", "R", "--quiet", "--out", out]),
    ("hybrid-synthetic", synthetic_main, "run", lambda p, out: ["--task", "passkey-text", "--init-from", str(p["run"]),
                                                                "--budget", "smoke", "--out", out]),
    ("hybrid-export", export_main, "run", lambda p, out: [str(p["run"]), out]),
    ("hybrid-import", import_main, "run", lambda p, out: [str(p["run"]), out]),
    ("hybrid-rope-analyze", analyze_main, "run", lambda p, out: [str(p["run"]), "--quiet", "--out", out]),
    ("hybrid-rope-analyze", analyze_main, "texts", lambda p, out: [str(p["run"]), "--data", str(p["texts"]),
                                                                   "--quiet", "--out", out]),
    ("hybrid-bench", bench_main, "texts", lambda p, out: ["--suite", "baselines", "--data", str(p["texts"]),
                                                          "--out", out]),
    ("hybrid-bench", bench_main, "tokenizer", lambda p, out: ["--suite", "baselines", "--tokenizer",
                                                              str(p["tokenizer"]), "--out", out]),
    ("hybrid-eval", eval_main, "run", lambda p, out: [str(p["run"]), "--tasks", "t", "--output", out]),
    ("hybrid-eval", eval_main, "tasks", lambda p, out: [str(p["run"]), "--tasks", "t", "--include-path",
                                                        str(p["tasks"]), "--output", out]),
]
WITH_OVERWRITE = {"hybrid-train", "hybrid-distill", "hybrid-synthetic", "hybrid-export", "hybrid-import",
                  "hybrid-rope-analyze", "hybrid-bench"}


def places(source: Path, tmp_path: Path) -> list[tuple[str, Path]]:
    """(the relation, an output path) for an input ``source``: the input itself, a path inside it, a folder
    holding it, and the first two through a symlink."""
    link = tmp_path / "link"
    if not link.is_symlink():
        link.symlink_to(source)
    return [("is", source), ("lies inside", source / "out"), ("holds", source.parent), ("is", link),
            ("lies inside", link / "out")]


@pytest.mark.parametrize("prog, main, name, argv", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_no_output_is_holds_or_lies_inside_an_input(prog, main, name, argv, inputs, tmp_path, capsys,
                                                     one_line_error, one_torch_thread):
    if prog == "hybrid-eval":
        pytest.importorskip("transformers", reason="hybrid-eval's module needs transformers (the hf extra)")
    source = inputs[name]
    if prog == "hybrid-eval" and not source.is_dir():
        pytest.skip("hybrid-eval's inputs are folders")  # never reached: both its inputs are folders
    before = snapshot(tmp_path / "in")
    for relation, out in places(source, tmp_path):
        if prog == "hybrid-eval" and relation == "holds":
            continue  # --output is a file: it cannot hold a folder (that is "expected a file", checked elsewhere)
        for overwrite in ([[], ["--overwrite"]] if prog in WITH_OVERWRITE else [[]]):
            capsys.readouterr()
            code = main([*argv(inputs, str(out)), *overwrite])
            err = one_line_error(capsys, prog, "expected a path apart from", f"which {relation} it")
            assert code == 2, err
            assert snapshot(tmp_path / "in") == before, (relation, out, overwrite)


def test_train_data_into_its_own_corpus_is_refused_and_the_corpus_still_reads(inputs, capsys, one_line_error,
                                                                              one_torch_thread):
    """The issue's `hybrid-train --data texts --out texts`: refused, and nothing is written into the corpus."""
    texts = inputs["texts"]
    before = snapshot(texts)
    for out in (texts, texts / "run"):
        assert train_main(["--data", str(texts), *TINY, "--out", str(out), "--overwrite"]) == 2
        one_line_error(capsys, "hybrid-train", "out: expected a path apart from the input data")
    assert snapshot(texts) == before
    from hybrid.train.data import prepare_data

    assert prepare_data(texts).stats["documents"] == 4


def test_export_into_the_runs_checkpoint_leaves_the_run_loadable(inputs, capsys, one_line_error):
    """The issue's `hybrid-export runs/R runs/R/checkpoint --overwrite`."""
    from hybrid.train import load_run

    run = inputs["run"]
    assert export_main([str(run), str(run / "checkpoint"), "--overwrite"]) == 2
    one_line_error(capsys, "hybrid-export", "out_dir: expected a path apart from the input run_dir",
                   "which lies inside it")
    assert load_run(run).step == 0
    assert json.loads((run / "checkpoint" / "checkpoint.json").read_text())["step"] == 0
    assert not os.path.exists(run / "checkpoint" / "model.safetensors.tmp")
