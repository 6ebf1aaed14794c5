"""The distillation measurement (docs/research/distillation.md, "Distillation"): evaluate run directories, then tabulate them.

    python -m hybrid.train.cli.studies.distill_bench eval runs/teacher runs/distilled-s0 ...   # writes RUN/eval.json
    python -m hybrid.train.cli.studies.distill_bench table "teacher=runs/teacher" "distilled=runs/d-s0,runs/d-s1" ...

``eval``, per run directory (``load_run``; one thread unless ``--threads``): validation bits per byte at the
training length L over the whole validation split, packed by documents as trained (``hybrid.train.lm.evaluate``);
``hybrid-bench``'s long-context figures at 1, 2, 4 and 8 × L (``hybrid.train.bench.quality.context_metrics``: the
first ``--long-seqs`` blocks of 8·L tokens of the validation stream, one forward each); decoding ms/token and
state bytes after a ``--context``-token prompt (``hybrid.train.bench.cost.decode_cost``). ``table``: one markdown
row per label, mean ± sample std over its runs, with the training tokens and tokens/s of each run (a
``distill.json``'s stage-2 median, else the median of ``metrics.jsonl``'s records).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..loop.run_dir import STUDY_EVAL_FILE

__all__ = ["evaluate_run", "table"]


def evaluate_run(run_dir, *, seq_len: int = 256, batch_size: int = 16, long_seqs: int = 8,
                 context: int = 16384, new_tokens: int = 32, data=None) -> dict:
    from ..bench.cost import decode_cost
    from ..bench.quality import context_metrics, long_sequences
    from ..data import prepare_data
    from ..lm.evaluate import evaluate
    from ..lm.inference import load_run

    run = load_run(run_dir)
    data = prepare_data(data, tokenizer=run.tokenizer)
    start = time.time()
    out = {"run": str(run_dir), "layers": run.model.config.layer_types, "window": run.model.config.attention.window}
    out.update(evaluate(run.model, data, seq_len=seq_len, batch_size=batch_size, packing="documents"))
    seqs = long_sequences(data.valid, length=8 * seq_len, count=long_seqs)
    figures = context_metrics(run.model, data, seqs, seq_len=seq_len, factors=(1, 2, 4, 8))
    out.update({k: v for k, v in figures.items() if k.startswith("bpb_")})
    out[f"decode_{context // 1024}k"] = decode_cost(run.model, context=context, new_tokens=new_tokens)
    out["eval_seconds"] = time.time() - start
    (Path(run_dir) / STUDY_EVAL_FILE).write_text(json.dumps(out, indent=2) + "\n")
    return out


def _tokens(run: Path) -> tuple[int | None, float | None]:
    """(training tokens, tokens/s) of a run directory."""
    summary = run / "distill.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        return s["tokens"]["total"], s["tokens_per_s"]["distill"]
    config = json.loads((run / "train_config.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"tokens_per_s"' in line]
    speeds = [r["tokens_per_s"] for r in records[1:] or records]
    return (config["steps"] * config["batch_size"] * config["grad_accum"] * config["seq_len"],
            statistics.median(speeds) if speeds else None)


def _mean_std(values, fmt: str = "{:.3f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def table(groups: list[tuple[str, list[Path]]], context: int = 16384) -> str:
    head = ("| model | seeds | training tokens | val bpb at L | bpb 1× L | 2× L | 4× L | 8× L | 8× L, last L | "
            f"decode ms/token at {context // 1024}K | state at {context // 1024}K | training tokens/s |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, runs in groups:
        evals = [json.loads((r / STUDY_EVAL_FILE).read_text()) for r in runs]
        tokens, speeds = zip(*(_tokens(r) for r in runs))
        get = lambda key: [e.get(key) for e in evals]  # noqa: E731
        decode = [e[f"decode_{context // 1024}k"] for e in evals]
        lines.append(
            f"| {label} | {len(runs)} | {statistics.mean(tokens) / 1e6:.2f}M | {_mean_std(get('val_bpb'))} | "
            + " | ".join(_mean_std(get(f"bpb_full_{k}x")) for k in (1, 2, 4, 8))
            + f" | {_mean_std(get('bpb_full_8x_last'))} | {_mean_std([d['ms_per_token'] for d in decode], '{:.1f}')} | "
            f"{decode[0]['state_bytes'] / 1e6:.3g} MB | {_mean_std(list(speeds), '{:,.0f}')} |")
    return "\n".join(lines)
