"""Metrics: JSON-lines records, truncation on resume, the loss-curve PNG."""
import json
import math

import numpy as np
import torch

from hybrid.train.output.metrics import MetricsLogger, plot_loss_curve, read_metrics


def _run(out, steps, resume_step=None, eval_every=5):
    with MetricsLogger(out, resume_step=resume_step) as log:
        for step in steps:
            log.log_train(step, loss=torch.tensor(5.0 / step), lr=1e-3, tokens_per_s=np.float32(1000.0), grad=0.5)
            if step % eval_every == 0:
                log.log_eval(step, val_loss=5.0 / step + 0.1, val_bpb=7.0 / step)
    return out / "metrics.jsonl"


def test_records_round_trip(tmp_path):
    path = _run(tmp_path, range(1, 11))
    recs = read_metrics(path)
    assert len(path.read_text().splitlines()) == len(recs) == 12
    assert recs[0] == {"step": 1, "loss": 5.0, "lr": 1e-3, "tokens_per_s": 1000.0, "grad": 0.5}
    assert recs[5] == {"step": 5, "val_loss": 1.1, "val_bpb": 1.4}
    for line in path.read_text().splitlines():
        json.loads(line)
    with MetricsLogger(tmp_path / "nan") as log:
        log.log(1, loss=float("nan"))
    assert math.isnan(read_metrics(tmp_path / "nan" / "metrics.jsonl")[0]["loss"])


def test_resume_truncates_later_records_and_appends(tmp_path):
    path = _run(tmp_path, range(1, 11))
    with open(path, "a") as f:
        f.write('{"step": 11, "loss"')  # a line torn by a crash
    _run(tmp_path, range(6, 9), resume_step=5)
    steps = [r["step"] for r in read_metrics(path)]
    assert steps == [1, 2, 3, 4, 5, 5, 6, 7, 8]  # step 5's eval record is kept, nothing duplicated
    assert path.read_text().count("\n") == 9
    _run(tmp_path, range(1, 3))  # a fresh run starts a fresh file
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_resume_without_a_file_starts_one(tmp_path):
    path = _run(tmp_path / "new", range(4, 6), resume_step=3)
    assert [r["step"] for r in read_metrics(path)] == [4, 5, 5]


def test_plot_writes_a_png(tmp_path):
    path = _run(tmp_path, range(1, 21))
    png = plot_loss_curve(path, tmp_path / "plots" / "loss.png")
    assert png == tmp_path / "plots" / "loss.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    empty = tmp_path / "empty" / "metrics.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    assert plot_loss_curve(empty, tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"
