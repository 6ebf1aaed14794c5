"""Part 6, training: a 300-step ``small`` hybrid run through ``hybrid-train`` (``python -m hybrid.train``) with
``--compile`` (bf16 autocast is the trainer's default on CUDA), on this Python's standard-library sources; its
loss curve and tokens/s from ``metrics.jsonl``, then greedy samples of the trained model in recurrent and in
parallel mode, which must be identical. On the H100 (2026-11-27) the compiled run had not logged its first step
after 70 s: it compiled twice at its first two steps (the rotary table) and once more for every new document
count (the R layers' conv), both fixed on 2026-11-28 (docs/training.md, "Compile"), and it now compiles each
block kind once. A dry run trains the tiny hybrid for a few steps, uncompiled, on a small corpus of the
library's own sources."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .context import CheckContext

PROMPT = "import os\n\ndef "


def _dry_corpus(ctx: CheckContext) -> str:
    """A few hundred KB of .py files: the library's own sources."""
    import hybrid

    corpus = ctx.work / "corpus"
    if not corpus.exists():
        corpus.mkdir()
        for i, path in enumerate(sorted(Path(hybrid.__file__).parent.rglob("*.py"))[:12]):
            shutil.copyfile(path, corpus / f"{i:03d}_{path.name}")
    return str(corpus)


def _command(ctx: CheckContext, run_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "hybrid.train", "--preset", "hybrid", "--out", str(run_dir), "--overwrite",
           "--device", str(ctx.device)]
    if ctx.dry_run:
        return cmd + ["--size", "tiny", "--steps", "4", "--seq-len", "32", "--batch-size", "2", "--eval-every", "2",
                      "--eval-batches", "2", "--log-every", "1", "--save-every", "4", "--data", _dry_corpus(ctx)]
    return cmd + ["--size", "small", "--compile", "--steps", "300", "--seq-len", "1024", "--batch-size", "16",
                  "--eval-every", "100", "--eval-batches", "20", "--log-every", "10", "--save-every", "300"]


def _samples(ctx: CheckContext, run_dir: Path, new_tokens: int) -> dict:
    from hybrid.train.lm.inference import generate_ids, load_run

    run = load_run(run_dir, device=ctx.device)
    out = {}
    for mode in ("recurrent", "parallel"):
        ids = generate_ids(run, PROMPT, max_new_tokens=new_tokens, mode=mode, temperature=0.0, stop_at_eos=False)
        out[mode] = ids
    text = run.tokenizer.decode(out["recurrent"][1:])
    return dict(identical=out["recurrent"] == out["parallel"], sample=text[:400],
                first_difference=next((i for i, (a, b) in enumerate(zip(out["recurrent"], out["parallel"])) if a != b),
                                      None))


def run(ctx: CheckContext) -> None:
    run_dir = ctx.work / "run"
    cmd = _command(ctx, run_dir)
    limit = ctx.left() - (15 if ctx.dry_run else 40)  # what the samples need afterwards
    if limit < 30:
        ctx.record("training", skipped=" ".join(cmd[2:]), reason=f"time: {ctx.left():.0f} s left")
        return
    log = ctx.work / "train.log"
    start = time.monotonic()
    try:
        with open(log, "w") as fh:
            done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=limit)
        rc = done.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    seconds = time.monotonic() - start
    records = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    curve = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    evals = [(r["step"], r["val_bpb"]) for r in records if r.get("val_bpb") is not None]
    speed = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    tail = log.read_text(errors="replace").strip().splitlines()[-12:] if log.exists() else []
    ctx.record("training", command=" ".join(["hybrid-train", *cmd[3:]]), returncode=rc, seconds=seconds,
               loss_curve=curve, val_bpb=evals, tokens_per_s_median=sorted(speed)[len(speed) // 2] if speed else None,
               log_tail=tail if rc != 0 else [], ok=rc == 0)
    if rc != 0 or not (run_dir / "checkpoint").exists():
        return
    if not ctx.has_time(10, "training", "recurrent vs parallel samples"):
        return
    try:
        result = _samples(ctx, run_dir, 24 if ctx.dry_run else 160)
    except Exception as exc:  # noqa: BLE001
        result = dict(error=f"{type(exc).__name__}: {exc}"[:400])
    ctx.record("samples", **result, ok=result.get("identical", False))
