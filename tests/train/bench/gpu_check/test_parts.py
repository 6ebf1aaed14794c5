"""The GPU check's pieces that can be checked without a GPU: the sync counter's plumbing, the targets read off
measured rows, and the report's tables."""
import os
import re
import types
import warnings

import pytest
import torch

from hybrid.train.bench.gpu_check import part_correctness, part_scan, report, targets


def test_sync_counter_names_our_frame(monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def our_code():  # a frame of ours asks for a sync twice; another warning is passed on untouched
        warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("something else")

    with warnings.catch_warnings(record=True) as passed:
        warnings.simplefilter("always")
        sites = part_correctness.count_syncs(our_code, roots=(os.path.dirname(__file__),))
    assert modes == ["warn", "default"]
    assert len(sites) == 2 and all("(our_code)" in s for s in sites), sites
    assert [str(w.message) for w in passed] == ["something else"]


def test_sync_counter_names_the_phase(monkeypatch):
    """Each phase runs under its own debug mode, so a sync that surfaces only at the next call back into Python
    (no frame of ours on the stack) is still placed by its phase."""
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    ran = []

    def sync():
        warnings.warn("called a synchronizing CUDA operation")

    stacks = {}
    sites = part_correctness.count_syncs({"forward": lambda: ran.append("f"), "backward": sync,
                                          "optimizer": lambda: ran.append("o")}, roots=(os.path.dirname(__file__),),
                                         stacks=stacks)
    assert ran == ["f", "o"] and modes == ["warn", "default"] * 3
    assert len(sites) == 1 and sites[0].startswith("backward: ") and "(sync)" in sites[0], sites
    assert list(stacks) == sites and stacks[sites[0]][-1].endswith("(sync)")  # innermost frame last


def test_sync_counter_leaves_out_the_debug_modes_own_notice(monkeypatch):
    """The first ``set_sync_debug_mode`` call of a process warns that the mode is a prototype; that notice is no
    sync (the H100 sessions counted it as one in whichever step they measured first)."""
    notice = "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations"
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: warnings.warn(notice))

    def sync():
        warnings.warn("Warning: called a synchronizing CUDA operation (function item)")

    with warnings.catch_warnings(record=True) as passed:
        warnings.simplefilter("always")
        quiet = part_correctness.count_syncs({"forward": lambda: None, "backward": lambda: None})
        one = part_correctness.count_syncs({"forward": sync}, roots=(os.path.dirname(__file__),))
    assert quiet == []
    assert len(one) == 1 and one[0].startswith("forward: ") and "(sync)" in one[0], one
    assert {str(w.message) for w in passed} == {notice}  # passed on untouched


def test_training_step_phases_run_one_step_on_the_cpu():
    """The phases the counter times are one whole training step, packed offsets as the trainer hands them over."""
    from hybrid.models import HybridConfig, HybridLM

    torch.manual_seed(0)
    model = HybridLM(HybridConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2, pattern="RA", window=4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 32, (1, 20))
    before = [p.detach().clone() for p in model.parameters()]
    for run in part_correctness.training_step_phases(model, opt, ids, torch.tensor([0, 7, 20]),
                                                     torch.device("cpu")).values():
        run()
    assert all(p.grad is None for p in model.parameters())  # zeroed after the step
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_rows_an_earlier_run_measured_are_skipped(tmp_path):
    """``--skip-measured``: the models and decoding rows an earlier results.json measured are recorded as skipped,
    naming that run's commit; rows it skipped or that failed there run again."""
    import json
    import time

    from hybrid.train.bench.gpu_check import part_models
    from hybrid.train.bench.gpu_check.context import CheckContext, measured_rows

    def ctx(measured, log):
        return CheckContext(part="models", device=torch.device("cpu"), dry_run=True, deadline=time.monotonic() + 60,
                            log=tmp_path / log, work=tmp_path, repo=None, measured=measured)

    rows = part_models.plan(ctx(None, "plan.jsonl"))
    earlier = [{"part": "models", "section": "models", **r, "tokens_per_s": 1.0} for r in rows[:-2]]
    earlier += [{"part": "models", "section": "models", **rows[-2], "error": "out of memory"},
                {"part": "models", "section": "models", "skipped": f"{rows[-1]}", "reason": "time"}]
    (tmp_path / "results.json").write_text(json.dumps({"header": {"commit": "abc1234"}, "rows": earlier}))
    measured = measured_rows(tmp_path / "results.json")
    assert len(measured) == len(rows) - 2

    check = ctx(measured, "models.jsonl")
    assert [check.measured_before("models", r) for r in rows] == [True] * (len(rows) - 2) + [False, False]
    logged = [json.loads(line) for line in (tmp_path / "models.jsonl").read_text().splitlines()]
    assert len(logged) == len(rows) - 2
    assert all(r["reason"] == "measured by the earlier run at commit abc1234" for r in logged)


def test_rows_measured_on_another_device_are_measured_again(tmp_path, capsys):
    """The lent GPU is an H100 or an H200: a ratio of two rows (hybrid over Transformer) needs both from one
    device, so an earlier run on another device skips nothing."""
    import json

    from hybrid.train.bench.gpu_check.context import measured_rows

    row = {"part": "models", "section": "models", "model": "transformer", "T": 8192, "batch": "padded",
           "execution": "eager", "tokens_per_s": 1.0}
    h100 = "NVIDIA H100 80GB HBM3 (132 SMs, 79 GiB)"
    (tmp_path / "results.json").write_text(json.dumps({"header": {"commit": "abc1234", "device": h100},
                                                       "rows": [row]}))
    assert len(measured_rows(tmp_path / "results.json", h100)) == 1
    assert measured_rows(tmp_path / "results.json", "NVIDIA H200 (132 SMs, 140 GiB)") == {}
    assert "was measured on NVIDIA H100 80GB HBM3 (132 SMs, 79 GiB), not NVIDIA H200" in capsys.readouterr().out


def test_rows_measured_under_other_scan_kernels_are_measured_again(tmp_path):
    """A models row of a model that runs the Triton scan names the scan's kernels; the rows an earlier run measured
    under others (before the runs layout became the default they had no ``scan``) run again, the rest are
    skipped."""
    import json
    import time

    from hybrid.kernels.complex_scan.triton_scan import scan_layout
    from hybrid.train.bench.gpu_check import part_models
    from hybrid.train.bench.gpu_check.context import CheckContext, measured_rows

    def ctx(measured):
        return CheckContext(part="models", device=torch.device("cpu"), dry_run=True, deadline=time.monotonic() + 60,
                            log=tmp_path / "models.jsonl", work=tmp_path, repo=None, measured=measured)

    rows = part_models.plan(ctx(None))
    assert {r["model"] for r in rows if "scan" in r} == set(part_models.SCAN_MODELS)
    assert all(r["scan"] == "runs, 3 stages" for r in rows if "scan" in r)
    older = [{k: v for k, v in r.items() if k != "scan"} for r in rows]  # as the runs before the field wrote them
    (tmp_path / "results.json").write_text(json.dumps({"header": {"commit": "4e37f88"}, "rows": [
        {"part": "models", "section": "models", **r, "tokens_per_s": 1.0} for r in older]}))
    check = ctx(measured_rows(tmp_path / "results.json"))
    assert [check.measured_before("models", r) for r in rows] == ["scan" not in r for r in rows]
    with scan_layout("tile"):
        assert {r["scan"] for r in part_models.plan(ctx(None)) if "scan" in r} == {"tile"}


def test_decoding_rows_written_before_the_step_field_were_eager_steps(tmp_path):
    """Each decoding row names its step, eager or compiled; the rows of runs before the field were eager steps, so
    ``--skip-measured`` skips those and measures the compiled step."""
    import json
    import time

    from hybrid.train.bench.gpu_check.context import CheckContext, measured_rows

    old = dict(model="hybrid", size="small", context=16384, batch=16)
    (tmp_path / "results.json").write_text(json.dumps({"header": {"commit": "4e37f88"}, "rows": [
        {"part": "decoding", "section": "decoding", **old, "tokens_per_s": 1300.0}]}))
    check = CheckContext(part="decoding", device=torch.device("cpu"), dry_run=True, deadline=time.monotonic() + 60,
                         log=tmp_path / "decoding.jsonl", work=tmp_path, repo=None,
                         measured=measured_rows(tmp_path / "results.json"))
    assert check.measured_before("decoding", {**old, "step": "eager"})
    assert not check.measured_before("decoding", {**old, "step": "compiled"})
    assert not check.measured_before("decoding", {**old, "batch": 1, "step": "eager"})


def test_the_decoding_targets_read_eager_and_graphed_steps():
    rows = [_row("decoding", model=m, context=16384, batch=16, step=step, tokens_per_s=tps)
            for m, step, tps in [("hybrid", "compiled", 9000.0), ("transformer", "compiled", 1000.0),
                                 ("hybrid", "eager", 1300.0), ("transformer", "eager", 1000.0),
                                 ("hybrid", "graphed", 12000.0), ("transformer", "graphed", 2000.0),
                                 ("hybrid", "graphed-compiled", 16000.0),
                                 ("transformer", "graphed-compiled", 4000.0)]]
    decoding = [t for t in targets.evaluate(rows) if t["target"].startswith("decoding")]
    assert [(t["measured"], t["met"]) for t in decoding] == [("1.30×", False), ("6.00×", True), ("4.00×", False)]
    eager_only = [r for r in rows if r["step"] == "eager"]
    decoding = [t for t in targets.evaluate(eager_only) if t["target"].startswith("decoding")]
    assert [t["met"] for t in decoding] == [False, None, None]


def _row(section, **kw):
    return {"section": section, **kw}


def test_a_missed_target_never_reads_as_the_target_itself():
    """The verdict is the unrounded value's; the figure shown gets decimals until it says the same (79.6 % was
    shown "80 %" against "≥ 80 %", 1.1496× as "1.15×", each marked missed)."""
    cases = [(79.6, 80, "{:.0f} %", "79.6 %"), (80.0, 80, "{:.0f} %", "80 %"), (80.4, 80, "{:.0f} %", "80 %"),
             (1.1496, 1.15, "{:.2f}×", "1.1496×"), (1.1500, 1.15, "{:.2f}×", "1.15×"), (4.996, 5.0, "{:.2f}×", "4.996×"),
             (6.0, 5.0, "{:.2f}×", "6.00×")]
    for value, threshold, fmt, shown in cases:
        target = targets._target("t", value, threshold, fmt)
        assert (target["measured"], target["met"]) == (shown, value >= threshold), (value, target)


def test_targets_met_missed_and_unmeasured():
    default, tile = (part_scan.ours_name("triton", *setting) for setting in (part_scan.DEFAULT, part_scan.BASELINE))
    rows = [
        _row("scan speed", shape=targets.MAIN_SHAPE, dtype="bfloat16", mode="dependent", impl=default,
             passes="fwd", pct_copy=85.0),
        _row("scan speed", shape=targets.MAIN_SHAPE, dtype="bfloat16", mode="dependent", impl=default,
             passes="fwd+bwd", pct_copy=43.0),
        _row("models", model="transformer", T=8192, batch="padded", execution="eager", tokens_per_s=100.0),
        _row("models", model="hybrid", T=8192, batch="padded", execution="eager", tokens_per_s=120.0),
        _row("syncs", syncs_per_step=0), _row("syncs", syncs_per_step=3),
    ]
    got = {t["target"].split(" ")[0] + t["target"][-12:]: t for t in targets.evaluate(rows)}
    met = [t["met"] for t in targets.evaluate(rows)]
    # fwd 85 % ≥ 80: met; fwd+bwd 43 % < 60: missed; accelerated-scan: not measured; 8K: 1.2 ≥ 1.15: met;
    # 16K and decoding (eager, graphed, graphed compiled): not measured; syncs: worst 3 > 0: missed
    assert met == [True, False, None, True, None, None, None, None, False], got
    # the scan's targets read the default setting (what users get), not a faster non-default one
    assert (default, tile) == ("ours (triton, runs, 3 stages)", "ours (triton, tile)")
    rows.append(_row("scan speed", shape=targets.MAIN_SHAPE, dtype="bfloat16", mode="dependent",
                     impl=tile, passes="fwd+bwd", pct_copy=61.0))
    assert [t["met"] for t in targets.evaluate(rows)][:2] == [True, False]
    assert targets.evaluate(rows)[1]["measured"] == "43 %"


def test_report_tables_show_errors_and_skips(tmp_path):
    header = dict(device="cpu", date="d", commit="c", torch="t", triton="tr", python="p", dry_run=True, command="x")
    rows = [
        {"part": "correctness", "section": "scan", "dtype": "float32", "T": 9, "mode": "static", "ok": True,
         "errors": {"y": 1e-7, "final": 2e-7, "grad x": 1e-7, "grad log_decay": 3e-7, "grad theta": 1e-7,
                    "grad initial_state": 1e-7}},
        {"part": "correctness", "section": "scan", "dtype": "float16", "T": 9, "mode": "mixed", "ok": False,
         "error": "RuntimeError: boom"},
        {"part": "models", "section": "models", "skipped": "{'model': 'vo-rnn'}", "reason": "time"},
    ]
    report.write_outputs(tmp_path, header, {"correctness": {"status": "finished", "rows": 2}}, rows,
                         targets.evaluate(rows))
    text = (tmp_path / "report.md").read_text()
    assert "| float32 | 9 | static |" in text and "RuntimeError: boom" in text and "**NO**" in text
    assert "- models: {'model': 'vo-rnn'} (time)" in text


def test_the_gpu_scan_cases_cover_every_dtype_and_mode_first():
    """On a GPU the scan's correctness cases run until the part's time runs out (29 in 170 s on the H100, most of
    it compiling): the first nine are every dtype × decay mode once; then the packed edges, long and autotuned
    sizes, then the short lengths. 39 cases in all, none twice."""
    import types

    cases = part_correctness._scan_cases(types.SimpleNamespace(dry_run=False))
    keys = [(str(dt), T, mode, tuple(sorted(kw.items()))) for dt, T, mode, kw in cases]
    assert len(keys) == len(set(keys)) == 39
    first = {(dt, mode) for dt, T, mode, kw in cases[:9]}
    assert len(first) == 9 and all(T == 1000 and not kw for _, T, _, kw in cases[:9])
    assert [kw.get("packed_edge") for *_, kw in cases[9:14]] == [32, 64, 128, 64, 64]
    assert part_correctness.FIRST_PASS == 14  # the part's first pass: these 14, before the compile and the syncs
    assert {T for _, T, _, kw in cases[-18:]} == {1, 65}


VERBOSE_LOG = """\
tests/cuda/test_model_cuda.py::test_compiled_fullgraph_equals_eager[static] PASSED [ 10%]
tests/cuda/test_model_cuda.py::test_compiled_fullgraph_equals_eager[selective] FAILED [ 20%]
tests/cuda/test_scan_cuda.py::test_short[fp32-static-1] PASSED [ 30%]
tests/cuda/test_scan_cuda.py::test_short[fp32-static-7] SKIPPED (needs CUDA) [ 40%]
"""


def test_tests_part_reads_a_verbose_log_cut_short():
    """A suite killed at the part's limit prints no summary: the verbose lines say what ran."""
    from hybrid.train.bench.gpu_check import part_tests

    assert part_tests.outcomes(VERBOSE_LOG) == {"passed": 2, "failed": 1, "skipped": 1}
    summary = VERBOSE_LOG + ("FAILED tests/cuda/test_model_cuda.py::test_compiled_fullgraph_equals_eager[selective]"
                             " - x\n")
    summary += "ERROR tests/cuda/test_scan_cuda.py::test_long - RuntimeError\n"
    assert part_tests.failed_tests(summary) == ["tests/cuda/test_model_cuda.py::test_compiled_fullgraph_equals_eager"
                                                "[selective]", "tests/cuda/test_scan_cuda.py::test_long"]


def test_tests_part_child_counts_its_triton_kernels(tmp_path, monkeypatch):
    """The pytest child's plugin points Triton's compilation listener at the part's count file."""
    import importlib

    knobs = pytest.importorskip("triton").knobs
    from hybrid.train.bench.gpu_check import pytest_plugin

    monkeypatch.setattr(knobs.compilation, "listener", None)
    monkeypatch.setenv(pytest_plugin.LISTEN_VARIABLE, str(tmp_path / "tests.triton"))
    importlib.reload(pytest_plugin)
    knobs.compilation.listener(src=types.SimpleNamespace(name="scan_fwd"), metadata=None, metadata_group=None,
                               times=types.SimpleNamespace(total=2_500_000), cache_hit=False)
    knobs.compilation.listener(src=types.SimpleNamespace(name="scan_bwd"), metadata=None, metadata_group=None,
                               times=None, cache_hit=True)
    assert (tmp_path / "tests.triton").read_text() == "compiled scan_fwd 2.50\nloaded scan_bwd\n"


def test_packed_batches_on_flex_compile_without_fullgraph_and_equal_eager(monkeypatch):
    """FlexAttention's packed mask is built outside the graph by design, which ``fullgraph=True`` refuses (both
    hybrids' compile test failed so on an H200, 2026-11-28); the check compiles that case without it. The CPU runs
    flex when asked to (forward only: torch has no CPU backward for it)."""
    from hybrid.models import HybridConfig, HybridLM

    torch.manual_seed(0)
    model = HybridLM(HybridConfig.preset("hybrid", "tiny", window=8)).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    cu = torch.tensor([0, 5, 23, 40])
    assert not part_correctness.packed_mask_breaks_graph(model, cu)  # the CPU's windows: blocked
    monkeypatch.setenv("HYBRID_WINDOW_BACKEND", "flex")
    assert part_correctness.packed_mask_breaks_graph(model, cu)
    assert not part_correctness.packed_mask_breaks_graph(model, None)
    torch._dynamo.reset()
    with torch.no_grad():
        want, _ = model(ids, cu_seqlens=cu, output_final_state=False)
        with pytest.raises(Exception, match="torch.compiler.disable"):
            torch.compile(model, fullgraph=True, backend="eager")(ids, cu_seqlens=cu, output_final_state=False)
        torch._dynamo.reset()
        got, _ = part_correctness.compiled_for(model, cu, backend="eager")(ids, cu_seqlens=cu,
                                                                            output_final_state=False)
    torch.testing.assert_close(got, want)  # float32: the traced flex sums in another order (9.5e-7 apart)


def test_tests_part_child_prints_each_failure_as_it_happens(tmp_path):
    """A suite stopped at the part's limit prints no summary, so each failure's traceback is printed when the test
    fails, after its verbose line and before the next test's (the H200's five failures came back as names only),
    and each test's seconds on a line after it."""
    import subprocess
    import sys
    from pathlib import Path

    from hybrid.train.bench.gpu_check import part_tests

    (tmp_path / "test_two.py").write_text("def test_fails():\n    assert 1 + 1 == 3, 'arithmetic'\n\n"
                                          "def test_passes():\n    pass\n")
    repo = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p",
                           "hybrid.train.bench.gpu_check.pytest_plugin", "test_two.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    log = done.stdout
    first, report, second = log.index("test_fails FAILED"), log.index("AssertionError: arithmetic"), \
        log.index("test_passes PASSED")
    assert first < log.index("---- test_two.py::test_fails failed (call) ----") < report < second, log
    assert part_tests.outcomes(log[:log.index("short test summary")]) == {"failed": 1, "passed": 1}
    seconds = [line for line in log.splitlines() if re.fullmatch(r"    \d+\.\d s", line)]
    assert len(seconds) == 2 and log.index(seconds[0]) < second < log.rindex(seconds[1]), log  # each test's own


def test_the_checks_commit_comes_from_the_device_commands_variable_before_git(monkeypatch):
    """On the device machine a git can find another repository around the copy (the records of 2026-11-28)."""
    from hybrid.train.bench.gpu_check import cli

    monkeypatch.setenv("HYBRID_COMMIT", "abc1234")
    assert cli._commit(None) == "abc1234" and cli._commit("def5678") == "def5678"


def test_a_suite_stopped_at_the_parts_limit_says_what_finished(tmp_path, monkeypatch):
    """pytest's child is killed at the part's deadline: no summary line, but its verbose lines (unbuffered, as
    the check's parts run) still name the tests that finished, and the row says it was stopped."""
    import json
    import subprocess
    import time

    from hybrid.train.bench.gpu_check import part_tests
    from hybrid.train.bench.gpu_check.context import CheckContext

    printed = (b"tests/test_slow.py::test_quick PASSED     [ 50%]\n"
               b"tests/test_slow.py::test_other FAILED     [100%]\ntests/test_slow.py::test_hangs ")
    asked = {}

    def killed_at_the_limit(cmd, timeout, **kwargs):
        asked.update(cmd=cmd, timeout=timeout, env=kwargs["env"])
        raise subprocess.TimeoutExpired(cmd, timeout, output=printed, stderr=None)

    monkeypatch.setattr(part_tests.subprocess, "run", killed_at_the_limit)
    (tmp_path / "tests").mkdir()
    ctx = CheckContext(part="tests", device=torch.device("cpu"), dry_run=True, deadline=time.monotonic() + 60,
                       log=tmp_path / "tests.jsonl", work=tmp_path, repo=tmp_path)
    part_tests.run_pytest(ctx, ["tests/test_slow.py"])
    (row,) = [json.loads(line) for line in (tmp_path / "tests.jsonl").read_text().splitlines()]
    assert row["returncode"] == "timeout" and row["ok"] is False
    assert row["summary"] == "stopped at the part's limit after 1 passed, 1 failed", row
    assert row["failed"] == ["tests/test_slow.py::test_other"]
    assert "test_slow.py::test_quick PASSED" in (tmp_path / "pytest.log").read_text()
    assert 50 < asked["timeout"] <= 55 and "-v" in asked["cmd"]  # the part's time left, less 5 s
    assert asked["env"][part_tests.LISTEN_VARIABLE] == str(tmp_path / "tests.triton")


def test_the_cuda_tests_run_new_first_captures_after_them_compiles_last_in_each_file():
    """The order tests/cuda/conftest.py gives (what the tests part reaches first when its time runs out): the
    scan, the models (the Inductor compiles last), the decoding loops' syncs, the CUDA-graph captures (eager, then
    compiled and fla's), G against its reference, then the windows and the conv, which the correctness part has
    checked on the GPU."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "cuda", "tests/cuda"], cwd=repo, capture_output=True, text=True, timeout=300)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    files = [i.split("::")[0].rsplit("/", 1)[-1] for i in ids]
    assert list(dict.fromkeys(files)) == ["test_scan_cuda.py", "test_model_cuda.py", "test_decoding_syncs_cuda.py",
                                          "test_graphed_decoding_cuda.py", "test_vo_gla_cuda.py",
                                          "test_window_conv_cuda.py"], done.stdout[-2000:]
    for name in ("test_model_cuda.py", "test_graphed_decoding_cuda.py"):
        late = ["compiled" in i or "-fla-" in i for i, f in zip(ids, files) if f == name]
        assert any(late) and late == sorted(late), (name, late)  # every compile (and fla's autotuning) after the rest


def test_a_gradient_that_is_exactly_zero_is_measured_against_its_neighbours():
    """Window 1: the reference's grad q and grad k are exactly 0; a kernel's round-off there is relative to the
    other gradients' size, not a plain norm held to a relative tolerance (which a large T would fail)."""
    from hybrid.train.bench.gpu_check.context import rel_error
    from hybrid.train.bench.gpu_check.numerics import window_errors

    zero, off = torch.zeros(3, dtype=torch.float64), torch.tensor([3e-5, 0.0, 4e-5])
    assert rel_error(off, zero) == pytest.approx(5e-5)
    assert rel_error(off, zero, zero_scale=10.0) == pytest.approx(5e-6)
    assert rel_error(torch.tensor([1.0, float("nan")]), zero[:2], zero_scale=1.0) == float("inf")
    assert rel_error(2 * off, off, zero_scale=1e9) == pytest.approx(1.0)  # a nonzero reference: relative as before
    errors = window_errors(torch.device("cpu"), torch.float32, "blocked", 45, 1, D=16)
    assert max(errors.values()) <= part_correctness.WINDOW_TOL[torch.float32] / 10, errors
