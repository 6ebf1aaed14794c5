"""``hybrid-export``, ``hybrid-import`` and ``hybrid-eval``: one-line errors, exit 2 (as ``hybrid-train``)."""
from __future__ import annotations

import argparse
import json
import os

from ..hf.evaluate import MIN_MAX_LENGTH
from .flags import add_device_flag, add_threads_flag
from .parts import Parser, count, int_at_least, positive_int, run_command

__all__ = ["export_main", "import_main", "eval_main"]


# ---------------------------------------------------------------------------------------------- export

def export_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-export",
               description="Write a run's model and tokenizer as a transformers save_pretrained directory "
                           "(model.safetensors, config.json, tokenizer.json); AutoModelForCausalLM opens it after "
                           "`import hybrid.models.hf`, or with trust_remote_code=True.")
    p.add_argument("run_dir", help="run directory (its checkpoint/) or a checkpoint directory")
    p.add_argument("out_dir", help="directory to write; refused if it exists and is not empty, unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty out_dir whole (no old file stays; a failed export changes nothing) "
                        "(default: off)")
    add_threads_flag(p)
    return p


def _export(args: argparse.Namespace) -> int:
    from ..hf.export import export_run

    print(f"hybrid-export: wrote {export_run(args.run_dir, args.out_dir, overwrite=args.overwrite)}")
    return 0


def export_main(argv: list[str] | None = None) -> int:
    """``hybrid-export``: returns the exit status."""
    return run_command(export_parser(), argv, _export)


# ---------------------------------------------------------------------------------------------- import

def import_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-import",
               description="Import a Llama, Mistral or Qwen2 transformers checkpoint as a transformer-preset run "
                           "directory (hybrid-generate, hybrid-train --init-from, load_run open it).")
    p.add_argument("hf_dir", help="transformers directory: config.json and model.safetensors (or shards)")
    p.add_argument("out_dir", help="run directory to write; refused if it exists and is not empty, unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty out_dir whole, e.g. an earlier run with its checkpoints and metrics "
                        "(no old file stays; a failed import changes nothing) (default: off)")
    p.add_argument("--layout", choices=["half", "interleaved"], default="half",
                   help="rotary layout of the imported q/k projections: half (as in transformers) or this "
                        "library's interleaved pairs; the same function either way (default: half)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="parameter dtype of the run (default: float32)")
    add_threads_flag(p)
    return p


def _import(args: argparse.Namespace) -> int:
    from ..hf.importer import import_checkpoint

    path, notes = import_checkpoint(args.hf_dir, args.out_dir, layout=args.layout, dtype=args.dtype,
                                    overwrite=args.overwrite)
    for note in notes:
        print(f"hybrid-import: note: {note}")
    print(f"hybrid-import: wrote {path}")
    return 0


def import_main(argv: list[str] | None = None) -> int:
    """``hybrid-import``: returns the exit status."""
    return run_command(import_parser(), argv, _import)


# ---------------------------------------------------------------------------------------------- eval

def check_writable_file(path, what: str) -> None:
    """A ValueError unless ``path`` can be written: its folder exists and is writable, and ``path`` is not a
    folder or a read-only file. Checked before a long computation whose result goes there."""
    import os
    from pathlib import Path

    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{what}: expected a file to write, got the directory {path}")
    if not folder.is_dir():
        raise ValueError(f"{what}: expected a file in an existing directory, got {path} ({folder} does not exist)")
    existed = path.exists()
    try:  # the real test (os.access says yes to root everywhere, /proc included): open it, leave no trace
        with open(path, "a"):
            pass
        if not existed:
            os.unlink(path)
    except OSError as e:
        raise ValueError(f"{what}: expected a writable file, got {path} ({e.strerror or e})") from None


def eval_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-eval",
               description="Evaluate a run directory or a transformers directory with lm-evaluation-harness "
                           "(lm-eval's HFLM around our model).",
               epilog="example:\n  hybrid-eval runs/demo --tasks my_task --include-path tasks/ --device cpu",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="RUN_OR_HF_DIR", help="run directory or transformers directory")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--include-path", default=None, metavar="DIR",
                   help="folder of extra task YAML files (default: none, lm-eval's own tasks only)")
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--batch-size", type=positive_int, default=1, help="lm-eval batch size (default: 1)")
    p.add_argument("--limit", type=positive_int, default=None, help="documents per task (default: all)")
    p.add_argument("--num-fewshot", type=count, default=None,
                   help="few-shot examples, 0 or more (default: the task's)")
    p.add_argument("--max-length", type=int_at_least(MIN_MAX_LENGTH, f"an integer >= {MIN_MAX_LENGTH}"), default=None,
                   help=f"longest input in tokens, at least {MIN_MAX_LENGTH} (default: lm-eval's, 2048)")
    p.add_argument("--output", default=None, metavar="FILE",
                   help="also write the results as JSON (default: none, printed only)")
    p.add_argument("--log-samples", action="store_true",
                   help="with --output: add every document's requests and responses (under 'samples') "
                        "(default: off)")
    p.add_argument("--overwrite", action="store_true",
                   help="with --output: replace an existing file (default: refuse it)")
    return p


def _eval(args: argparse.Namespace) -> int:
    from ..hf.evaluate import evaluate

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--tasks: expected comma-separated task names, got {args.tasks!r}")
    if args.log_samples and not args.output:
        raise ValueError("--log-samples: expected together with --output (the samples are written there), got no "
                         "--output")
    if args.output:  # before the evaluation, not after it; never into what is read
        from ..output.paths import check_apart

        check_apart("--output", args.output, [("RUN_OR_HF_DIR", args.path), ("--include-path", args.include_path)])
        check_writable_file(args.output, "--output")
        if os.path.exists(args.output) and not args.overwrite:
            raise ValueError(f"--output: expected a new file, got {args.output}, which exists; pass --overwrite to "
                             f"replace it, or choose another file")
    elif args.overwrite:
        raise ValueError("--overwrite: expected together with --output (the file it allows to replace), got no "
                         "--output")
    out = evaluate(args.path, tasks, include_path=args.include_path, device=args.device,
                   batch_size=args.batch_size, limit=args.limit, num_fewshot=args.num_fewshot,
                   max_length=args.max_length, log_samples=args.log_samples)
    results = out["results"]
    for task, metrics in results.items():
        shown = ", ".join(f"{k} = {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        print(f"{task}: {shown}")
    if args.output:  # whole or not at all: a failed write leaves the old file as it was
        record = {"results": results, **({"samples": out["samples"]} if "samples" in out else {})}
        staged = f"{args.output}.tmp-{os.getpid()}"
        try:
            with open(staged, "w") as f:
                json.dump(record, f, indent=2, default=str)
            os.replace(staged, args.output)
        finally:
            if os.path.exists(staged):
                os.unlink(staged)
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """``hybrid-eval``: returns the exit status."""
    return run_command(eval_parser(), argv, _eval)
