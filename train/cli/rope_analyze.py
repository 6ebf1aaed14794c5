"""``hybrid-rope-analyze``: the rotary outlier analysis (Jonasson, "Rotary Outliers and
Rotary Offset Features in Large Language Models") of one of our runs or a Hugging Face model.

    hybrid-rope-analyze runs/tf --tokens 200000 --out runs/tf-rope-analysis
    hybrid-rope-analyze ./Llama-2-7b-hf --data ~/texts --tokens 1000000 --out llama2   [needs hybrid-lm[analysis]]

MODEL is a run directory of ours (its checkpoint/) or a transformers causal LM (local directory or hub name).
The corpus (``--data``, as for hybrid-train: default this Python's standard library) is read in sequences of
``--seq-len`` tokens (default: p_max, at most 2048), documents in a fixed shuffled order, until ``--tokens``
tokens. Outputs in ``--out``: summary.json, channels.npz, report.md and fig{1,2,5,8,10}_*.png (see
train/rotary_analysis/report.py for the schema and docs/rotary.md for a guide).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from .flags import add_device_flag, add_option_flags, add_threads_flag
from .parts import Parser, UsageError, positive_int, run_command
from ..options.sections import DataOptions
from ..parallel.distributed import resolve_device
from ..output.outdir import check_output_dir, staged_output_dir
from ..output.paths import data_input
from ..output.run_lock import RunDirLock
from ..rotary_analysis.capture import capture_statistics
from ..rotary_analysis.corpus import corpus_documents, token_batches
from ..rotary_analysis.features import analyze
from ..rotary_analysis.report import write_outputs
from ..rotary_analysis.subject import load_subject

DEFAULT_SEQ_CAP = 2048


def analyze_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-rope-analyze",
                description="Rotary offset features (Jonasson, 'Rotary Outliers and Rotary Offset Features in "
                            "Large Language Models'): capture pre-rotation queries and keys over a corpus and "
                            "write Table 2, the per-feature summary and the figures.",
                epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="our run directory, or a Hugging Face model directory or name")
    p.add_argument("--data", default=None, help="corpus: a path, 'stdlib' (default) or a hub dataset name")
    add_option_flags(p, DataOptions, ["skip_rows_without_text"], default=False)
    p.add_argument("--tokens", type=positive_int, default=100_000, help="tokens to read (default: 100000)")
    p.add_argument("--out", default="rope-analysis", metavar="DIR", help="output directory (default: rope-analysis)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out whole (default: off)")
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help=f"tokens per sequence (default: p_max, at most {DEFAULT_SEQ_CAP})")
    p.add_argument("--batch-size", type=positive_int, default=1, help="sequences per forward pass (default: 1)")
    p.add_argument("--p-max", type=positive_int, default=None,
                   help="context length for the bounds; a layer with a sliding window uses min(this, its window) "
                        "(default: our training seq_len, or the HF config's max_position_embeddings)")
    p.add_argument("--radii", type=float, nargs="+", default=[6.0, 9.0, 12.0],
                   help="outlier key radii for Table 2 (default: 6 9 12, the seed's)")
    p.add_argument("--head", default=None, metavar="LAYER,HEAD",
                   help="analysed-layer index and head for figures 5 and 10, ints >= 0 (default: the largest key "
                        "radius)")
    p.add_argument("--include-retention", action="store_true", help="also analyse retention (M) layers (default: off)")
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figures (default: off)")
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weights' dtype for Hugging Face models (default: float32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: off)")
    return p


def _parse_head(text: str | None):
    """``--head LAYER,HEAD`` as two ints >= 0 (None when not given)."""
    if text is None:
        return None
    try:
        layer, head = (int(v) for v in text.split(","))
    except ValueError:
        layer = head = -1
    if layer < 0 or head < 0:
        raise UsageError(f"--head: expected LAYER,HEAD (two ints >= 0), got {text!r}")
    return layer, head


def _check_head(head, text: str | None, layers) -> None:
    """``--head`` against the model's analysed layers and heads, before the corpus pass rather than after it."""
    if head is not None and not (head[0] < len(layers) and head[1] < layers[0].n_heads):
        raise UsageError(f"--head: expected LAYER < {len(layers)} (an analysed-layer index) and HEAD < "
                         f"{layers[0].n_heads}, got {text!r}")


def _check_seq_len(seq_len: int, subject, given: bool) -> None:
    """A model that opens each sequence with BOS needs room for one token of text after it."""
    if subject.prefix is not None and seq_len < 2:
        where = "" if given else " (the default: p_max)"
        raise UsageError(f"--seq-len: expected at least 2 for a model that starts each sequence with BOS, "
                         f"got {seq_len}{where}")


def _negative_head_joined(argv: list[str]) -> list[str]:
    """``--head -1,0`` as ``--head=-1,0``: argparse reads a value starting with '-' as an option (then "expected
    one argument"); joined, it reaches `_parse_head`, which names the flag."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--head" and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"--head={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _analyze(args: argparse.Namespace) -> int:
    if any(not r > 0 for r in args.radii):
        raise UsageError(f"--radii: expected positive numbers, got {args.radii}")
    head = _parse_head(args.head)
    inputs = [("MODEL", args.model)] if Path(args.model).exists() else []  # a hub name reads no local folder
    inputs.append(("--data", data_input(args.data)))
    try:  # before the (long) capture: a non-empty --out is refused unless --overwrite
        check_output_dir(args.out, overwrite=args.overwrite, what="--out", inputs=inputs)
    except ValueError as e:
        raise UsageError(str(e)) from None
    with RunDirLock(args.out, command="hybrid-rope-analyze", what="--out"):  # one writer, from the start
        return _analyze_locked(args, head, inputs)


def _analyze_locked(args: argparse.Namespace, head, inputs) -> int:
    from ..rotary_analysis.hybrid_lm import NoRotaryLayers

    device = resolve_device(args.device)
    try:
        subject = load_subject(args.model, device=device, dtype=getattr(torch, args.dtype),
                               include_retention=args.include_retention)
    except NoRotaryLayers as e:  # named as typed here: MODEL, --include-retention
        raise UsageError(e.message("MODEL", "--include-retention")) from None
    _check_head(head, args.head, subject.layers)
    p_max = args.p_max or subject.p_max
    if p_max is None:
        raise UsageError(f"--p-max: the run {args.model} records no training seq_len; pass --p-max")
    seq_len = args.seq_len or min(p_max, DEFAULT_SEQ_CAP)
    _check_seq_len(seq_len, subject, given=args.seq_len is not None)
    documents = corpus_documents(args.data, skip_rows_without_text=args.skip_rows_without_text,
                                 say=None if args.quiet else print)
    batches = token_batches(documents, subject.encode, separator=subject.separator,
                            prefix=subject.prefix, seq_len=seq_len, batch_size=args.batch_size, tokens=args.tokens)
    stats = capture_statistics(subject.forward, subject.layers, batches, total_tokens=args.tokens,
                               progress=not args.quiet, desc="hybrid-rope-analyze")
    result = analyze(stats, p_max)
    with staged_output_dir(args.out, overwrite=args.overwrite, what="--out", inputs=inputs, locked=True) as stage:
        summary = write_outputs(result, stage, model=subject.name, radii=args.radii, notes=subject.notes,
                                figures=not args.no_figures, head=head)
    t = summary["table2"]
    print(f"{subject.name}: {t['n_features']} features, {t['pct_rof']:.0f}% under the upper bound, "
          f"{t['n_definition_3_1']} meet Definition 3.1; wrote {args.out}/report.md")
    return 0


def analyze_main(argv: list[str] | None = None) -> int:
    """``hybrid-rope-analyze``: returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    return run_command(analyze_parser(), _negative_head_joined(argv), _analyze)


if __name__ == "__main__":
    sys.exit(analyze_main())
