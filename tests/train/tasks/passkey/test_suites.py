"""The passkey suite (hybrid.train.tasks.passkey.suites): the cpu budget's plan, the smoke suite end to end with
resume, one run from the command line, the gpu budget (the LM passkey test of a gpu-long model)."""
from __future__ import annotations

import json

import pytest

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import load_checkpoint
from hybrid.train.suite import ResultsLog
from hybrid.train.cli import synthetic as cli
from hybrid.train.tasks import make_task, rng_of
from hybrid.train.tasks.passkey.suites import BUDGETS, MODELS, build_specs, model_shape, task_params

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # width-16 models (tests/conftest.py)


def test_cpu_budget_plan():
    """32 runs (8 models × 2 rates × 2 seeds), windows where they are said to be, roughly equal sizes, the key
    beyond the window in most training sequences, test lengths to 32× the training length."""
    cpu = BUDGETS["cpu"]
    specs = build_specs("passkey", cpu)
    assert len(specs) == len(MODELS) * 2 * 2 and len(cpu.lrs) >= 2 and len(cpu.seeds) >= 2
    window = cpu.extra["window"]
    task = make_task("passkey", **task_params(cpu))
    assert max(task.test_lengths) >= 32 * task.train_length and len(task.depths) >= 10 and task.samples >= 2
    assert task.beyond_window_share(window) > 0.8
    # the first half of every run draws 64-token sequences, the rest the training length
    assert {s.config["curriculum_steps"] for s in specs} == {cpu.steps // 2} and task.curriculum_length == 64
    assert task.curriculum_batch(4, rng_of(0)).ids.shape == (4, 64)
    assert task.train_batch(4, rng_of(0)).ids.shape == (4, 256)
    sizes = {}
    for name, (preset, overrides) in MODELS.items():
        config = HybridConfig.preset(preset, "tiny", vocab_size=task.vocab_size, **model_shape(cpu, preset, overrides))
        assert config.window == (None if name in ("transformer", "retnet", "vo-rnn-selective") else window), name
        sizes[name] = HybridLM(config).num_parameters(exclude_embeddings=True)
    assert max(sizes.values()) / min(sizes.values()) < 1.15, sizes
    assert {s.config["yarn"] for s in specs if s.model == "transformer"} == {True}


def test_smoke_suite_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "pk"
    argv = ["--suite", "passkey", "--budget", "smoke", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    assert "report:" in capsys.readouterr().out
    records = ResultsLog(out).records()
    assert [r["model"] for r in records] == list(MODELS)
    report = (out / "report.md").read_text()
    summary = json.loads((out / "report.json").read_text())["tasks"]["passkey"]
    for label in [*MODELS, "transformer + YaRN"]:
        assert f"| {label} |" in report
        png = summary["models"][label]["heatmap"]
        assert (out / png).read_bytes()[:8] == PNG_MAGIC and f"]({png})" in report
    for r in records:
        run = out / r["run"]
        assert (run / "passkey.png").read_bytes()[:8] == PNG_MAGIC
        assert json.loads((run / "task.json").read_text())["test_set"]["sha256"]
        assert set(r["metrics"]["accuracy"]) == {"32", "64"}
    assert "yarn" in next(r for r in records if r["model"] == "transformer")["metrics"]
    assert cli.main(argv) == 0  # a second invocation resumes: nothing runs again
    assert [r["finished_at"] for r in ResultsLog(out).records()] == [r["finished_at"] for r in records]


def test_one_passkey_run_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "one"
    assert cli.main(["--task", "passkey", "--budget", "smoke", "--preset", "hybrid", "--steps", "2", "--out", str(out),
                     "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["accuracy"]) == {"32", "64"} and results["passkey"]["depths"] == [0.0, 0.5, 1.0]
    assert (out / "passkey.png").read_bytes()[:8] == PNG_MAGIC
    assert load_checkpoint(out).config["attention"]["window"] == BUDGETS["smoke"].extra["window"]


def test_the_gpu_budget_is_the_lm_passkey_test_of_a_gpu_long_model():
    """The passkey ``gpu`` budget is Samba's LM test (§3.4: 500 steps, then retrieval far past the training length)
    for a ``gpu-long`` model: its training length, 500 steps on the text filler, tested from L to 64 × L at 11
    depths; the other synthetic tasks keep their own ``gpu`` budget."""
    from hybrid.train.bench.budgets import BUDGETS as LM_BUDGETS
    from hybrid.train.tasks import suites

    gpu, lm = BUDGETS["gpu"], LM_BUDGETS["gpu-long"]
    assert (gpu.seq_len, gpu.d_model, gpu.n_layers, gpu.n_heads) == (lm.seq_len, lm.d_model, lm.n_layers, lm.n_heads)
    assert gpu.steps == 500 and gpu.extra["window"] == lm.extra["window"] and gpu.extra["curriculum"] == 0
    task = make_task("passkey-text", **task_params(gpu, "passkey-text"))
    assert task.train_length == gpu.seq_len and task.test_lengths[0] == gpu.seq_len
    assert task.test_lengths[-1] == 64 * gpu.seq_len and len(task.depths) == 11 and task.samples == 4
    assert suites.budget_for("gpu", suite="passkey-text").extra == gpu.extra
    assert "mqar_steps" in suites.budget_for("gpu", suite="parity").extra  # the state-tracking and MQAR budget
