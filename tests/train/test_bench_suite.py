"""hybrid-bench end to end: the smoke budget on a fresh directory, resume after a run interrupted halfway, equal
parameter counts and training budgets across every suite, command-line errors."""
from __future__ import annotations

import json

import pytest
import torch

from hybrid.train import load_run
from hybrid.train.bench import harness
from hybrid.train.bench.budgets import BUDGETS, bench_budget
from hybrid.train.bench.cli import bench_main
from hybrid.train.bench.harness import PARAM_TOLERANCE, suite_configs, suite_specs
from hybrid.train.bench.speed import non_embedding_parameters
from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.suites import SUITES

# the tiny corpus's validation split holds a few hundred tokens: L = 8 makes 8 × L sequences fit
SMALL = ["--budget", "smoke", "--seq-len", "8", "--steps", "3", "--quiet"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def records_of(directory):
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]


def test_smoke_end_to_end_on_a_fresh_directory(tmp_path, corpus, capsys):
    out = tmp_path / "bench"
    argv = ["--suite", "extension", "--out", str(out), "--data", str(corpus), *SMALL]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "budget 'smoke':" in printed and "steps       3" in printed  # the budget, overrides applied
    suite = out / "extension"
    records = records_of(suite)
    assert [r["run"] for r in records] == ["transformer/seed0", "finetune-none/seed0", "finetune-pi/seed0",
                                           "finetune-yarn/seed0"]
    for r in records:
        assert {"config", "seed", "metrics", "commit", "machine"} <= set(r)
        m = r["metrics"]
        assert m["val_bpb"] > 0 and m["bpb_full_8x"] > 0 and m["bpb_stream_8x_last"] > 0
        assert len(m["position_bpb"]) == len(m["position_edges"]) - 1
        assert m["train_memory_bytes"] > 0
        assert ("decode" in m) == (r["model"] == "transformer")  # a fine-tune decodes as its base
        run = load_run(suite / r["run"])  # every run directory opens for inference
        assert run.model.config.to_dict() == {**r["config"]["model"], "meta": run.model.config.meta}
    assert records[0]["metrics"]["decode"]["128"]["state_bytes"] > 0
    base = records[0]["metrics"]["extension"]
    assert set(base) == {"none", "pi", "ntk", "dynamic", "yarn", "llama3"}
    assert base["none"]["8"]["bpb_full"] == pytest.approx(records[0]["metrics"]["bpb_full_8x"], rel=1e-9)
    assert records[2]["config"]["train"]["seq_len"] == 16  # fine-tuned at 2 × L
    assert records[1]["config"]["model"]["rope_scaling"] is None
    assert records[2]["config"]["model"]["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    report = (suite / "report.md").read_text()
    for heading in ("## Context extension", "## Quality", "## Loss by position", "## Cost", "pi, fine-tuned at 2×"):
        assert heading in report
    for png in ("bpb_vs_length.png", "loss_curves.png", "loss_by_position.png", "decode_ms.png"):
        assert (suite / png).stat().st_size > 1000

    # a second invocation trains nothing and reports from the records
    assert bench_main(argv) == 0
    assert records_of(suite) == records


def test_resume_after_a_run_interrupted_halfway(tmp_path, corpus, monkeypatch):
    out = tmp_path / "bench"
    argv = ["--suite", "baselines", "--models", "transformer-window,hybrid", "--out", str(out),
            "--data", str(corpus), *SMALL]
    measure = harness._measure

    def interrupted(spec, trainer, result, budget):
        if spec.model == "hybrid":  # trained and saved, killed before its record
            raise KeyboardInterrupt
        return measure(spec, trainer, result, budget)

    monkeypatch.setattr(harness, "_measure", interrupted)
    assert bench_main(argv) == 130
    suite = out / "baselines"
    first = records_of(suite)
    assert [r["run"] for r in first] == ["transformer-window/seed0"]
    assert (suite / "hybrid" / "seed0" / "checkpoint").is_dir()  # the half-done run's directory

    monkeypatch.setattr(harness, "_measure", measure)
    assert bench_main(argv) == 0
    records = records_of(suite)
    assert [r["run"] for r in records] == ["transformer-window/seed0", "hybrid/seed0"]
    assert records[0] == first[0]  # the finished run was skipped, not redone
    assert "Does the hybrid's recurrence carry information" in (suite / "report.md").read_text()

    # the same directory with other settings is refused rather than mixed into the records
    assert bench_main([*argv, "--set", "rnn_r_max=0.9999"]) == 2
    assert bench_main([*argv[:-3], "--steps", "4", "--quiet"]) == 2
    assert records_of(suite) == records


def test_set_overrides_every_model_before_sizing():
    b = bench_budget("smoke", "baselines")
    configs = suite_configs(SUITES["baselines"], b, vocab_size=320, sets={"rnn_r_max": 0.9999, "window": 4})
    assert all(c.rnn_r_max == 0.9999 and c.window == 4 for c in configs.values())


@pytest.mark.parametrize("budget", ["smoke", "cpu"])
@pytest.mark.parametrize("suite", list(SUITES))
def test_equal_parameters_and_training_budgets_across_a_suite(suite, budget):
    b = bench_budget(budget, suite)
    configs = suite_configs(SUITES[suite], b, vocab_size=320)
    assert list(configs) == list(SUITES[suite].models)
    sizes = {name: non_embedding_parameters(c) for name, c in configs.items()}
    target = sizes[next(iter(sizes))]
    for name, n in sizes.items():
        assert abs(n - target) <= PARAM_TOLERANCE * target, f"{name}: {n:,} vs {target:,}"
    with torch.device("meta"):  # the count the records report, from the model itself
        from hybrid.models import HybridLM
        assert all(HybridLM(c).num_parameters(exclude_embeddings=True) == sizes[n] for n, c in configs.items())
    specs = suite_specs(suite, b, vocab_size=320)
    for seed in b.seeds:
        trains = [{k: v for k, v in s.config["train"].items() if k != "model"} for s in specs
                  if s.seed == seed and not s.model.startswith("finetune")]
        assert len(trains) == len(configs)
        assert all(t == trains[0] for t in trains)  # same data order (seed), optimiser, schedule, length
        assert trains[0]["seed"] == seed


def test_windowed_models_get_the_budget_window():
    b = bench_budget("cpu", "baselines")
    configs = suite_configs(SUITES["baselines"], b, vocab_size=320)
    assert configs["transformer"].window is None
    for name in ("transformer-window", "hybrid", "retnet-hybrid"):
        assert configs[name].window == BUDGETS["cpu"].extra["window"]
    assert configs["retnet-hybrid"].layer_types == "MMAM" and configs["hybrid"].layer_types == "RRAR"
    learned = suite_configs(SUITES["positions"], bench_budget("cpu", "positions"), vocab_size=320)["learned"]
    assert learned.abs_pos_max_len == BUDGETS["cpu"].seq_len


@pytest.mark.parametrize("argv, message", [
    (["--suite", "baselines", "--models", "gpt"], "models: expected names from"),
    (["--suite", "all", "--models", "hybrid"], "--models: expected a single --suite"),
    (["--suite", "baselines", "--seeds", "a"], "--seeds: expected comma-separated integers"),
    (["--suite", "baselines", "--report-only"], "--report-only: expected records in"),
])
def test_user_errors_are_one_line(argv, message, tmp_path, capsys):
    assert bench_main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybrid-bench: error: ") and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("overrides", [{"rnn_phase": "data"}, {"rnn_phase": "data", "rnn_phase_map": "2pi-tanh"},
                                       {"rnn_phase": "carope"}, {"rnn_selective": True}])
def test_parameter_count_on_the_meta_device_matches_a_real_model(overrides):
    """The harness counts parameters on the meta device (no memory); every mixer option must build there
    (the data phase once checked its initial angles with a host sync, which meta tensors cannot do)."""
    config = HybridConfig.preset("hybrid", "tiny", d_model=32, n_layers=3, n_heads=2, **overrides)
    assert non_embedding_parameters(config) == HybridLM(config).num_parameters(exclude_embeddings=True)
