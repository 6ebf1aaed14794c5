"""The LM passkey test of the gpu-long models (issue 42; docs/gpu.md, "The LM passkey test"): its two device
command lines rehearsed in order on the CPU. The first trains the two models (the gpu-long command's dry run),
the second fine-tunes each from its run directory at the passkey ``gpu`` budget, the run made at a test's sizes."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from hybrid.train.cli import bench as bench_cli
from hybrid.train.cli import synthetic as synthetic_cli
from hybrid.train.tasks.passkey.suites import BUDGETS
from hybrid.train.tasks.train import train_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

GPU_DOC = Path(__file__).resolve().parents[3] / "docs" / "gpu.md"
SECTION = "### The LM passkey test of the `gpu-long` models"


def device_commands() -> list[str]:
    """The section's device command lines, in order."""
    section = GPU_DOC.read_text(encoding="utf-8").split(SECTION)[1].split("\n### ")[0]
    return [line for block in re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)
            for line in block.splitlines() if line.startswith("export ")]


def module_argv(line: str, module: str) -> list[str]:
    """The arguments of ``python3 -m module`` in a shell line, up to its first pipe."""
    return [w for w in shlex.split(line.split(f"python3 -m {module}", 1)[1].split("|")[0]) if w != "2>&1"]


def test_the_two_commands_rehearse_on_the_cpu(tmp_path, corpus, monkeypatch, capsys):
    train_line, tune_line = device_commands()
    assert len(train_line) < 2000 and len(tune_line) < 2000  # the device tool's limit for one command line
    argv = module_argv(train_line, "hybrid.train.cli.bench")
    models = argv[argv.index("--models") + 1].split(",")
    assert models == ["transformer", "hybrid-selective"] and argv[argv.index("--budget") + 1] == "gpu-long"
    assert "--compile" in argv and argv[argv.index("--seeds") + 1] == "0"
    source = argv[argv.index("--out") + 1]
    (loop,) = re.findall(r"for m in ([\w\- ]+); do", tune_line)
    assert sorted(loop.split()) == sorted(models)
    argv[argv.index("--data") + 1] = str(corpus)
    argv[argv.index("--out") + 1] = str(tmp_path / "src")
    assert bench_cli.bench_main(argv + ["--dry-run", "--seq-len", "8", "--window", "4", "--steps", "3"]) == 0

    made = []

    def at_a_tests_size(config, out, on_step=None):  # the command's run, with a test's steps, batch and lengths
        made.append(config)
        small = config.replace(steps=1, warmup=0, batch_size=2, eval_size=2,
                               task_params=dict(train_length=40, test_lengths=[40, 70], depths=2, samples=2,
                                                corpus=str(corpus)))
        return train_task(small, out, on_step=on_step)

    monkeypatch.setattr(synthetic_cli, "train_task", at_a_tests_size)
    gpu = BUDGETS["gpu"]
    for m in loop.split():
        argv = module_argv(tune_line.replace("$m", m), "hybrid.train.cli.synthetic")
        init_from = argv[argv.index("--init-from") + 1]
        assert init_from == f"{source}/baselines/{m}/seed0"  # the first command's run directory
        argv[argv.index("--init-from") + 1] = str(tmp_path / "src" / "baselines" / m / "seed0")
        argv[argv.index("--out") + 1] = str(tmp_path / "pk" / m)
        assert synthetic_cli.main(argv) == 0
        config = made[-1]
        assert (config.task, config.steps, config.batch_size, config.lr, config.warmup) == \
            ("passkey-text", gpu.steps, gpu.batch_size, gpu.lrs[0], gpu.steps // 10)
        assert config.curriculum_steps == 0 and config.task_params["test_lengths"][-1] == 64 * gpu.seq_len
        results = json.loads((tmp_path / "pk" / m / "results.json").read_text())
        assert results["status"] == "finished" and set(results["accuracy"]) == {"40", "70"}
        assert (tmp_path / "pk" / m / "passkey.png").is_file()
    assert "| exact match |" in capsys.readouterr().out  # passkey's table: exact match, and per digit
