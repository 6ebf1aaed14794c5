"""hybrid.train.bench.harness: resume after a run interrupted halfway, --set before sizing, equal parameter
counts and training budgets across every suite, the budget window."""
from __future__ import annotations

import json
import math

import pytest
import torch

from hybrid.train.bench import harness
from hybrid.train.bench.budgets import BUDGETS, bench_budget, dry_run, with_window
from hybrid.train.cli.bench import bench_main
from hybrid.train.bench.harness import PARAM_TOLERANCE, suite_configs, suite_specs
from hybrid.train.bench.speed import non_embedding_parameters
from hybrid.models import HybridLM
from hybrid.train.bench.suites import SUITES

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def test_resume_after_a_run_interrupted_halfway(tmp_path, corpus, monkeypatch, records_of, smoke_flags):
    out = tmp_path / "bench"
    argv = ["--suite", "baselines", "--models", "transformer-window,hybrid", "--out", str(out),
            "--data", str(corpus), *smoke_flags]
    measure = harness.measure_run

    def interrupted(spec, trainer, result, budget, **kwargs):
        if spec.model == "hybrid":  # trained and saved, killed before its record
            raise KeyboardInterrupt
        return measure(spec, trainer, result, budget, **kwargs)

    monkeypatch.setattr(harness, "measure_run", interrupted)
    assert bench_main(argv) == 130
    suite = out / "baselines"
    first = records_of(suite)
    assert [r["run"] for r in first] == ["transformer-window/seed0"]
    assert (suite / "hybrid" / "seed0" / "checkpoint").is_dir()  # the half-done run's directory

    monkeypatch.setattr(harness, "measure_run", measure)
    assert bench_main(argv) == 0
    records = records_of(suite)
    assert [r["run"] for r in records] == ["transformer-window/seed0", "hybrid/seed0"]
    assert records[0] == first[0]  # the finished run was skipped, not redone
    assert "Does the hybrid's recurrence carry information" in (suite / "report.md").read_text()

    # the same directory with other settings is refused rather than mixed into the records
    assert bench_main([*argv, "--set", "rnn_r_max=0.9999"]) == 2
    assert bench_main([*argv[:-3], "--steps", "4", "--quiet"]) == 2
    assert records_of(suite) == records


def test_a_run_measured_at_another_window_is_refused(tmp_path, corpus, records_of, smoke_flags, capsys):
    """The global Transformer's config has no window, but its window_bpb buckets do: --window on its directory
    must not reuse a record measured at the budget's window."""
    out = tmp_path / "bench"  # beside the corpus: an --out holding the --data is refused
    argv = ["--suite", "baselines", "--models", "transformer", "--out", str(out), "--data", str(corpus),
            *smoke_flags]
    assert bench_main(argv) == 0
    records = records_of(out / "baselines")
    capsys.readouterr()
    assert bench_main([*argv, "--window", "2"]) == 2
    err = capsys.readouterr().err
    assert "was measured at window 4, this command asks for 2 (--window)" in err and err.count("\n") == 1
    assert records_of(out / "baselines") == records


def test_a_run_trained_on_other_tokens_is_refused(tmp_path, corpus, records_of, smoke_flags, capsys):
    """Records name the tokens they were trained and scored on: the same --data path holding other text (another
    machine's corpus folder), or a record from before digests, is not continued."""
    from hybrid.train.data import prepare_data

    out = tmp_path / "bench"
    argv = ["--suite", "baselines", "--models", "transformer", "--out", str(out), "--data", str(corpus),
            *smoke_flags]
    assert bench_main(argv) == 0
    records = records_of(out / "baselines")
    assert records[0]["config"]["data_digest"] == prepare_data(corpus).content_digest
    capsys.readouterr()
    assert bench_main(argv) == 0 and records_of(out / "baselines") == records  # the same tokens: skipped

    document = sorted(p for p in corpus.rglob("*") if p.is_file())[0]
    document.write_text(document.read_text() + "\none more line\n")
    assert bench_main(argv) == 2
    err = capsys.readouterr().err
    assert "was trained on other tokens than --data gives here (data digest " in err and err.count("\n") == 1

    document.write_text(document.read_text().removesuffix("\none more line\n"))
    del records[0]["config"]["data_digest"]
    (out / "baselines" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert bench_main(argv) == 2
    assert "(data digest not recorded, here " in capsys.readouterr().err


def test_set_overrides_every_model_before_sizing():
    b = bench_budget("smoke", "baselines")
    configs = suite_configs(SUITES["baselines"], b, vocab_size=320, sets={"rnn_r_max": 0.9999, "rope_base": 500.0})
    assert all(c.rnn_r_max == 0.9999 and c.rope_base == 500.0 for c in configs.values())
    assert configs["transformer"].window is None and configs["transformer-window"].window == b.extra["window"]


@pytest.mark.parametrize("dry", [False, True], ids=["budget", "dry-run"])
@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("suite", list(SUITES))
def test_equal_parameters_and_training_budgets_across_a_suite(suite, budget, dry):
    """Every suite at every budget, and at its --dry-run (the issue: gpu-long's baselines did not size there), is
    sized: the models only, nothing trains."""
    b = dry_run(bench_budget(budget, suite)) if dry else bench_budget(budget, suite)
    configs = suite_configs(SUITES[suite], b, vocab_size=320)
    assert list(configs) == list(SUITES[suite].models)
    sizes = {name: non_embedding_parameters(c) for name, c in configs.items()}
    target = sizes[next(iter(sizes))]
    for name, n in sizes.items():
        assert abs(n - target) <= PARAM_TOLERANCE * target, f"{name}: {n:,} vs {target:,}"
    with torch.device("meta"):  # the count the records report, from the model itself
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
    for name in ("transformer-window", "hybrid", "hybrid-selective", "retnet-hybrid"):
        assert configs[name].window == BUDGETS["cpu"].extra["window"]
    assert configs["retnet-hybrid"].layer_types == "MMAM" and configs["hybrid"].layer_types == "RRAR"
    assert configs["hybrid-selective"].rnn_selective and not configs["hybrid"].rnn_selective
    long = suite_configs(SUITES["baselines"], bench_budget("long", "baselines"), vocab_size=320)
    assert long["transformer"].window is None and long["hybrid-selective"].window == 64
    learned = suite_configs(SUITES["positions"], bench_budget("cpu", "positions"), vocab_size=320)["learned"]
    assert learned.abs_pos_max_len == BUDGETS["cpu"].seq_len


def test_window_override_reaches_the_windowed_models_only():
    """--window 16 on the long budget: every windowed model gets 16, the global Transformer stays global, the
    budget record (which the report reads) says 16, and the budget table is not changed."""
    b = with_window(bench_budget("long", "baselines"), 16)
    assert b.extra["window"] == 16 and BUDGETS["long"].extra["window"] == 64
    assert {k: v for k, v in b.extra.items() if k != "window"} == \
        {k: v for k, v in BUDGETS["long"].extra.items() if k != "window"}
    configs = suite_configs(SUITES["baselines"], b, vocab_size=320)
    assert configs["transformer"].window is None
    assert all(configs[m].window == 16 for m in ("transformer-window", "hybrid", "hybrid-selective"))
    assert suite_specs("baselines", b, vocab_size=320)[0].config["budget"]["extra"]["window"] == 16
    with pytest.raises(ValueError, match="--window: expected 1 … 1023 tokens .* got 1024"):
        with_window(b, 1024)


@pytest.mark.parametrize("sets", [{"window": 4}, {"attention.window": 4}, {"attention": {"window": 4}}])
def test_set_window_is_refused(sets):
    """--set window would reach every model, the global Transformer included, while the buckets and the report
    kept the budget's window (the "global" model's gain was then one windowed model's over another)."""
    (key,) = sets
    with pytest.raises(ValueError, match=f"--set {key}: expected the attention window through --window"):
        suite_configs(SUITES["baselines"], bench_budget("smoke", "baselines"), vocab_size=320, sets=sets)
    with pytest.raises(ValueError, match=f"--set {key}: expected"):  # before any data is read
        harness.run_bench("baselines", bench_budget("smoke", "baselines"), out="unused", data="/nonexistent",
                          sets=sets)
    configs = suite_configs(SUITES["baselines"], bench_budget("smoke", "baselines"), vocab_size=320,
                            sets={"attention": {"n_kv_heads": 1}})  # the rest of the section is still --set's
    assert configs["transformer"].window is None and configs["transformer"].attention.n_kv_heads == 1


def test_a_window_not_shorter_than_the_length_is_refused_before_any_data_is_read():
    from hybrid.train.bench.budgets import check_window

    budget = bench_budget("cpu", "baselines").override(seq_len=16)  # window 32
    with pytest.raises(ValueError, match=r"--seq-len: expected more tokens than the attention window 32 \(or a "
                                         r"--window below 16\), got 16"):
        check_window(budget)
    with pytest.raises(ValueError, match="--seq-len: expected more tokens than the attention window 32"):
        harness.run_bench("baselines", budget, out="unused", data="/nonexistent")
    assert check_window(with_window(budget, 8)).extra["window"] == 8


def test_records_hold_no_nan():
    """A record is one line of strict JSON: a NaN or infinite figure is written as null (the report's "–")."""
    metrics = {"val_bpb": float("nan"), "window_bpb": [1.5, float("inf"), None], "decode": {"64": {"ms": -math.inf}},
               "position_edges": (0, 2), "params": 7, "name": "x"}
    clean = harness.finite_or_none(metrics)
    assert clean == {"val_bpb": None, "window_bpb": [1.5, None, None], "decode": {"64": {"ms": None}},
                     "position_edges": [0, 2], "params": 7, "name": "x"}
    json.dumps(clean, allow_nan=False)


@pytest.mark.parametrize("compile", [True, False])
def test_each_compiled_run_starts_from_no_graphs_of_the_runs_before_it(tmp_path, monkeypatch, compile):
    """Runs in one process share Dynamo's per-code recompile limit through the blocks' common ``forward``: a
    compiled run forgets the earlier runs' graphs first (an eager run has none to forget)."""
    events = []

    class Trainer:
        def __init__(self, config, **kwargs):
            events.append("trainer")

        def fit(self):
            return None

    monkeypatch.setattr(torch.compiler, "reset", lambda: events.append("reset"))
    monkeypatch.setattr(harness, "Trainer", Trainer)
    monkeypatch.setattr(harness, "measure_run", lambda spec, trainer, result, budget, **kw: {"run": spec.run})
    budget = bench_budget("smoke", "baselines")
    execute = harness.make_execute(budget)
    for spec in suite_specs("baselines", budget, vocab_size=320, compile=compile)[:2]:
        assert execute(spec, tmp_path / spec.run, lambda n: None) == {"run": spec.run}
    assert events == ["reset", "trainer", "reset", "trainer"] if compile else ["trainer", "trainer"]
