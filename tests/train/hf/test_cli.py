"""hybrid-export, hybrid-import, hybrid-train --init-from and hybrid-eval (hybrid.train.cli.hf), offline, on tiny
models; their one-line errors."""
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

import hybrid.models.hf  # noqa: E402,F401
import hybrid.train.hf.evaluate as ev  # noqa: E402
from hybrid.models import HybridConfig, HybridLM  # noqa: E402
from hybrid.train import TrainConfig, Trainer, load_checkpoint, load_run  # noqa: E402
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint  # noqa: E402
from hybrid.train.cli.hf import eval_main, export_main, import_main  # noqa: E402
from hybrid.train.hf.tokenizer import byte_alphabet  # noqa: E402
from hybrid.train.data.tokenizer import ByteTokenizer, FileTokenizer  # noqa: E402

DATA = Path(__file__).parent / "data"


def write_run(path, config, tokenizer, seed=0):
    torch.manual_seed(seed)
    model = HybridLM(config)
    save_checkpoint(path, model_state=model.state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": tokenizer.to_dict()})
    return model


def tiny(preset="hybrid", vocab=259, **kw):
    return HybridConfig.preset(preset, d_model=32, n_layers=3, n_heads=2, vocab_size=vocab, **kw)


def word_tokenizer_file(path: Path, front: str | None = None) -> Path:
    """A tokenizer.json (byte-level BPE with a few merges and an </s>) written by the tokenizers library; with
    ``front`` (e.g. "<s>"), that special token too, which its post-processor puts in front of a text (Llama's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    vocab.update({"de": 256, "def": 257})
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[("d", "e"), ("de", "f")]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(["</s>"] + ([front] if front else []))
    if front:
        raw.post_processor = TemplateProcessing(single=f"{front} $A", pair=f"{front} $A {front} $B:1",
                                                special_tokens=[(front, raw.token_to_id(front))])
    raw.save(str(path))
    return path


@pytest.mark.parametrize("tokenizer_kind", ["bytes", "file"])
def test_export_gives_a_directory_auto_classes_open_with_equal_logits(tmp_path, capsys, tokenizer_kind):
    tok = ByteTokenizer() if tokenizer_kind == "bytes" else FileTokenizer(word_tokenizer_file(tmp_path / "tok.json"))
    model = write_run(tmp_path / "run", tiny(vocab=260, window=4), tok).eval()
    assert export_main([str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    assert "hybrid-export: wrote" in capsys.readouterr().out
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "modeling_hybrid.py"} <= files
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "def main():\n    return 1"
    assert hf_tok(text)["input_ids"] == [tok.eos_id] + tok.encode(text)
    assert hf_tok.eos_token_id == tok.eos_id == loaded.generation_config.eos_token_id
    ids = hf_tok(text, return_tensors="pt")["input_ids"]
    assert torch.equal(loaded(ids).logits, model(ids)[0])
    assert loaded.generation_config.suppress_tokens == list(range(tok.vocab_size, 260))  # padding rows: never
    assert hf_tok.padding_side == "left"  # generate continues after the prompt
    sampled = loaded.generate(ids, max_new_tokens=30, do_sample=True, top_k=0, pad_token_id=tok.pad_id)
    assert int(sampled.max()) < tok.vocab_size


def test_export_errors_are_one_line(tmp_path, capsys):
    assert export_main([str(tmp_path / "missing"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybrid-export: error:") and "\n" not in err


def hf_llama_dir(path: Path, *, tied: bool, shard: bool = False):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8})
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path, max_shard_size="60KB" if shard else "5GB")
    word_tokenizer_file(path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return model


@pytest.mark.parametrize("tied, shard", [(True, False), (False, True)])
def test_import_writes_a_run_that_load_run_opens_with_transformers_logits(tmp_path, capsys, tied, shard):
    hf = hf_llama_dir(tmp_path / "llama", tied=tied, shard=shard)
    assert shard == (tmp_path / "llama" / "model.safetensors.index.json").is_file()
    assert import_main([str(tmp_path / "llama"), str(tmp_path / "run")]) == 0
    assert "hybrid-import: wrote" in capsys.readouterr().out
    run = load_run(tmp_path / "run")
    assert run.model.config.meta["imported_from"] == "llama" and run.model.config.tie_embeddings == tied
    assert isinstance(run.tokenizer, FileTokenizer) and run.tokenizer.eos_id == 258
    assert run.tokenizer.path == (tmp_path / "run" / "tokenizer.json").resolve()
    ids = torch.randint(0, 300, (2, 19), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids).logits
        out = run.model(ids)[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=4e-6 * ref.abs().max().item())


@pytest.mark.parametrize("source", ["llama", "qwen2"])
def test_an_import_keeps_what_its_tokenizer_puts_in_front_of_a_prompt(source, tmp_path, capsys):
    """Llama's tokenizer puts <s> in front of a text, Qwen2's nothing: the run's prompts, its export's tokenizer and
    its export's bos follow the source, not this library's [eos]."""
    from tokenizers import Tokenizer

    from hybrid.train.lm.inference import generate_ids

    hf_llama_dir(tmp_path / "src", tied=True)
    word_tokenizer_file(tmp_path / "src" / "tokenizer.json", front="<s>" if source == "llama" else None)
    settings = {"eos_token": "</s>", **({"add_bos_token": False} if source == "qwen2" else {})}
    (tmp_path / "src" / "tokenizer_config.json").write_text(json.dumps(settings))
    assert import_main([str(tmp_path / "src"), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    run = load_run(tmp_path / "run")
    raw = Tokenizer.from_file(str(tmp_path / "src" / "tokenizer.json"))
    text = "def main(): pass"
    theirs = raw.encode(text).ids  # the source's own context (special tokens added)
    expected_front = [raw.token_to_id("<s>")] if source == "llama" else []
    assert theirs[: len(expected_front)] == expected_front and run.tokenizer.document_start == expected_front
    assert ("prompts start with <s>" if source == "llama" else "prompts start with no token") in out
    assert generate_ids(run, text, max_new_tokens=2, temperature=0)[: len(theirs)] == theirs
    assert export_main([str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok(text)["input_ids"] == theirs
    bos = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").generation_config.bos_token_id
    assert bos == (expected_front[0] if expected_front else None)
    if source == "qwen2":
        with pytest.raises(ValueError, match="prompt: expected text .* got an empty prompt"):
            generate_ids(run, "", max_new_tokens=2)


def test_import_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert import_main([str(tmp_path / "empty"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybrid-import: error: hf_dir: expected a transformers directory") and "\n" not in err


@pytest.fixture
def llama(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=64)).save_pretrained(path)
    return path


def test_import_of_a_config_with_a_wrong_type_is_one_line(llama, tmp_path, capsys, one_line_error):
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "hidden_size": "x"}))
    capsys.readouterr()
    assert import_main([str(llama), str(tmp_path / "run")]) == 2
    one_line_error(capsys, "hybrid-import", "config.json", "hidden_size")
    assert not (tmp_path / "run").exists()


def test_import_of_weights_that_do_not_fit_their_config_is_one_line(llama, tmp_path, capsys, one_line_error):
    """The shapes are checked against a model on the meta device (no second copy of the weights)."""
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))  # the weights have 128
    capsys.readouterr()
    assert import_main([str(llama), str(tmp_path / "run")]) == 2
    one_line_error(capsys, "hybrid-import", "expected weights that fit its config.json", "size mismatch",
                   "w_gate.weight")
    assert not (tmp_path / "run").exists()


def test_import_of_truncated_weights_is_one_line(llama, tmp_path, capsys, one_line_error):
    weights = llama / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    assert import_main([str(llama), str(tmp_path / "run")]) == 2
    one_line_error(capsys, "hybrid-import", "model.safetensors", "expected a complete safetensors file")
    assert not (tmp_path / "run").exists()


def test_train_init_from_starts_from_the_imported_weights_and_tokenizer(tmp_path, corpus):
    hf_llama_dir(tmp_path / "llama", tied=False)
    assert import_main([str(tmp_path / "llama"), str(tmp_path / "src")]) == 0
    source = load_checkpoint(tmp_path / "src")
    config = TrainConfig(init_from=str(tmp_path / "src"), data=str(corpus), steps=1, lr=1e-9, warmup=0,
                         seq_len=16, batch_size=2, eval_every=0, eval_batches=1, save_every=0, device="cpu",
                         out=str(tmp_path / "ft"), model={"window": 8})
    trainer = Trainer(config, verbose=0, progress=False)
    trainer.fit()
    assert trainer.config.tokenizer == str((tmp_path / "src" / "tokenizer.json").resolve())
    tuned = load_checkpoint(tmp_path / "ft")
    assert tuned.config == {**source.config, "attention": {**source.config["attention"], "window": 8}} and tuned.step == 1
    for key, value in source.model_state.items():  # one AdamW step of lr 1e-9 moves each weight by ~1e-9
        assert (tuned.model_state[key] - value).abs().max() < 1e-7, key
    resumed = Trainer.from_checkpoint(tmp_path / "ft", steps=2, trainer_kwargs=dict(verbose=0, progress=False))
    resumed.fit()  # a run started --init-from resumes from its own checkpoint (its model config)
    assert load_checkpoint(tmp_path / "ft").step == 2


def test_train_cli_passes_init_from_to_the_train_config():
    from hybrid.train.cli.lm import config_from_args, train_parser

    given = config_from_args(train_parser().parse_args(["--init-from", "runs/llama", "--window", "8"]))
    assert given == {"init_from": "runs/llama", "model": {"window": 8}}
    with pytest.raises(ValueError, match="init_from: expected a string or None, got 3"):
        TrainConfig(init_from=3)


def test_train_init_from_refuses_overrides_that_change_shapes(tmp_path, corpus):
    write_run(tmp_path / "src", tiny("transformer"), ByteTokenizer())
    config = TrainConfig(init_from=str(tmp_path / "src"), data=str(corpus), steps=1, seq_len=16, batch_size=2,
                         device="cpu", out=str(tmp_path / "ft"), model={"d_model": 64})
    with pytest.raises(ValueError, match="init_from: the weights of .* do not fit the model config"):
        Trainer(config, verbose=0, progress=False).fit()


def test_eval_on_the_local_task_scores_what_our_model_prefers(tmp_path, capsys):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]' in the hybrid checkout); it is not in the "
                                          "test extra: it pulls scikit-learn and friends")
    pytest.importorskip("accelerate", reason="lm-eval's HFLM needs accelerate (pip install -e '.[eval]' in the hybrid checkout)")
    tok = ByteTokenizer()
    model = write_run(tmp_path / "run", tiny("hybrid", window=4), tok, seed=3).eval()
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_mc.yaml").write_text((DATA / "tiny_mc.yaml.in").read_text().replace("@DATA@", str(DATA / "tiny_mc.jsonl")))
    out_file = tmp_path / "results.json"
    code = eval_main([str(tmp_path / "run"), "--tasks", "hybrid_tiny_mc", "--include-path", str(tasks),
                      "--batch-size", "4", "--output", str(out_file), "--log-samples"])
    assert code == 0, capsys.readouterr().err
    record = json.loads(out_file.read_text())
    acc = record["results"]["hybrid_tiny_mc"]["acc,none"]

    # the same multiple choice by hand: log p(choice | [eos] question) summed over the choice's tokens
    def logprob(context, continuation):
        ctx, cont = [tok.eos_id] + tok.encode(context), tok.encode(continuation)
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids)[0][0].double(), -1)
        return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))

    docs = [json.loads(line) for line in (DATA / "tiny_mc.jsonl").read_text().splitlines()]
    samples = sorted(record["samples"]["hybrid_tiny_mc"], key=lambda s: s["doc_id"])
    assert len(samples) == len(docs)
    for sample, doc in zip(samples, docs):  # lm-eval's log-likelihood of every choice is ours
        theirs = [float(r[0]) for r in sample["filtered_resps"]]
        ours = [logprob(doc["question"], c) for c in doc["choices"]]
        assert all(math.isclose(t, o, rel_tol=1e-5, abs_tol=1e-5) for t, o in zip(theirs, ours)), (theirs, ours)
    picks = [max(range(len(d["choices"])), key=lambda c: logprob(d["question"], d["choices"][c])) for d in docs]
    expected = sum(p == d["answer"] for p, d in zip(picks, docs)) / len(docs)
    assert math.isclose(acc, expected)


def test_eval_checks_the_include_path_and_the_output_before_it_evaluates(tmp_path, capsys, monkeypatch, one_line_error):
    def never(*args, **kwargs):
        raise AssertionError("evaluated before the arguments were checked")

    monkeypatch.setattr(ev, "import_lm_eval", never)
    monkeypatch.setattr(ev, "load_for_eval", never)
    assert eval_main([str(tmp_path), "--tasks", "hybrid_tiny_mc", "--include-path", "/nonexistent"]) == 2
    one_line_error(capsys, "hybrid-eval", "include_path: expected a directory of lm-eval task YAML files",
                   "/nonexistent", "no such directory")
    assert eval_main([str(tmp_path), "--tasks", "hybrid_tiny_mc", "--output", "/proc/x/r.json"]) == 2
    one_line_error(capsys, "hybrid-eval", "--output", "/proc/x does not exist")
    assert eval_main([str(tmp_path / "nope"), "--tasks", "hybrid_tiny_mc"]) == 2  # before lm-eval's import
    one_line_error(capsys, "hybrid-eval", "path: expected a run directory (checkpoint/) or a transformers directory",
                   str(tmp_path / "nope"))
    (tmp_path / "a-folder").mkdir()
    assert eval_main([str(tmp_path / "run"), "--tasks", "t", "--output", str(tmp_path / "a-folder")]) == 2
    one_line_error(capsys, "hybrid-eval", "--output: expected a file to write, got the directory")
    kept = tmp_path / "a-folder" / "results.json"  # someone's file: replaced only with --overwrite
    kept.write_text("mine\n")
    assert eval_main([str(tmp_path / "run"), "--tasks", "hybrid_tiny_mc", "--output", str(kept)]) == 2
    one_line_error(capsys, "hybrid-eval", f"--output: expected a new file, got {kept}, which exists", "--overwrite")
    assert kept.read_text() == "mine\n"
    assert eval_main([str(tmp_path), "--tasks", "hybrid_tiny_mc", "--overwrite"]) == 2
    one_line_error(capsys, "hybrid-eval", "--overwrite: expected together with --output")


def test_eval_replaces_its_output_whole_with_overwrite(tmp_path, capsys, monkeypatch):
    """``--overwrite`` replaces the file whole (written beside it, then renamed: no staging file is left)."""
    monkeypatch.setattr(ev, "evaluate", lambda *args, **kwargs: {"results": {"t": {"acc,none": 0.5}}})
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "results.json"
    out.write_text("mine\n")
    assert eval_main([str(tmp_path / "run"), "--tasks", "t", "--output", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text()) == {"results": {"t": {"acc,none": 0.5}}}
    assert sorted(p.name for p in out.parent.iterdir()) == ["results.json"]


def test_eval_names_an_unknown_task_and_the_nearest(tmp_path, capsys, one_line_error):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]' in the hybrid checkout); it is not in the "
                                          "test extra: it pulls scikit-learn and friends")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_mc.yaml").write_text((DATA / "tiny_mc.yaml.in").read_text().replace("@DATA@", str(DATA / "tiny_mc.jsonl")))
    model = tmp_path / "model"  # a path that passes the path check: the tasks are checked before it is loaded
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert eval_main([str(model), "--tasks", "nonexistent_task,hybrid_tiny_m", "--include-path", str(tasks)]) == 2
    one_line_error(capsys, "hybrid-eval", "unknown 'nonexistent_task', 'hybrid_tiny_m'", "did you mean hybrid_tiny_mc")
