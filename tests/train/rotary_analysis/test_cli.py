"""hybrid-rope-analyze: a run directory end to end (summary.json, report.md, figures), a Hugging Face
directory, and one-line errors (exit 2)."""
import json
import math

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


def _offset_feature(q, k, theta, p_max) -> bool:
    """Definition 3.1 by brute force: (R(pθ) q̄)ᵀ k̄ < q̄ᵀ k̄ for every integer 0 < p ≤ p_max."""
    def d(p):
        c, s = math.cos(p * theta), math.sin(p * theta)
        return (c * q[0] - s * q[1]) * k[0] + (s * q[0] + c * q[1]) * k[1]
    return all(d(p) < d(0) for p in range(1, p_max + 1))


def test_a_windowed_run_is_analysed_over_its_window(train_run, corpus, tmp_path):
    """A window-8 run trained at seq_len 24 never scores a key 8 or more tokens back: its bounds and Definition
    3.1 use p_max = 8, recomputed here from each feature's θ, q̄ and k̄. A bench-style run directory
    (MODEL/seed0) is named by both parts, not by a "seed0" that every bench run shares."""
    run = train_run("transformer-window/seed0", 2, [*TINY, "--window", "8"])
    out = tmp_path / "analysis"
    assert analyze_main([str(run), "--data", str(corpus), "--tokens", "96", "--out", str(out), "--quiet",
                         "--device", "cpu"]) == 0
    assert (out / "fig10_positional_attention.png").exists()  # the figures follow the window too
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["p_max"], summary["layer_p_max"], summary["windows"]) == (24, [8, 8], [8, 8])
    features = summary["features"]
    theta = [f["theta"] for f in features]
    under = [t * 8 < 2 * math.pi for t in theta]
    assert sum(under) > sum(t * 24 < 2 * math.pi for t in theta)  # the case tells the two p_max apart
    assert [f["under_upper_bound"] for f in features] == under
    assert [f["lower_bound"] for f in features] == pytest.approx([math.pi + 8 * t / 2 for t in theta], rel=1e-12)
    assert [f["is_rof"] for f in features] == [_offset_feature(f["q_mean"], f["k_mean"], f["theta"], 8)
                                               for f in features]
    assert summary["table2"]["pct_rof"] == pytest.approx(100 * sum(under) / len(under))
    report = (out / "report.md").read_text()
    assert "p_max = 24 (8 in layers 0, 1: their sliding window)" in report
    assert summary["model"] == "transformer-window/seed0"
    assert report.startswith("# Rotary offset features: transformer-window/seed0\n")


def test_errors_are_one_line(trained, tmp_path, capsys, monkeypatch, one_line_error):
    assert analyze_main([str(trained), "--head", "x", "--out", str(tmp_path / "b")]) == 2
    one_line_error(capsys, "hybrid-rope-analyze", "--head")
    # a layer past the analysed ones: refused naming the flag, before the corpus pass
    assert analyze_main([str(trained), "--head", "99,0", "--out", str(tmp_path / "c"), "--device", "cpu"]) == 2
    one_line_error(capsys, "hybrid-rope-analyze", "--head: expected LAYER < 2 (an analysed-layer index) and "
                                                  "HEAD < 2, got '99,0'")
    # a negative value is the flag's value (argparse alone reads '-1,0' as an option: "expected one argument")
    assert analyze_main([str(trained), "--head", "-1,0", "--out", str(tmp_path / "d")]) == 2
    one_line_error(capsys, "hybrid-rope-analyze", "--head: expected LAYER,HEAD (two ints >= 0), got '-1,0'")
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


def _tiny_hf_dir(corpus, tmp_path):
    """A tiny random Phi with a one-character-per-token tokenizer, saved as a local model directory."""
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
    return model_dir


def test_analyze_a_hugging_face_directory(corpus, tmp_path, capsys):
    model_dir = _tiny_hf_dir(corpus, tmp_path)
    out = tmp_path / "analysis"
    assert analyze_main([str(model_dir), "--data", str(corpus), "--tokens", "100", "--out", str(out), "--no-figures",
                         "--quiet", "--device", "cpu"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["p_max"], summary["head_dim"], summary["rotary_dim"], summary["layout"]) == (20, 16, 8, "half")
    assert summary["tokens"] == 100 and len(summary["features"]) == 2 * 2 * 4


def test_a_hugging_face_seq_len_too_short_for_bos_names_the_flag(corpus, tmp_path, capsys, one_line_error):
    from transformers.utils import logging as hf_logging

    model_dir = _tiny_hf_dir(corpus, tmp_path)
    hf_logging.disable_progress_bar()  # transformers' own "Loading weights" bar is no part of the error
    try:
        capsys.readouterr()
        assert analyze_main([str(model_dir), "--data", str(corpus), "--seq-len", "1", "--out",
                             str(tmp_path / "a"), "--quiet", "--device", "cpu"]) == 2
    finally:
        hf_logging.enable_progress_bar()
    one_line_error(capsys, "hybrid-rope-analyze", "--seq-len: expected at least 2 for a model that starts each "
                                                  "sequence with BOS, got 1")
