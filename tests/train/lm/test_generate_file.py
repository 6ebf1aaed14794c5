"""hybrid-generate --prompts FILE (train/lm/generate_file.py): every prompt of a file through the continuous-batching
decoder, one JSON line each in the file's order, each equal to its prompt generated alone; file errors are one line."""
from __future__ import annotations

import json
import random

import pytest

from hybrid.train.cli.lm import generate_main
from hybrid.train.lm.generate_file import generate_file, read_prompts
from hybrid.train.lm.inference import generate_text, load_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory holding an untrained tiny windowed Transformer's checkpoint and the byte tokenizer (what
    load_run reads). No R layer: tests/train's private cache would rebuild the CPU scan's extension (seconds); the
    decoding of every mixer is tests/models/decoding's."""
    import torch

    from hybrid.models import HybridConfig, HybridLM
    from hybrid.train.loop.checkpoint import save_checkpoint
    from hybrid.train.data.tokenizer import ByteTokenizer, round_vocab_size

    tokenizer = ByteTokenizer()
    config = HybridConfig.preset("transformer", "tiny", d_model=32, n_layers=2, n_heads=2, window=8,
                                 vocab_size=round_vocab_size(tokenizer.vocab_size))
    torch.manual_seed(0)
    model = HybridLM(config)
    out = tmp_path_factory.mktemp("runs") / "run"
    save_checkpoint(out, model_state=model.state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=None, data_state=None, step=0,
                    extra={"tokenizer": tokenizer.to_dict()})
    return out


def test_prompts_file_equals_each_prompt_alone(run, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    lines = ['"def f"', json.dumps({"prompt": "import os\n", "max_new_tokens": 3, "temperature": 0}),
             json.dumps({"prompt": "", "seed": 4, "top_k": 5}), json.dumps({"prompt": "x = [", "stop": False})]
    prompts.write_text("\n".join(lines) + "\n")
    common = ["--run", str(run), "--max-new-tokens", "7", "--temperature", "0.9", "--seed", "2", "--device", "cpu"]
    assert generate_main([*common, "--prompts", str(prompts), "--max-batch", "2"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2, 3] and "tokens/s" in captured.err
    items = [json.loads(line) for line in lines]
    loaded = load_run(run)
    for i, (record, item) in enumerate(zip(records, items)):  # each equals its prompt generated alone
        item = {"prompt": item} if isinstance(item, str) else item
        alone = generate_text(loaded, item["prompt"], max_new_tokens=item.get("max_new_tokens", 7),
                              temperature=item.get("temperature", 0.9), top_k=item.get("top_k"),
                              seed=item.get("seed", 2 + i), stop_at_eos=item.get("stop", True))
        assert alone == item["prompt"] + record["completion"], f"prompt {i}"
    plain = tmp_path / "prompts.txt"
    plain.write_text("def f\nimport os\n")
    assert generate_main([*common, "--prompts", str(plain)]) == 0
    assert [json.loads(line)["prompt"] for line in capsys.readouterr().out.splitlines()] == ["def f", "import os"]


@pytest.mark.parametrize("text, argv, needles", [
    ("{bad\n", [], ["prompts.jsonl:1", "invalid JSON"]),
    ('{"text": "a"}\n', [], ["prompts.jsonl:1", '"prompt" string']),
    ('{"prompt": "a", "colour": 1}\n', [], ["prompts.jsonl:1", "['colour']"]),
    ('{"prompt": "a", "top_p": 3}\n', [], ["prompts.jsonl:1: top_p: expected a number in (0, 1]"]),
    ('"a"\n\n  \n{"prompt": "b", "stop": 1}\n', [], ["prompts.jsonl:4: stop: expected true or false, got 1"]),
    ('"a"\r\n\r\n{"prompt": "b", "max_new_tokens": -1}\r\n"c"', [],
     ["prompts.jsonl:3: max_new_tokens: expected an int >= 0, got -1"]),
    ('"a"\n{"prompt": "b"}\n{bad', [], ["prompts.jsonl:3", "invalid JSON"]),
    ('"a"\n', ["--prompt", "b"], ["--prompts: expected no --prompt"]),
])
def test_prompt_file_errors_are_one_line(text, argv, needles, run, tmp_path, capsys, one_line_error):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(text)
    assert generate_main(["--run", str(run), "--prompts", str(prompts), "--device", "cpu", *argv]) == 2
    one_line_error(capsys, "hybrid-generate", *needles)


def test_every_line_is_checked_before_any_prompt_is_decoded(run, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"a"\n"b"\n\n{"prompt": "c", "temperature": -1}\n')
    with pytest.raises(ValueError, match=r"prompts\.jsonl:4: temperature: expected a number >= 0, got -1$"):
        generate_file(load_run(run), prompts, max_batch=1, max_new_tokens=2, temperature=0.0, top_k=None,
                      top_p=None, seed=0, stop_at_eos=False)
    assert capsys.readouterr().out == ""  # the first prompts were not decoded


# every character str.splitlines splits at but "\n" (and "\r", which ends a CRLF line): a prompt may hold them
OTHER_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def random_lines(seed: int, n: int = 12) -> list[str]:
    """``n`` lines of 1 … 8 characters drawn from letters, spaces, a "\\r" inside and OTHER_BREAKS."""
    rng = random.Random(seed)
    pool = "ab Z\u00e9" + OTHER_BREAKS
    return [rng.choice(pool) + "".join(rng.choice(pool + "\r") for _ in range(rng.randint(0, 6))) + rng.choice(pool)
            for _ in range(n)]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_prompt_files_split_at_newlines_only(newline, final_newline, tmp_path):
    lines = random_lines(seed=len(newline) + 2 * final_newline)
    assert any(c in "".join(lines) for c in OTHER_BREAKS)
    ending = newline if final_newline else ""
    plain = tmp_path / "prompts.txt"
    plain.write_bytes((newline.join(lines) + ending).encode("utf-8"))
    assert read_prompts(plain) == [{"prompt": line} for line in lines]
    jsonl = tmp_path / "prompts.jsonl"  # JSON leaves U+0085, U+2028 and U+2029 raw inside its strings
    items = [line if i % 2 else {"prompt": line, "seed": i} for i, line in enumerate(lines)]
    text = newline.join(json.dumps(item, ensure_ascii=False) for item in items) + ending
    assert "\u2028" in text or "\u2029" in text or "\x85" in text
    jsonl.write_bytes(text.encode("utf-8"))
    assert read_prompts(jsonl) == [item if isinstance(item, dict) else {"prompt": item} for item in items]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert read_prompts(empty) == []
