"""TrainConfig: everything a language model's run needs besides the model config, validated on construction.

Its options are the sections every run kind shares (``hybrid.train.options.sections``: model, data, optimizer,
loop, logging, execution), at their defaults, plus the two only a language model has: ``tokenizer`` and
``init_partial``. The model is ``HybridConfig.preset(preset, size, vocab_size=round_vocab_size(tokenizer.vocab_size),
**model)`` (``model`` overrides any HybridConfig field, vocab_size included). ``batch_size`` is per rank; one
optimizer step sees ``batch_size × grad_accum × world_size / cp`` sequences of ``seq_len`` tokens (the global batch;
``cp`` ranks share each sequence, ``hybrid.train.parallel.mesh``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..loop.divergence import MAX_SKIPS_IN_A_ROW, NONFINITE_POLICIES
from ..loop.schedule import default_warmup
from ..options.checks import a_bool, check_optional_str
from ..options.fields import option, redeclare
from ..options.record import RunConfig
from ..options.sections import (ContextParallelOptions, DataOptions, ExecutionOptions, LoggingOptions, LoopOptions, ModelOptions,
                                OptimizerOptions)
from ..output.tracking import TRACKERS

__all__ = ["TrainConfig", "NONFINITE_POLICIES", "MAX_SKIPS_IN_A_ROW", "TRACKERS"]


@dataclass
class TrainConfig(RunConfig, ContextParallelOptions, ExecutionOptions, LoggingOptions, LoopOptions, OptimizerOptions, DataOptions,
                  ModelOptions):  # the fields come in the reverse order of the bases: the model's first
    KIND: ClassVar[str] = "train config"
    # what a resumed run keeps: the model, the data order and the optimiser's form (hybrid.train.loop.resume)
    # (a resumed run starts from its own checkpoint, never from another run's weights: init_from is fixed too)
    FIXED: ClassVar[tuple[str, ...]] = ("preset", "size", "model", "data", "text_column", "skip_rows_without_text",
                                        "tokenizer", "valid_fraction", "seq_len", "packing", "seed", "min_lr_ratio",
                                        "betas", "init_from", "init_partial")
    OPTIMISER: ClassVar[tuple[str, ...]] = ("lr", "warmup", "weight_decay", "grad_clip")
    # what a resume may change (docs/training.md, "Resume", lists these; tests/train/loop/test_resume.py checks
    # the list): every field is FIXED, CHANGEABLE, or `out` (which must name the resumed run's own directory)
    CHANGEABLE: ClassVar[tuple[str, ...]] = ("steps", *OPTIMISER, "batch_size", "grad_accum", "eval_every",
                                             "eval_batches", "log_every", "save_every", "keep", "on_nonfinite", "log",
                                             "device", "compile", "fsdp", "cp")

    steps: int = redeclare(LoopOptions, "steps", help="total optimizer steps; with --resume, the new total")
    tokenizer: str | None = option(None, "data", check=check_optional_str, metavar="PATH",
                                   help="a tokenizer.json (or a directory holding one)",
                                   shown_default="bytes, vocab 259")
    init_partial: bool = option(False, "model", check=a_bool, action="store_true", shown_default="off: every weight must match",
                                help="with --init-from: copy every weight whose name and shape match and initialise "
                                     "the rest, e.g. a hybrid (--set pattern='\"RRA\"') started from a transformer's "
                                     "attention, MLP and embedding weights")

    @property
    def warmup_steps(self) -> int:
        """``warmup``, or when it is None the derived ``default_warmup(steps)`` (``min(100, steps // 10)``)."""
        return default_warmup(self.steps) if self.warmup is None else self.warmup

    def _check(self) -> None:
        if self.init_partial and self.init_from is None:
            raise ValueError("init_partial: expected together with init_from (the run to copy weights from), got no "
                             "init_from")
        if self.seq_len % self.cp:
            raise ValueError(f"seq_len: expected a multiple of cp={self.cp} (each of the {self.cp} ranks of a sequence "
                             f"holds seq_len / cp tokens), got {self.seq_len}")
        if self.cp > 1 and self.compile:
            raise ValueError("compile: expected False with cp > 1 (the context-parallel path's collectives are not "
                             "traced by torch.compile), got True")
        if self.warmup is not None and self.warmup > self.steps:
            raise ValueError(f"warmup: expected at most steps={self.steps}, got {self.warmup}")
