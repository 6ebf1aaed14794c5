"""The GPU check's pieces that can be checked without a GPU: the sync counter's plumbing, the targets read off
measured rows, and the report's tables."""
import os
import warnings

import torch

from hybrid.train.bench.gpu_check import part_correctness, report, targets


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


def _row(section, **kw):
    return {"section": section, **kw}


def test_targets_met_missed_and_unmeasured():
    rows = [
        _row("scan speed", shape=targets.MAIN_SHAPE, dtype="bfloat16", mode="dependent", impl="ours (triton)",
             passes="fwd", pct_copy=85.0),
        _row("scan speed", shape=targets.MAIN_SHAPE, dtype="bfloat16", mode="dependent", impl="ours (triton)",
             passes="fwd+bwd", pct_copy=43.0),
        _row("models", model="transformer", T=8192, batch="padded", execution="eager", tokens_per_s=100.0),
        _row("models", model="hybrid", T=8192, batch="padded", execution="eager", tokens_per_s=120.0),
        _row("syncs", syncs_per_step=0), _row("syncs", syncs_per_step=3),
    ]
    got = {t["target"].split(" ")[0] + t["target"][-12:]: t for t in targets.evaluate(rows)}
    met = [t["met"] for t in targets.evaluate(rows)]
    # fwd 85 % ≥ 80: met; fwd+bwd 43 % < 60: missed; accelerated-scan: not measured; 8K: 1.2 ≥ 1.15: met;
    # 16K and decoding: not measured; syncs: worst 3 > 0: missed
    assert met == [True, False, None, True, None, None, False], got


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
