"""report.md, results.json and the plots, written again after every part from every row measured so far."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .step_split import ceilings

__all__ = ["write_outputs"]


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e5:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.1e}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value).replace("|", "/").replace("\n", " ")


def _table(rows: list[dict], columns: list[tuple[str, object]]) -> list[str]:
    """Markdown table; a column is (header, key) or (header, function of the row)."""
    out = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [_fmt(get(r) if callable(get) else r.get(get)) for _, get in columns]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _errors(names):
    return [(n, (lambda r, n=n: r.get("errors", {}).get(n, r.get("error") if n == names[0] else None)))
            for n in names]


def _ratio(rows: list[dict], key: str, match: tuple[str, ...], baseline: str):
    """A column function: the row's ``key`` over the baseline model's on the same ``match`` fields."""
    base = {tuple(r.get(m) for m in match): r.get(key) for r in rows if r.get("model") == baseline and r.get(key)}

    def ratio(r):
        b = base.get(tuple(r.get(m) for m in match))
        return r[key] / b if b and r.get(key) else None
    return ratio


def _measured(rows, section):
    return [r for r in rows if r["section"] == section and "skipped" not in r]


def _sections(rows: list[dict]) -> list[str]:
    lines = []
    scan = _measured(rows, "scan")
    if scan:
        lines += ["### The Triton scan against float64 (relative error ‖got − ref‖ / ‖ref‖)", ""]
        lines += _table(scan, [("layout", "layout"), ("dtype", "dtype"), ("T", "T"), ("decay/angle", "mode"),
                               ("packed, edges", "packed_edge"), ("B", "B"), ("H", "H"), ("D", "D")]
                        + _errors(["y", "final", "grad x", "grad log_decay", "grad theta", "grad initial_state"])
                        + [("ok", "ok")])
    for section, title, names, keys in (
            ("window", "Window / global attention backends against the float64 reference",
             ["out", "grad q", "grad k", "grad v"], ["backend", "dtype", "T", "window", "packed"]),
            ("conv", "The causal conv against the float64 reference",
             ["y", "final", "grad x", "grad weight", "grad bias", "grad initial_state"], ["backend", "dtype", "packed"]),
            ("compile", "torch.compile(fullgraph=True) of the tiny hybrid against eager (float32)",
             ["logits", "grads (worst parameter)"], ["selective", "batch", "backend"])):
        found = _measured(rows, section)
        if found:
            lines += [f"### {title}", ""] + _table(found, [(k, k) for k in keys] + _errors(names) + [("ok", "ok")])
    syncs = _measured(rows, "syncs")
    if syncs:
        lines += ["### Host syncs in one training step (bf16 autocast, AdamW)", ""]
        lines += _table(syncs, [("model", "model"), ("selective", "selective"), ("batch", "batch"),
                                ("syncs / step", "syncs_per_step"),
                                ("our call sites", "sites")])
    tests = _measured(rows, "pytest")
    if tests:
        lines += ["### Test suites on the device", ""]
        lines += _table(tests, [("pytest", "target"), ("exit", "returncode"), ("summary", "summary"),
                                ("failed", "failed")])
    speed = _measured(rows, "scan speed")
    if speed:
        lines += ["### The scan's speed (median of triton.testing.do_bench)", ""]
        lines += _table(speed, [("shape", "shape"), ("dtype", "dtype"), ("decay/angle", "mode"), ("impl", "impl"),
                                ("pass", "passes"), ("ms", "ms"), ("GB/s", "gb_s"), ("% copy", "pct_copy"),
                                ("tiles the tuner chose", "tiles"), ("error", "error")])
    models = _measured(rows, "models")
    if models:
        lines += ["### Training throughput (one AdamW step, bf16 autocast; same non-embedding size)", ""]
        match = ("T", "batch", "execution")
        lines += _table(models, [("T", "T"), ("B", "B"), ("batch", "batch"), ("execution", "execution"),
                                 ("model", "model"), ("pattern", "pattern"), ("d_model", "d_model"), ("MLP", "mlp_hidden"),
                                 ("tokens/s", "tokens_per_s"),
                                 ("× transformer", _ratio(models, "tokens_per_s", match, "transformer")),
                                 ("step ms", "step_ms"), ("peak GiB", "peak_memory_gib"),
                                 ("first step s", "first_step_s"), ("error", "error")])
        split = ceilings(rows)
        if split:
            lines += ["### The Transformer's step split by length, and the ratio it leaves other models", "",
                      "Fitted to its rows: a step's time per token is a fixed part plus one growing with T "
                      "(attention). A model with mixers that cost nothing, the rest of its step the Transformer's, "
                      "would reach the ceiling; the hybrid's share is (its ratio − 1) / (ceiling − 1). The fit is "
                      "exact with two lengths; its residual checks it with more (step_split.py).", ""]
            lines += _table(split, [("execution", "execution"), ("batch", "batch"), ("T", "T"),
                                    ("Transformer step ms", "step_ms"), ("fixed ms", "fixed_ms"),
                                    ("attention ms", "attention_ms"), ("fit residual", "fit_residual"),
                                    ("ceiling ×", "ceiling"), ("hybrid ×", "ratio"),
                                    ("share of the ceiling's gain", "share_of_ceiling")])
    decoding = _measured(rows, "decoding")
    if decoding:
        lines += ["### Decoding (recurrent steps after a chunked prefill: eager, from a CUDA graph, compiled; "
                  "the next token by argmax, or sampled where the step says so)", ""]
        match = ("context", "batch", "step")
        lines += _table(decoding, [("context", "context"), ("batch", "batch"), ("step", "step"), ("model", "model"),
                                   ("ms / step", "ms_per_step"), ("tokens/s", "tokens_per_s"),
                                   ("× transformer", _ratio(decoding, "tokens_per_s", match, "transformer")),
                                   ("state bytes", "state_bytes"), ("prefill s", "prefill_s"),
                                   ("prefill tok/s", "prefill_tokens_per_s"), ("warm-up s", "warm_up_s"),
                                   ("first 2 steps s", "warm_up_steps_s"), ("error", "error")])
    for r in _measured(rows, "training"):
        curve = r.get("loss_curve") or []
        lines += ["### The training run", "", f"`{r['command']}`: exit {r['returncode']} after {_fmt(r.get('seconds'))} s; "
                  f"loss {curve[0][1]:.3f} at step {curve[0][0]} → {curve[-1][1]:.3f} at step {curve[-1][0]}; "
                  if curve else f"`{r['command']}`: exit {r['returncode']} after {_fmt(r.get('seconds'))} s, no loss "
                                "recorded; ",
                  f"validation bpb {_fmt(r.get('val_bpb'))}; median {_fmt(r.get('tokens_per_s_median'))} tokens/s.", ""]
        if r.get("log_tail"):
            lines += ["```", *r["log_tail"], "```", ""]
    for r in _measured(rows, "samples"):
        lines += [f"Greedy samples, recurrent vs parallel: identical {_fmt(r.get('identical'))}"
                  + (f" (first difference at token {r['first_difference']})" if r.get("first_difference") else "")
                  + (f"; error: {r['error']}" if r.get("error") else ""), ""]
        if r.get("sample"):
            lines += ["```", r["sample"], "```", ""]
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        lines += ["### Not run", ""] + [f"- {r['section']}: {r['skipped']} ({r['reason']})" for r in skipped] + [""]
    return lines


def _plots(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = [r for r in _measured(rows, "scan speed") if r.get("gb_s")]
    if speed:
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(speed) + 1.2))
        labels = [f"{r['impl']} {r['passes']} {r['dtype']} {r.get('mode', '')}" for r in speed]
        ax.barh(range(len(speed)), [r["gb_s"] for r in speed])
        ax.set_yticks(range(len(speed)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("GB/s (bytes the op must move / median time)")
        fig.tight_layout()
        fig.savefig(out / "scan.png", dpi=110)
        plt.close(fig)
    models = [r for r in _measured(rows, "models") if r.get("tokens_per_s")]
    if models:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key in sorted({(r["model"], r["execution"], r["batch"]) for r in models}):
            pts = sorted((r["T"], r["tokens_per_s"]) for r in models if (r["model"], r["execution"], r["batch"]) == key)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=" ".join(key))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T (tokens per sequence)")
        ax.set_ylabel("training tokens/s")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "models.png", dpi=110)
        plt.close(fig)
    for r in _measured(rows, "training"):
        if r.get("loss_curve"):
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(*zip(*r["loss_curve"]), label="train loss")
            if r.get("val_bpb"):
                ax2 = ax.twinx()
                ax2.plot(*zip(*r["val_bpb"]), "o-", color="C1", label="val bpb")
                ax2.set_ylabel("validation bits per byte")
            ax.set_xlabel("step")
            ax.set_ylabel("loss (nats per token)")
            fig.tight_layout()
            fig.savefig(out / "loss.png", dpi=110)
            plt.close(fig)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _kernels(counts: dict | None) -> str:
    """``12 / 3 (41 s)``: what ``triton_compiles.summarize`` counted in a part."""
    if not counts:
        return ""
    return f"{counts['loaded']} / {counts['compiled']} ({_fmt(counts['compile_s'])} s)"


def write_outputs(out: Path, header: dict, parts: dict, rows: list[dict], targets: list[dict]) -> None:
    """``parts``: part name → its status dict; ``rows``: every recorded row (with ``part`` and ``section``)."""
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "results.json", json.dumps({"header": header, "parts": parts, "targets": targets,
                                                   "rows": rows}, indent=1, default=str))
    lines = [f"# GPU check: {header['device']}", "",
             f"{header['date']}; commit {header['commit']}; torch {header['torch']}, triton {header['triton']}, "
             f"Python {header['python']}; {'DRY RUN (CPU, tiny sizes)' if header['dry_run'] else 'full sizes'}.", "",
             f"`{header['command']}`", "",
             f"Compile caches at the start: {header.get('compile_cache', 'not recorded')}; Triton build "
             f"{header.get('triton_build', 'not recorded')}.", "",
             "| part | status | seconds | limit s | rows | Triton kernels: from the cache / compiled (compile s) |",
             "|---|---|---:|---:|---:|---|"]
    for name, status in parts.items():
        lines.append(f"| {name} | {status['status']} | {_fmt(status.get('seconds'))} | {_fmt(status.get('limit'))} | "
                     f"{status.get('rows', 0)} | {_kernels(status.get('triton'))} |")
    lines += ["", "## Targets", ""]
    lines += _table(targets, [("target", "target"), ("measured", "measured"), ("met", "met")])
    lines += ["## Measured", ""] + _sections(rows)
    _atomic_write(out / "report.md", "\n".join(lines) + "\n")
    try:
        _plots(rows, out)
    except Exception as exc:  # noqa: BLE001 - a plot never costs the figures
        print(f"gpu_check: plots not written ({type(exc).__name__}: {exc})", flush=True)
