"""What a run prints: messages by verbosity on rank 0, a progress bar, and the trainer's lines.

``Console(verbose, progress)``: ``verbose`` 0 silent, 1 start / evaluation / checkpoint / end messages, 2 also one
line per metrics record when there is no bar; ``progress`` a bar on rank 0 (``progress_bar``: tqdm on a terminal,
plain lines in a log file; default: when stderr is a terminal). Messages go above the bar, never through it.
"""
from __future__ import annotations

import sys

from .progress import progress_bar

__all__ = ["Console", "train_record_line", "start_message", "end_message"]


class Console:
    def __init__(self, verbose: int = 1, progress: bool | None = None, *, is_main: bool = True):
        self.verbose, self.is_main = verbose, is_main
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.bar = None

    def write(self, msg: str) -> None:
        """Print ``msg`` (rank 0 only), above the bar when there is one."""
        if self.is_main:
            if self.bar is not None:
                self.bar.write(msg)
            else:
                print(msg, flush=True)

    def say(self, msg: str, level: int = 1) -> None:
        """``write`` when ``verbose >= level``."""
        if self.verbose >= level:
            self.write(msg)

    def open_bar(self, *, total: int, initial: int = 0, desc: str) -> None:
        """A bar of ``total`` steps (from ``initial``) when ``progress``, on rank 0."""
        if self.progress and self.is_main:
            self.bar = progress_bar(total=total, initial=initial, desc=desc, unit="step")

    def advance(self, **postfix) -> None:
        """One step on the bar; ``postfix`` (e.g. ``loss="2.31"``) shown beside it when given."""
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(**postfix)
            self.bar.update(1)

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def train_record_line(record: dict) -> str:
    """A training record as one line: ``step     40  loss 2.3456  lr 1.000e-03  12,345 tok/s[  skipped 1]``."""
    shown = f"{record['loss']:.4f}" if "loss" in record else "-"
    skips = f"  skipped {record['skipped']}" if "skipped" in record else ""
    return (f"step {record['step']:>6}  loss {shown}  lr {record['lr']:.3e}  {record['tokens_per_s']:,.0f} tok/s"
            f"{skips}")


def start_message(*, resumed: bool, config, model_config, num_parameters: int, device, wrap: str, stats: dict,
                  start: int, global_batch: int, world_size: int) -> str:
    """The trainer's first lines: the model, the data and the plan."""
    c = config
    what = "resuming" if resumed else "training"
    layout = f"{c.batch_size} × {c.grad_accum} accum × {world_size} rank(s)"
    # with init_from the architecture is the source run's: preset and size do not apply, so they are not named
    model = (f"from {c.init_from}{' (partial)' if c.init_partial else ''}" if c.init_from
             else f"{c.preset}/{c.size}")
    return (
        f"{what} {model} (pattern {model_config.pattern}, {num_parameters:,} parameters, "
        f"vocab {model_config.vocab_size}) on {device} [{wrap}]\n"
        f"data: {stats['source']}: {stats['train_tokens']:,} train / {stats['valid_tokens']:,} valid tokens "
        f"({stats['tokenizer']})\n"
        f"steps {start} -> {c.steps}, global batch {global_batch} × {c.seq_len} tokens "
        f"({layout}, packing {c.packing}), lr {c.lr:g}, warmup {c.warmup_steps}"
    )


def end_message(paths: dict, last_eval: dict, unigram: float | None, packing: str) -> str:
    """The trainer's last lines: the final evaluation and what the run directory holds (``paths``: its files)."""
    base = f" (unigram baseline {unigram:.3f})" if unigram is not None else ""
    files = [("checkpoint/", "weights, model config, optimizer, scheduler, RNG, data position"),
             (paths["metrics"].name, "training and validation records (JSON lines)"),
             (paths["plot"].name, "loss curve"), (paths["config"].name, "the training config")]
    return (
        f"done at step {last_eval['step']}: val_loss {last_eval['val_loss']:.4f}, "
        f"val_bpb {last_eval['val_bpb']:.4f}{base}, scored with packing {packing} as trained\n"
        f"run directory {paths['out']}/\n" + "\n".join(f"  {name:<19} {what}" for name, what in files)
    )
