"""hybrid-distill end to end on a tiny imported Llama (GQA, the half rotary layout), --resume, one-line errors."""
import json

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from hybrid.models import HybridConfig, HybridLM  # noqa: E402
from hybrid.train import load_checkpoint, load_run  # noqa: E402
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint  # noqa: E402
from hybrid.train.cli.lm import generate_main  # noqa: E402
from hybrid.train.cli.distill import main  # noqa: E402
from hybrid.train.cli.hf import export_main, import_main  # noqa: E402


@pytest.fixture
def llama_run(tmp_path, one_torch_thread):
    """A tiny random LlamaForCausalLM (3 layers, 6 query heads on 2 kv heads), saved and imported as a run."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")  # no tokenizer.json: the byte tokenizer is recorded
    assert import_main([str(tmp_path / "llama"), str(tmp_path / "teacher")]) == 0
    return tmp_path / "teacher"


def small(corpus, *extra):
    return ["--data", str(corpus), "--seq-len", "16", "--batch-size", "2", "--align-steps", "2", "--steps", "2",
            "--eval-batches", "2", "--select-batches", "2", "--log-every", "1", "--device", "cpu", *extra]


def test_distill_an_imported_llama_with_a_pattern_and_with_auto_then_resume(tmp_path, corpus, llama_run, capsys):
    out = tmp_path / "rra"
    assert main(["--teacher", str(llama_run), "--pattern", "RRA", "--window", "8", "--out", str(out),
                 *small(corpus)]) == 0
    printed = capsys.readouterr().out
    assert "done at step 4: student RRA" in printed and "checkpoint/" in printed
    files = {p.name for p in out.iterdir()}
    assert {"checkpoint", "metrics.jsonl", "loss.png", "distill.json", "distill_config.json"} <= files
    run = load_run(out)  # a normal run directory: the student's HybridConfig and the teacher's tokenizer
    assert run.model.config.layer_types == "RRA" and run.model.config.window == 8 and run.step == 4
    assert run.model.config.n_kv_heads == 2 and run.model.config.rope_layout == "half"
    assert generate_main(["--run", str(out), "--prompt", "def ", "--max-new-tokens", "4", "--temperature", "0"]) == 0
    assert export_main([str(out), str(tmp_path / "hf")]) == 0
    from hybrid.train.bench.cost import decode_cost
    from hybrid.train.bench.quality import context_metrics, long_sequences
    from hybrid.train.data import prepare_data

    data = prepare_data(str(corpus), tokenizer=run.tokenizer)
    figures = context_metrics(run.model, data, long_sequences(data.valid, length=32, count=2), seq_len=16, factors=(2,))
    assert figures["bpb_full_2x"] > 0 and decode_cost(run.model, context=20, new_tokens=2)["state_bytes"] > 0
    stages = [r["stage"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    assert stages[0] == "align" and stages[-1] == "distill"

    capsys.readouterr()
    assert main(["--resume", str(out), "--steps", "3"]) == 0  # the new total of stage 2
    assert "resuming at step 4 (distill)" in capsys.readouterr().out
    assert load_checkpoint(out).step == 5

    auto = tmp_path / "auto"
    assert main(["--teacher", str(llama_run), "--keep-attention", "auto:1", "--out", str(auto), "--train", "new",
                 "--ce-weight", "0.1", *small(corpus)]) == 0
    ranking = json.loads((auto / "layer_ranking.json").read_text())
    assert sorted(r["layer"] for r in ranking["ranking"]) == [0, 1, 2]
    assert sum(r["kept"] for r in ranking["ranking"]) == 1
    assert "layer ranking" in capsys.readouterr().out
    student = load_run(auto).model
    assert student.config.layer_types == ranking["layer_types"] and student.config.layer_types.count("A") == 1
    teacher = load_checkpoint(llama_run).model_state
    for name, value in student.state_dict().items():  # --train new: only the replaced layers' mixers moved
        types = student.config.layer_types
        replaced = any(name.startswith(f"blocks.{i}.mixer.") for i, x in enumerate(types) if x == "R")
        if not replaced:
            torch.testing.assert_close(value, teacher[name], rtol=0, atol=0, msg=name)


def write_run_without_tokenizer(path):
    config = HybridConfig.preset("transformer", d_model=16, n_layers=2, n_heads=2, vocab_size=320)
    save_checkpoint(path, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0)


@pytest.mark.parametrize("case, args, message", [
    ("not a run", ["--teacher", "{tmp}/nothing", "--pattern", "RRA"], "--teacher: expected a run directory"),
    ("pattern too long", ["--teacher", "{teacher}", "--pattern", "RRAR"],
     "--pattern: expected at most the teacher's n_layers=3 letters"),
    ("K too large", ["--teacher", "{teacher}", "--keep-attention", "auto:4"],
     "--keep-attention: expected K in 0…3 (the teacher's n_layers), got 4"),
    ("K negative", ["--teacher", "{teacher}", "--keep-attention", "auto:-1"], "expected K in 0…3"),
    ("not auto", ["--teacher", "{teacher}", "--keep-attention", "2"], "--keep-attention: expected auto:K"),
    ("keeps every attention layer", ["--teacher", "{teacher}", "--keep-attention", "auto:3"],
     "--keep-attention: expected K below the teacher's 3 attention layers (at least one is replaced), got 3"),
    ("replaces no layer", ["--teacher", "{teacher}", "--pattern", "AAA"],
     "--pattern: expected an R at one of the teacher's attention layers [0, 1, 2]"),
    ("replaces no layer of a hybrid", ["--teacher", "{tmp}/hybrid", "--pattern", "RA"],
     "no layer would be replaced"),
    ("no tokenizer", ["--teacher", "{tmp}/bare", "--pattern", "RA"], "expected a checkpoint with a tokenizer record"),
    ("vocabulary", ["--teacher", "{teacher}", "--pattern", "RRA", "--set", "vocab_size=512"],
     "--set: expected one of the R layers' fields"),
    ("neither", ["--teacher", "{teacher}"], "expected exactly one of them"),
    ("used out", ["--teacher", "{teacher}", "--pattern", "RRA", "--out", "{tmp}/used"],
     "--out: expected a new or empty directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, corpus, capsys, case, args, message, one_torch_thread):
    teacher = tmp_path / "teacher"
    config = HybridConfig.preset("transformer", d_model=16, n_layers=3, n_heads=2, vocab_size=320)
    from hybrid.train.data.tokenizer import ByteTokenizer

    save_checkpoint(teacher, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()})
    write_run_without_tokenizer(tmp_path / "bare")
    hybrid = HybridConfig.preset("hybrid", d_model=16, n_layers=2, n_heads=2, vocab_size=320, pattern="RA")
    save_checkpoint(tmp_path / "hybrid", model_state=HybridLM(hybrid).state_dict(), config=hybrid.to_dict(),
                    optimizer_state=None, scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()})
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    argv = [a.format(tmp=tmp_path, teacher=teacher) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert main(argv + ["--data", str(corpus)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybrid-distill: error: ") and "\n" not in err and message in err, err
    assert not (tmp_path / "out").exists() and (tmp_path / "used" / "notes.txt").read_text() == "mine"
