"""``report.md`` of a ``hybrid-bench`` suite, with its PNG plots, written from the suite's records alone.

Every figure is the mean ± sample std over seeds (``hybrid.train.suite.fmt_mean_std``); the "vs best" column
reads "tie" when the difference to the best model is smaller than the larger of the two spreads. Seed tables
(placements: the losses of Su's VO-RoPE post; positions: the perplexities of the CARoPE paper) go beside
ours; for placements the Spearman rank correlation of the two orderings is given. Perplexities here are per byte (our tokens are bytes)
and the seeds' per GPT-2 token, so only the orderings compare.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from ..suite import fmt_mean_std, is_tie, markdown_table, mean_std, plot_lines, write_report
from .window_gain import gain_section
from .suites import FINETUNES, PLACEMENT_SEED_LOSS, POSITIONS_SEED_PPL, SCALINGS, SUITES

__all__ = ["write_bench_report", "command_line", "report_commands", "spearman", "ranks"]

LN2 = math.log(2.0)


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, smallest first; tied values share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's ρ: the Pearson correlation of the ranks (NaN with fewer than two pairs or no spread)."""
    if len(a) != len(b) or len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else float("nan")


# ---------------------------------------------------------------------------------------------- helpers

def _by_model(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["model"], []).append(r)
    return out


def _values(runs: list[dict], key: str) -> list:
    return [r["metrics"].get(key) for r in runs]


def _cell(runs, key, digits=3) -> str:
    return fmt_mean_std(_values(runs, key), digits)


def _bytes(n) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _decode(runs: list[dict]) -> dict:
    """The decoding figures of the model's first run that has them."""
    for r in runs:
        if r["metrics"].get("decode"):
            return r["metrics"]["decode"]
    return {}


def _ppl(runs, key) -> list:
    """Per-token perplexity ``exp(loss)`` of a ``bpb_full_{k}x`` figure: its ``loss_full_{k}x`` where the record
    has it; in records written before it, loss = bpb · ln 2 · the split's bytes/token (the conversion those
    figures were made with)."""
    out = []
    for r in runs:
        m = r["metrics"]
        v, loss = m.get(key), m.get(key.replace("bpb_", "loss_"))
        out.append(None if v is None else math.exp(loss) if loss is not None else
                   math.exp(v * LN2 * m["bytes_per_token"]))
    return out


def _vs_best(groups: dict[str, list[dict]], key: str) -> dict[str, str]:
    means = {m: mean_std(_values(runs, key))[0] for m, runs in groups.items()}
    finite = {m: v for m, v in means.items() if math.isfinite(v)}
    if not finite:
        return {m: "–" for m in groups}
    best = min(finite, key=finite.get)
    out = {}
    for m, runs in groups.items():
        if m not in finite:
            out[m] = "–"
        elif m == best:
            out[m] = "best"
        elif is_tie(_values(runs, key), _values(groups[best], key)):
            out[m] = "tie"
        else:
            out[m] = f"+{finite[m] - finite[best]:.3f}"
    return out


def _series(groups, xs_of, ys_of):
    series = {}
    for model, runs in groups.items():
        xs, ys, errs = xs_of(runs), [], []
        for i in range(len(xs)):
            mean, std = mean_std([ys_of(r)[i] for r in runs])
            ys.append(mean)
            errs.append(std)
        if any(math.isfinite(y) for y in ys):
            series[model] = (xs, ys, errs)
    return series


# ---------------------------------------------------------------------------------------------- tables

def quality_tables(groups, factors) -> list[str]:
    best = _vs_best(groups, "val_bpb")
    long = [k for k in factors if k > 1]
    head = ["model", "params (non-emb)", "val bpb", "vs best"] + [f"{k}× full" for k in long] \
        + [f"{k}× full, last L" for k in long]
    rows = []
    for model, runs in groups.items():
        params = runs[0]["metrics"]["params"]
        rows.append([model, f"{params:,}", _cell(runs, "val_bpb"), best[model]]
                    + [_cell(runs, f"bpb_full_{k}x") for k in long] + [_cell(runs, f"bpb_full_{k}x_last") for k in long])
    stream_head = ["model"] + [f"{k}× streaming" for k in long] + [f"{k}× streaming, last L" for k in long]
    stream_rows = [[m] + [_cell(runs, f"bpb_stream_{k}x") for k in long]
                   + [_cell(runs, f"bpb_stream_{k}x_last") for k in long] for m, runs in groups.items()]
    return [
        "## Quality (bits per byte, lower is better)\n\nval bpb: the validation split at the training length L. "
        "k× full: one forward over sequences of k·L tokens; \"last L\": their last training-length window.\n\n"
        + markdown_table(head, rows),
        "### Streaming (the chunked mode carrying its state, L tokens at a time)\n\n" + markdown_table(stream_head, stream_rows),
    ]


def position_table(groups) -> str:
    edges = next((r["metrics"]["position_edges"] for runs in groups.values() for r in runs
                  if r["metrics"].get("position_edges")), None)
    if not edges:
        return ""
    head = ["model"] + [f"[{a}, {b})" for a, b in zip(edges[:-1], edges[1:])]
    rows = _bucket_rows(groups, "position_bpb", len(edges) - 1)
    text = ("## Loss by position (bpb in buckets of token positions along the longest sequences, full-context)\n\n"
            "Falling along the sequence: the model uses context beyond its window or training length; flat: it "
            "does not. These sequences read the validation stream across documents' ends.\n\n"
            + markdown_table(head, rows))
    return text + document_position_table(groups, head)


def _bucket_rows(groups, key: str, n: int) -> list[list[str]]:
    """One row per model: mean ± std over its runs of each of the ``n`` buckets of the metric ``key`` (a list per
    run; "–" where no run has it)."""
    return [[model] + [fmt_mean_std([r["metrics"][key][i] if r["metrics"].get(key) else None for r in runs])
                       for i in range(n)] for model, runs in groups.items()]


def document_position_table(groups, head: list[str]) -> str:
    """The same buckets over blocks that lie inside one document each (``doc_position_bpb``), where the records
    have them: past L, positions the model never trained at, with no other document in any target's context."""
    blocks = sorted({r["metrics"].get("doc_position_blocks") for runs in groups.values() for r in runs
                     if r["metrics"].get("doc_position_bpb")})
    if not blocks:
        return ""
    rows = _bucket_rows(groups, "doc_position_bpb", len(head) - 1)
    return ("\n\n### Inside documents (blocks of the longest length inside one document each)\n\n"
            f"{' or '.join(map(str, blocks))} blocks, each inside one document of the validation stream, so that no "
            "other document is in any target's context: past L, the positions alone (– for a record measured before "
            "this figure existed).\n\n" + markdown_table(head, rows))


def machine_name(record: dict) -> str:
    """The accelerator a record was measured on, else its CPU count and operating system."""
    m = record.get("machine") or {}
    return m.get("gpu") or f"{m.get('cpus', '?')} CPUs, {str(m.get('platform', '?')).split('-')[0]}"


def cost_table(groups, contexts) -> str:
    head = ["model", "train tokens/s", "train memory"] + [f"decode ms/token @{c}" for c in contexts] \
        + [f"state @{c}" for c in contexts]
    # a suite continued in another session can finish on another device (the lent GPU is an H100 or an H200)
    machines = {model: sorted({machine_name(r) for r in runs}) for model, runs in groups.items()}
    mixed = len({name for names in machines.values() for name in names}) > 1
    # what the memory column measured (CPU: counted, CUDA: max allocated); named in each cell when the rows differ
    kinds = {model: runs[0]["metrics"].get("memory_kind", "") for model, runs in groups.items()}
    several_kinds = len(set(kinds.values())) > 1
    kind = "per row, in brackets" if several_kinds else next(iter(kinds.values()), "")
    rows = []
    for model, runs in groups.items():
        decode = _decode(runs)
        mem = mean_std(_values(runs, "train_memory_bytes"))[0]
        memory = _bytes(mem if math.isfinite(mem) else None)
        if several_kinds and kinds[model] and memory != "–":
            memory += f" ({kinds[model].split(':')[0]})"
        rows.append([model, _cell(runs, "tokens_per_s", 0), memory]
                    + [f"{decode[str(c)]['ms_per_token']:.2f}" if decode.get(str(c)) else "–" for c in contexts]
                    + [_bytes(decode[str(c)]["state_bytes"]) if decode.get(str(c)) else "–" for c in contexts]
                    + ["; ".join(machines[model])] * mixed)
    note = (" **These runs come from more than one machine** (last column): compare timings only between rows "
            "of the same machine; the losses do not depend on it." if mixed else "")
    return (f"## Cost\n\nTraining at L (tokens/s: median of the training log; memory: {kind}). Decoding one "
            "sequence after a chunked prefill of the context (first seed). Timings are only meaningful from a "
            f"quiet machine.{note}\n\n" + markdown_table(head + ["machine"] * mixed, rows) + phase_table(groups))


def phase_table(groups) -> str:
    """Wall seconds of each run's phases (mean over seeds), where the records have them: what a budget's time
    goes to."""
    phases = list(dict.fromkeys(p for runs in groups.values() for r in runs
                                for p in r["metrics"].get("phase_seconds", {})))
    if not phases:
        return ""
    rows = [[model] + [_cell_of([r["metrics"].get("phase_seconds", {}).get(p) for r in runs]) for p in phases]
            for model, runs in groups.items()]
    return ("\n\nWall seconds per run (mean over seeds; training includes its compile and evaluations):\n\n"
            + markdown_table(["model"] + phases, rows))


def _cell_of(values) -> str:
    mean = mean_std(values)[0]
    return "–" if math.isnan(mean) else f"{mean:.0f}"


def placements_table(groups) -> str:
    names = [m for m in groups if _placement(m) in PLACEMENT_SEED_LOSS]
    ours = [mean_std(_values(groups[m], "val_loss"))[0] for m in names]
    seed = [PLACEMENT_SEED_LOSS[_placement(m)] for m in names]
    ours_rank, seed_rank = ranks(ours), ranks(seed)
    rows = [[m, fmt_mean_std(_values(groups[m], "val_loss")), f"{r:g}", f"{s:.3f}", f"{sr:g}"]
            for m, r, s, sr in zip(names, ours_rank, seed, seed_rank)]
    rho = spearman(ours, seed)
    return ("## Against VO-RoPE's table (rotary placements)\n\nOur validation loss is in nats per byte-level token, the seed's per "
            "GPT-2 token: compare the orderings.\n\n"
            + markdown_table(["placement", "our val loss", "our rank", "seed loss", "seed rank"], rows)
            + f"\n\nSpearman rank correlation of our ordering with the seed's: **ρ = {rho:.3f}** "
              f"over {len(names)} placements.")


def _placement(model: str) -> str:
    return "none" if model == "nope" else model


def positions_table(groups) -> str:
    rows = []
    for m, runs in groups.items():
        seed = POSITIONS_SEED_PPL.get(m, (None, None))
        # @L and @2L on the same text (the first long sequences, read whole at L and at 2L tokens); the validation
        # loss is other text (windows reset at document ends), and made the growth from L to 2L look 3-4× larger
        rows.append([m, fmt_mean_std(_ppl(runs, "bpb_full_1x"), 3), fmt_mean_std(_ppl(runs, "bpb_full_2x"), 3),
                     "–" if seed[0] is None else f"{seed[0]:.2f}", "–" if seed[1] is None else f"{seed[1]:.2f}"])
    return ("## Against CARoPE's Table 1 (GPT-Tiny)\n\nOur perplexity is per byte, the seed's per GPT-2 token: "
            "compare the orderings, and each model's growth from L to 2L. A learned table has no positions past "
            "L (–).\n\n" + markdown_table(["position", "our ppl @L", "our ppl @2L", "seed ppl @512", "seed ppl @1024"], rows))


def extension_tables(groups, factors) -> list[str]:
    base = groups.get("transformer", [])
    long = [k for k in factors if k > 1]
    out = []
    for suffix, what in (("full", "whole sequence"), ("full_last", "last training-length window"),
                         ("stream", "streaming, whole sequence")):
        rows = []
        for method in SCALINGS:
            cells = [fmt_mean_std([(r["metrics"].get("extension") or {}).get(method, {}).get(str(k), {}).get(
                f"bpb_{suffix}") for r in base]) for k in long]
            rows.append([method] + cells)
        for method in FINETUNES:
            runs = groups.get(f"finetune-{method}", [])
            key = lambda k: f"bpb_{suffix.replace('_last', '')}_{k}x" + ("_last" if suffix.endswith("_last") else "")  # noqa: E731
            rows.append([f"{method}, fine-tuned at 2×"] + [fmt_mean_std(_values(runs, key(k))) for k in long])
        out.append(f"### bpb at k × L, {what}\n\n" + markdown_table(["scaling"] + [f"{k}×" for k in long], rows))
    return ["## Context extension of the global QK-RoPE Transformer\n\nEach scaling at factor k is read at k·L "
            "(dynamic NTK: factor 1, the base following the length). Fine-tuned rows keep their factor-2 scaling "
            "at every length."] + out


def recurrence_question(groups) -> str:
    """Does the hybrid's recurrence carry information past its attention window? The numbers that answer it.

    Both models read the same text, so the per-bucket gap (hybrid − windowed Transformer) removes how hard each
    stretch of text is. Past the window, attention sees the same number of tokens at every position; if the
    recurrence carries information from further back, the gap widens (grows more negative) along the sequence.
    """
    pair = ("hybrid", "transformer-window")
    if not all(m in groups for m in pair):
        return ""
    budget = groups["hybrid"][0]["config"]["budget"]
    L, window = budget["seq_len"], budget["extra"]["window"]
    per = {m: [r["metrics"].get("position_bpb") for r in groups[m] if r["metrics"].get("position_bpb")] for m in pair}
    edges = groups["hybrid"][0]["metrics"].get("position_edges")
    if not edges or not all(per.values()):
        return ""
    buckets = list(zip(edges[:-1], edges[1:]))
    means = {m: [mean_std([p[i] for p in per[m]])[0] for i in range(len(buckets))] for m in pair}
    gap = [h - t for h, t in zip(means["hybrid"], means["transformer-window"])]
    inside = [g for (a, b), g in zip(buckets, gap) if a >= window and b <= L]
    beyond = [g for (a, b), g in zip(buckets, gap) if a >= L]
    rows = [[m] + [f"{v:.3f}" for v in means[m]] for m in pair] + [["gap"] + [f"{g:+.3f}" for g in gap]]
    lines = ["## Does the hybrid's recurrence carry information past its window?\n",
             f"The hybrid against the windowed Transformer of the same window ({window}) and size, on the same text. "
             "Past the window attention sees the same number of tokens everywhere, so if the recurrence carries "
             "information from further back the gap (hybrid − Transformer) widens along the sequence.\n",
             markdown_table(["bpb by position"] + [f"[{a}, {b})" for a, b in buckets], rows), ""]
    if inside and beyond:
        a, b = sum(inside) / len(inside), sum(beyond) / len(beyond)
        lines.append(f"Mean gap past the window inside the first L: {a:+.3f} bpb; beyond L: {b:+.3f} bpb "
                     f"(change {b - a:+.3f}).")
    x, y = (_values(groups[m], "bpb_full_8x_last") for m in pair)
    if x and y and all(v is not None for v in x + y):
        verdict = "a tie (the difference is within the seeds' spread)" if is_tie(x, y) else (
            "lower for the hybrid" if mean_std(x)[0] < mean_std(y)[0] else "lower for the windowed Transformer")
        lines.append(f"At 8×, over the last training-length window, the bpb is {verdict}: hybrid "
                     f"{_cell(groups['hybrid'], 'bpb_full_8x_last')}, windowed Transformer "
                     f"{_cell(groups['transformer-window'], 'bpb_full_8x_last')}.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- plots

def write_plots(directory: Path, groups, factors) -> list[str]:
    out = []
    ks = sorted(set([1, *factors]))
    series = _series(groups, lambda runs: ks, lambda r: [r["metrics"].get(f"bpb_full_{k}x") for k in ks])
    if series:
        plot_lines(directory / "bpb_vs_length.png", series, xlabel="evaluation length (× training length)",
                   ylabel="bits per byte", title="bpb against evaluation length (full-context)", logx=True)
        out.append("![bpb against evaluation length](bpb_vs_length.png)")
    curves = {}
    for model, runs in groups.items():
        curve = [r["metrics"].get("loss_curve") or [] for r in runs]
        steps = [s for s, _ in curve[0]] if curve and curve[0] else []
        if steps:
            ys = [mean_std([c[i][1] for c in curve if len(c) > i])[0] for i in range(len(steps))]
            curves[model] = (steps, ys)
    if curves:
        plot_lines(directory / "loss_curves.png", curves, xlabel="step", ylabel="training loss (nats/token)",
                   title="loss curves (mean over seeds)")
        out.append("![loss curves](loss_curves.png)")
    edges = next((r["metrics"]["position_edges"] for runs in groups.values() for r in runs
                  if r["metrics"].get("position_edges")), None)
    if edges:
        mids = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        series = _series(groups, lambda runs: mids,
                         lambda r: r["metrics"].get("position_bpb") or [None] * len(mids))
        if series:
            plot_lines(directory / "loss_by_position.png", series, xlabel="token position", ylabel="bits per byte",
                       title="loss by position along the longest sequences")
            out.append("![loss by position](loss_by_position.png)")
    decode = {m: _decode(runs) for m, runs in groups.items()}
    contexts = sorted({int(c) for d in decode.values() for c, v in d.items() if v})
    for key, name, label in (("ms_per_token", "decode_ms.png", "decode ms/token"),
                             ("state_bytes", "state_bytes.png", "state bytes")):
        series = {}
        for m, d in decode.items():
            pts = [(c, d[str(c)][key]) for c in contexts if d.get(str(c))]
            if pts:
                series[m] = ([p[0] for p in pts], [p[1] for p in pts])
        if series:
            plot_lines(directory / name, series, xlabel="context (tokens)", ylabel=label, logx=True,
                       title=f"{label} against the context T")
            out.append(f"![{label}]({name})")
    return out


def command_line(commands: list[str], rewritten_by: str = "") -> str:
    """The report's ``- command:`` line: the commands that trained the records (``not recorded`` when none is
    known), and the ``--report-only`` command that rewrote the report from them, if one did."""
    shown = "; ".join(f"`{c}`" for c in commands) or "not recorded"
    note = f" (this report rewritten from the records by `{rewritten_by}`)" if rewritten_by else ""
    return f"- command{'s' if len(commands) > 1 else ''}: {shown}{note}"


def report_commands(path) -> list[str]:
    """The training commands named by the ``- command:`` line of the report at ``path`` (none if it has no such
    line or does not exist); the note after them, and any ``--report-only`` command, left out."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        if line.startswith(("- command: `", "- commands: `")):
            named = line.split(": ", 1)[1].split("` (", 1)[0] + "`"
            return [c for c in re.findall(r"`([^`]+)`", named) if "--report-only" not in c.split()]
    return []


def write_bench_report(directory, suite_name: str, records: list[dict], *, budget_text: str = "",
                       command: str = "", commands: tuple[str, ...] = (), rewritten_by: str = "") -> Path:
    """Write ``directory/report.md`` (and its plots) for the records of one suite; returns its path. The header
    names ``commands`` (or the one ``command``) and, when a ``--report-only`` command wrote it, ``rewritten_by``."""
    directory = Path(directory)
    commands = list(commands) or ([command] if command else [])
    suite = SUITES[suite_name]
    groups = _by_model(records)
    factors = sorted({k for r in records for k in r["config"].get("factors", [])} | {1})
    commits = sorted({r.get("commit", "?") for r in records})
    machines = sorted({(r.get("machine") or {}).get("platform", "?") + f", {(r.get('machine') or {}).get('torch_threads', '?')} threads"
                       + (f", {r['machine']['gpu']}" if (r.get("machine") or {}).get("gpu") else "") for r in records})
    finished = max((r.get("finished_at", "") for r in records), default="")
    seconds = sum(r.get("seconds", 0) for r in records)
    header = [suite.about, command_line(commands, rewritten_by) if commands or rewritten_by else "",
              f"- runs: {len(records)} ({len(groups)} models), {seconds / 60:.1f} min of training and measuring",
              f"- commit: {', '.join(commits)}", f"- machine: {'; '.join(machines)}", f"- finished: {finished}",
              f"\n```\n{budget_text}\n```" if budget_text else ""]
    sections = ["\n".join(h for h in header if h)]
    contexts = sorted({int(c) for runs in groups.values() for c in _decode(runs)})
    if suite_name == "extension":
        sections += extension_tables(groups, factors)
        sections += quality_tables(groups, factors)
    else:
        sections += quality_tables(groups, factors)
    if suite_name == "placements":
        sections.append(placements_table(groups))
    if suite_name == "positions":
        sections.append(positions_table(groups))
    if suite_name == "baselines":
        sections.append(recurrence_question(groups))
    sections.append(position_table(groups))
    sections += gain_section(groups, directory)
    sections.append(cost_table(groups, contexts))
    sections += write_plots(directory, groups, factors)
    title = f"# hybrid-bench: {suite_name}"
    return write_report(directory / "report.md", kept_preamble(directory / "report.md", title) + title,
                        [s for s in sections if s])


def kept_preamble(path, title: str) -> str:
    """What a person wrote above the generated report at ``path`` (the text before its ``title`` line), kept
    when the report is written again; "" if there is none."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.is_file() else []
    at = next((i for i, line in enumerate(lines) if line.rstrip("\n") == title), 0)
    return "".join(lines[:at])
