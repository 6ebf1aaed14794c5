"""hybrid-train --config FILE (TOML or JSON): every option from a file, flags over it, unknown keys refused, and
a run's own train_config.json gives the same run config back."""
import json
import re
import sys
from pathlib import Path

import pytest

from hybrid.train import TrainConfig
from hybrid.train.cli.lm import train_config_from_args, train_main, train_parser
from hybrid.train.cli.config_file import load_config_file

REPO = Path(__file__).resolve().parents[3]
TINY = ["--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--warmup", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


def config_of(*argv) -> TrainConfig:
    return TrainConfig(**train_config_from_args(train_parser().parse_args(list(argv))))


def test_train_config_json_round_trips_through_config(corpus, tmp_path):
    out = tmp_path / "run"
    assert train_main(["--data", str(corpus), "--out", str(out), *TINY, "--steps", "2", "--set", "rope_base=5000",
                       "--eval-batches", "all", "--text-column", "text", "--log-every", "1", "--grad-clip", "0"]) == 0
    written = json.loads((out / "train_config.json").read_text())
    assert config_of("--config", str(out / "train_config.json")) == TrainConfig.from_dict(written)
    # and the file trains: the new run's record is the old one but for what the flags changed
    again = tmp_path / "again"
    assert train_main(["--config", str(out / "train_config.json"), "--out", str(again), "--steps", "3"]) == 0
    rewritten = json.loads((again / "train_config.json").read_text())
    assert rewritten == {**written, "out": str(again), "steps": 3}


def docs_example() -> str:
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"^```toml\n(.*?)^```", text, flags=re.S | re.M)
    return block


def test_the_documented_toml_example_gives_every_option_and_flags_override_it(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(docs_example())
    from dataclasses import fields

    text = docs_example()
    named = set(re.findall(r"^(?:# )?(\w+) =", text, flags=re.M)) | set(re.findall(r"^\[(\w+)\]", text, flags=re.M))
    assert named >= {f.name for f in fields(TrainConfig)}  # a complete example: every option, or its comment
    commented = set(re.findall(r"^# (\w+) =", text, flags=re.M))
    assert set(load_config_file(path)) == named - commented - {"window"}  # window: a key of [model]
    config = config_of("--config", str(path))
    assert config.model == {"window": 64} and config.eval_batches == 50 and config.log == []
    assert config.replace(data=None, model={}) == TrainConfig()  # every other value is the default
    over = config_of("--config", str(path), "--steps", "7", "--window", "none", "--set", "rope_base=5000")
    assert over.steps == 7 and over.model["window"] is None and over.model["rope_base"] == 5000
    assert {k: v for k, v in over.model.items() if k not in ("window", "rope_base")} == \
        {k: v for k, v in config.model.items() if k not in ("window", "rope_base")}  # the file's other model keys stay
    assert over.replace(steps=config.steps, model=config.model) == config


def test_toml_spells_none_as_the_command_line_does(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('eval_batches = "all"\nwarmup = 5\n[model]\nwindow = "none"\npattern = "RRA"\n')
    config = config_of("--config", str(path))
    assert config.eval_batches is None and config.model == {"window": None, "pattern": "RRA"} and config.warmup == 5


@pytest.mark.parametrize("file_model, argv, want", [
    ('window = 64\n', ["--set", "attention.window=16"], {"attention.window": 16}),
    ('"attention.window" = 16\n', ["--window", "8"], {"window": 8}),
    ('rope_base = 500\n[model.attention]\nwindow = 32\nn_kv_heads = 1\n', ["--set", "attention.window=4"],
     {"rope_base": 500, "attention.n_kv_heads": 1, "attention.window": 4}),
    ('rnn_selective = true\n', ["--set", "recurrence.selective=false", "--set", "carope=true"],
     {"recurrence.selective": False, "carope": True}),
])
def test_a_model_flag_overrides_the_files_field_however_either_spells_it(tmp_path, file_model, argv, want):
    """The issue: `--config` with `attention.window` and `--window 8` was "window: also given as attention.window"."""
    path = tmp_path / "run.toml"
    path.write_text("[model]\n" + file_model)
    config = config_of("--config", str(path), *argv)
    assert config.model == want
    from hybrid.train.lm.trainer import model_config_for
    from hybrid.train.data.tokenizer import ByteTokenizer

    model_config_for(config, ByteTokenizer())  # one value per field: the model config takes it


def test_two_spellings_on_one_command_line_stay_refused(tmp_path, capsys, one_line_error):
    path = tmp_path / "run.toml"
    path.write_text("[model]\nwindow = 64\n")
    (tmp_path / "d.txt").write_text("a small corpus. " * 200)
    argv = ["--config", str(path), "--window", "8", "--set", "attention.window=16", "--out", str(tmp_path / "o"),
            "--data", str(tmp_path / "d.txt"), "--quiet"]
    assert train_main(argv) == 2
    one_line_error(capsys, "hybrid-train", "also given as", "expected one of the two")


@pytest.mark.parametrize("text, suffix, needles", [
    ('steps = 3\ncolour = "red"\n', ".toml", ["config: expected TrainConfig's fields as keys, got unknown key 'colour'",
                                              "run.toml"]),
    ('steps = 3\n[model]\ncolour = "red"\n', ".toml", ["config: expected HybridConfig fields under 'model', got "
                                                       "unknown key 'model.colour'"]),
    ('{"steps": 3, "stepz": 4}', ".json", ["got unknown key 'stepz'"]),
    ("steps = 3\n[model\n", ".toml", ["config: expected valid TOML", "line 2"]),
    ('{"steps": 3,}', ".json", ["config: expected valid JSON"]),
    ("[1, 2]", ".json", ["config: expected a table of TrainConfig fields, got list"]),
    ('steps = "many"\n', ".toml", ["steps: expected an int >= 1, got 'many'"]),
    ("steps = 3\n", ".yaml", ["config: expected a .toml or .json file"]),
])
def test_a_bad_config_file_is_one_line_naming_the_key(tmp_path, capsys, text, suffix, needles, one_line_error):
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    assert train_main(["--config", str(path)]) == 2
    one_line_error(capsys, "hybrid-train", *needles)


def test_toml_without_tomllib_or_tomli_is_one_line(tmp_path, capsys, monkeypatch, one_line_error):
    monkeypatch.setitem(sys.modules, "tomllib", None)  # Python 3.10 without tomli
    monkeypatch.setitem(sys.modules, "tomli", None)
    path = tmp_path / "run.toml"
    path.write_text("steps = 3\n")
    assert train_main(["--config", str(path)]) == 2
    one_line_error(capsys, "hybrid-train", "reading TOML needs Python 3.11 or the tomli package", ".json")
    json_path = tmp_path / "run.json"
    json_path.write_text('{"steps": 3}')
    assert config_of("--config", str(json_path)).steps == 3
