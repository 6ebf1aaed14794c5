"""The gpu-long budget (issue 42): its models at the H100's measured size, and the device command of docs/gpu.md
rehearsed on the CPU with --dry-run, stopped by --max-minutes after its first model and continued by the same
command."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hybrid.train.bench.budgets import BUDGETS, bench_budget, dry_run
from hybrid.train.bench.harness import suite_configs, suite_specs
from hybrid.train.bench.speed import non_embedding_parameters
from hybrid.train.bench.suites import SUITES
from hybrid.train.cli import bench as bench_cli
from hybrid.train.suite import TimeLimit

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

GPU_DOC = Path(__file__).resolve().parents[3] / "docs" / "gpu.md"
MODELS = ["transformer", "transformer-window", "hybrid", "hybrid-selective"]


def device_command() -> str:
    """The device's command line of docs/gpu.md, "The long-context budget (issue 42)"."""
    section = GPU_DOC.read_text(encoding="utf-8").split("### The long-context budget (issue 42)")[1].split("\n### ")[0]
    (line,) = [line for block in re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)
               for line in block.splitlines() if line.startswith("export ")]
    return line


def bench_argv(line: str) -> list[str]:
    """The hybrid-bench arguments of a shell line (up to its first pipe)."""
    words = shlex.split(line.split("python3 -m hybrid.train.cli.bench", 1)[1].split("|")[0])
    return [w for w in words if w not in ("2>&1",)]


def test_the_models_are_the_measured_small_size_with_head_dim_64():
    b = bench_budget("gpu-long", "baselines").override(models=MODELS, known_models=list(SUITES["baselines"].models))
    configs = suite_configs(SUITES["baselines"], b, vocab_size=320)
    sizes = {name: non_embedding_parameters(c) for name, c in configs.items()}
    assert sizes["transformer"] == 25_305_600  # the `small` Transformer of docs/research/gpu.md
    for name, config in configs.items():
        assert (config.d_model, config.n_layers, config.d_model // config.n_heads) == (512, 8, 64)
        assert abs(sizes[name] - sizes["transformer"]) <= 0.005 * sizes["transformer"], name
    assert configs["transformer-window"].replace(window=None, meta={}) == configs["transformer"].replace(meta={})
    assert all(configs[m].window == 64 for m in MODELS[1:]) and configs["transformer"].window is None
    assert configs["hybrid"].layer_types == "RRARRARR" and configs["hybrid-selective"].rnn_selective
    assert configs["hybrid"].mlp_hidden % 32 == 0 and configs["hybrid-selective"].mlp_hidden % 32 == 0
    (spec, *_) = suite_specs("baselines", b, vocab_size=320, compile=True)
    train = spec.config["train"]
    assert (train["seq_len"], train["batch_size"], train["steps"], train["compile"]) == (2048, 32, 300, True)
    assert b.seeds == (0, 1)


def test_dry_run_keeps_the_models_and_the_sizing_rule_at_the_smoke_sizes():
    b = dry_run(bench_budget("gpu-long", "baselines"))
    smoke = BUDGETS["smoke"]
    assert (b.name, b.n_layers, b.n_heads, b.seq_len, b.steps, b.seeds) == \
        ("gpu-long (dry run)", smoke.n_layers, smoke.n_heads, smoke.seq_len, smoke.steps, (0, 1))
    assert b.d_model == 128 and b.d_model // b.n_heads == 64  # the budget's head size: the MLP width can match there
    assert b.extra == {**smoke.extra, "match": "mlp"}  # window_blocks and the rest at the smoke sizes
    configs = suite_configs(SUITES["baselines"], b, vocab_size=320)  # every model of the suite, as documented
    assert {c.d_model for c in configs.values()} == {128}  # matched by the MLP, not the width
    assert configs["retnet-hybrid"].mlp_hidden and configs["hybrid-gla"].mlp_hidden


def test_the_device_command_fits_and_rehearses_on_the_cpu(tmp_path, corpus, monkeypatch, capsys, records_of):
    line = device_command()
    assert len(line) < 2000  # the device tool's limit for one command line
    argv = bench_argv(line)
    assert argv[argv.index("--budget") + 1] == "gpu-long" and "--compile" in argv
    assert argv[argv.index("--models") + 1] == ",".join(MODELS) and "--max-minutes" in argv
    argv[argv.index("--data") + 1] = str(corpus)
    argv[argv.index("--out") + 1] = str(tmp_path / "gpu-long")
    # the tiny corpus holds 8 × L validation tokens at L 8; a window shorter than L
    argv += ["--dry-run", "--seq-len", "8", "--window", "4", "--steps", "3"]

    class FirstRunOnly(TimeLimit):  # a device slower than the estimate: only one model fits the command
        def fits(self) -> bool:
            return self.longest == 0

    monkeypatch.setattr(bench_cli, "TimeLimit", FirstRunOnly)
    assert bench_cli.bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "--dry-run: eager on the CPU (--compile is left to the real run)" in printed
    assert "budget 'gpu-long (dry run)':" in printed
    assert "--max-minutes: 3 runs left after 8 minutes" in printed and "the same command continues" in printed
    suite = tmp_path / "gpu-long" / "baselines"
    first = records_of(suite)
    assert [r["run"] for r in first] == ["transformer/seed0"]
    assert "report: " in printed and (suite / "report.md").is_file()  # a report of what finished

    monkeypatch.setattr(bench_cli, "TimeLimit", TimeLimit)
    assert bench_cli.bench_main(argv) == 0  # the same command continues with the other three
    records = records_of(suite)
    assert [r["run"] for r in records] == [f"{m}/seed0" for m in MODELS] and records[0] == first[0]
    for r in records:
        assert r["config"]["train"]["compile"] is False and r["config"]["train"]["device"] == "cpu"
        assert r["metrics"]["window_bpb"] and r["metrics"]["position_bpb"] and r["metrics"]["tokens_per_s"] > 0
        # where a model's time goes: training, then each measurement (decoding: the first seed's)
        phases = r["metrics"]["phase_seconds"]
        assert list(phases) == ["train", "memory", "long context", "window", "decode"], phases
        assert all(v > 0 for v in phases.values()) and sum(phases.values()) <= r["seconds"] + 0.01  # (rounded)
    report = (suite / "report.md").read_text()
    for heading in ("## Past the window", "### The global model's gain", "## Loss by position", "## Cost",
                    "one seed: no spread", "Wall seconds per run", "| model | train | memory | long context |"):
        assert heading in report


@pytest.mark.parametrize("flags, message", [
    (["--dry-run", "--device", "cuda"], "--dry-run: expected --device auto or cpu (the rehearsal runs on the CPU), "
                                        "got cuda"),
    (["--max-minutes", "0"], "--max-minutes: expected a finite number > 0, got '0'"),
])
def test_user_errors_are_one_line(flags, message, tmp_path, capsys):
    assert bench_cli.bench_main(["--suite", "baselines", "--budget", "gpu-long", *flags, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
