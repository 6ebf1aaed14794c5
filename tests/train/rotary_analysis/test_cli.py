"""hybrid-rope-analyze: a run directory end to end (summary.json, report.md, figures), a Hugging Face
directory, and one-line errors (exit 2)."""
import json

import pytest
import torch

from hybrid.train.cli.rope_analyze import analyze_main

TINY = ["--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "24",
        "--batch-size", "4", "--lr", "1e-2", "--warmup", "2", "--eval-batches", "1", "--device", "cpu"]


@pytest.fixture
def trained(train_run):
    return train_run("tf", 6, TINY)


def test_analyze_a_run(trained, corpus, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert analyze_main([str(trained), "--data", str(corpus), "--tokens", "300", "--out", str(out),
                         "--batch-size", "2", "--radii", "0.5", "1", "--device", "cpu"]) == 0
    printed = capsys.readouterr()
    assert "meet Definition 3.1" in printed.out
    assert "hybrid-rope-analyze" in printed.err  # the progress bar
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "report.md", "channels.npz", "fig1_max_qk.png", "fig2_angle_std.png",
            "fig5_offset_curves.png", "fig8_radius_phi.png", "fig10_positional_attention.png"} <= names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["p_max"] == 24 and summary["tokens"] == 312  # 13 sequences of 24 tokens reach 300
    assert summary["n_layers"] == 2 and summary["rotary_dim"] == 16
    assert len(summary["features"]) == 2 * 2 * 8 == summary["table2"]["n_features"]
    assert [r["radius"] for r in summary["table2"]["rows"]] == [0.5, 1.0]
    assert "Llama-2-7b (seed)" in (out / "report.md").read_text()
    # a second analysis into the same directory: refused before any work, the first left byte-identical
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert analyze_main([str(trained), "--data", str(corpus), "--tokens", "300", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out: expected a new or empty directory" in err[0] and "--overwrite" in err[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert analyze_main([str(trained), "--data", str(corpus), "--tokens", "300", "--out", str(out),
                         "--radii", "1", "--device", "cpu", "--overwrite", "--no-figures", "--quiet"]) == 0
    assert not (out / "fig1_max_qk.png").exists()  # replaced whole, no mix of old and new files


def test_a_distilled_student_reads_its_training_length_from_the_distill_config(trained, corpus, tmp_path):
    """A student of hybrid-distill is an ordinary run directory (docs/distill.md): p_max is its seq_len."""
    from hybrid.train import load_run
    from hybrid.train.cli.distill import main as distill_main

    student = tmp_path / "student"
    assert distill_main(["--teacher", str(trained), "--pattern", "RA", "--data", str(corpus), "--seq-len", "16",
                         "--batch-size", "2", "--align-steps", "1", "--steps", "1", "--eval-batches", "1",
                         "--device", "cpu", "--out", str(student), "--quiet"]) == 0
    assert load_run(student).train_config["seq_len"] == 16
    out = tmp_path / "analysis"
    assert analyze_main([str(student), "--data", str(corpus), "--tokens", "64", "--out", str(out), "--no-figures",
                         "--quiet", "--device", "cpu"]) == 0
    assert json.loads((out / "summary.json").read_text())["p_max"] == 16


def test_errors_are_one_line(trained, tmp_path, capsys, monkeypatch, one_line_error):
    assert analyze_main([str(trained), "--head", "x", "--out", str(tmp_path / "b")]) == 2
    one_line_error(capsys, "hybrid-rope-analyze", "--head")
    assert analyze_main([str(trained), "--tokens", "0"]) == 2
    one_line_error(capsys, "hybrid-rope-analyze", "--tokens")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytest.importorskip("transformers", reason="transformers is not installed: the hub-name path needs it")
    assert analyze_main(["no-owner/no-model", "--out", str(tmp_path / "a")]) == 2
    one_line_error(capsys, "hybrid-rope-analyze", "no-owner/no-model", "unreachable")


def test_a_retention_run_is_refused_naming_the_flag(train_run, corpus, tmp_path, capsys, one_line_error):
    retnet = train_run("ret", 2, ["--preset", "retnet", *TINY[2:]])
    assert analyze_main([str(retnet), "--data", str(corpus), "--out", str(tmp_path / "a"), "--quiet"]) == 2
    err = one_line_error(capsys, "hybrid-rope-analyze", "MODEL: expected attention layers",
                         "retention layers need --include-retention")
    assert "include_retention=True" not in err


def test_analyze_a_hugging_face_directory(corpus, tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (hybrid-lm[analysis])")
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    chars = sorted(set("".join(p.read_text() for p in corpus.iterdir())))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")  # one token per character
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    torch.manual_seed(0)
    config = transformers.PhiConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=2, max_position_embeddings=20, partial_rotary_factor=0.5)
    model_dir = tmp_path / "tiny-phi"
    transformers.PhiForCausalLM(config).save_pretrained(model_dir)
    fast.save_pretrained(model_dir)
    out = tmp_path / "analysis"
    assert analyze_main([str(model_dir), "--data", str(corpus), "--tokens", "100", "--out", str(out), "--no-figures",
                         "--quiet", "--device", "cpu"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["p_max"], summary["head_dim"], summary["rotary_dim"], summary["layout"]) == (20, 16, 8, "half")
    assert summary["tokens"] == 100 and len(summary["features"]) == 2 * 2 * 4
