"""hybrid-generate --prompts FILE (train/lm/generate_file.py): every prompt of a file through the continuous-batching
decoder, one JSON line each in the file's order, each equal to its prompt generated alone; file errors are one line."""
from __future__ import annotations

import json

import pytest

from hybrid.train.cli.lm import generate_main
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
    ('{"prompt": "a", "top_p": 3}\n', [], ["requests[0].top_p: expected a number in (0, 1]"]),
    ('"a"\n', ["--prompt", "b"], ["--prompts: expected no --prompt"]),
])
def test_prompt_file_errors_are_one_line(text, argv, needles, run, tmp_path, capsys, one_line_error):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(text)
    assert generate_main(["--run", str(run), "--prompts", str(prompts), "--device", "cpu", *argv]) == 2
    one_line_error(capsys, "hybrid-generate", *needles)
