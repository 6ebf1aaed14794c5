"""DistillConfig: everything one ``hybrid-distill`` run needs, validated on construction.

Its options are the sections every run kind shares (``hybrid.train.options.sections``: data, optimizer, loop,
logging, execution; the tokenizer is always the teacher's) plus its own: the teacher and the student, and the two
stages. Where the sections' option means stage 2's (``steps``, ``lr``, ``warmup``) or has another default here, it
is redeclared, never declared again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from hybrid import RecurrenceConfig
from hybrid.models.config_names import parse

from ..loop.schedule import default_warmup
from ..options.checks import OfType, check_optional_str, one_of, optional_whole, real, whole
from ..options.fields import option, redeclare
from ..options.record import RunConfig
from ..options.sections import DataOptions, ExecutionOptions, LoggingOptions, LoopOptions, OptimizerOptions
from .mapping import RNN_FIELDS

__all__ = ["DistillConfig", "TRAIN_PARTS", "DECAY_INITS", "RESUMABLE"]

TRAIN_PARTS = ("all", "new")  # stage 2 trains every weight, or only the replaced layers' mixers
DECAY_INITS = ("attention", "ring")  # the R layers' decay: fitted to the attention's mean distance, or the LRU ring
STUDENT, STAGES = "teacher and student", "stages (1: each R layer aligned with its attention; 2: KL to the teacher)"


a_run_dir = OfType(str, "a run directory")


@dataclass
class DistillConfig(RunConfig, ExecutionOptions, LoggingOptions, LoopOptions, OptimizerOptions, DataOptions):
    KIND: ClassVar[str] = "distill config"
    # the teacher, the student, the data order and the losses define the run: a resume keeps them (the teacher may
    # have moved: its weights are checked); the rest may change (hybrid.train.loop.resume)
    FIXED: ClassVar[tuple[str, ...]] = (
        "pattern", "keep_attention", "model", "decay_init", "data", "text_column", "skip_rows_without_text",
        "valid_fraction", "seq_len", "packing", "seed", "align_steps", "align_lr", "align_warmup", "lr", "warmup",
        "temperature", "ce_weight", "train", "min_lr_ratio", "weight_decay", "betas", "grad_clip", "select_batches")

    teacher: str = option("", STUDENT, check=a_run_dir, metavar="RUN_DIR",
                          shown_default="none; required unless --resume",
                          help="the teacher's run directory (hybrid-train, hybrid-import or hybrid-distill)")
    # the student: exactly one of pattern / keep_attention
    pattern: str | None = option(None, STUDENT, check=check_optional_str,
                                 shown_default="none; this or --keep-attention",
                                 help="R (replace) / A (keep) per layer, repeated and cut at the teacher's n_layers as "
                                      "HybridConfig does (RRA on 4 layers: RRAR); at most n_layers letters; at least "
                                      "one R where the teacher has attention")
    keep_attention: str | None = option(None, STUDENT, check=check_optional_str, metavar="auto:K",
                                        shown_default="none; this or --pattern",
                                        help="keep the K attention layers whose replacement costs the most KL after "
                                             "stage 1; replace the others (the ranking goes to layer_ranking.json)")
    model: dict = option({}, STUDENT, flag=False, help="HybridConfig overrides: window, the R layers' RNN_FIELDS")
    decay_init: str = option("attention", STUDENT, check=one_of(DECAY_INITS), choices=DECAY_INITS,
                             help="the new R layers' decay: attention = per head, the γ whose weights γ^k have the "
                                  "mean distance of the replaced attention head on training text; ring = the LRU "
                                  "ring (rnn_r_min…rnn_r_max)")
    select_batches: int = option(8, STUDENT, check=whole(1),
                                 help="validation batches that rank the layers for auto:K")
    # stage 1: alignment
    align_steps: int = option(100, STAGES, check=whole(0), help="stage 1 steps")
    align_lr: float = option(3e-3, STAGES, check=real(0.0, low_open=True, strict=True), help="stage 1's peak learning rate")
    align_warmup: int | None = option(None, STAGES, check=optional_whole(0), help="stage 1's warmup steps",
                                      shown_default="min(100, align steps / 10)")
    # stage 2: end to end
    temperature: float = option(1.0, STAGES, check=real(0.0, low_open=True, strict=True),
                                help="softmax temperature τ of both; the KL is scaled by τ²")
    ce_weight: float = option(0.0, STAGES, check=real(0.0, strict=True),
                              help="add this times the cross-entropy on the data")
    train: str = option("all", STAGES, check=one_of(TRAIN_PARTS), choices=TRAIN_PARTS,
                        help="all: every weight of the student; new: only the replaced layers' mixers")
    # the sections' options that mean stage 2's here, or have another default
    steps: int = redeclare(LoopOptions, "steps", 200, check=whole(0),
                           help="stage 2 steps; with --resume the new total")
    lr: float = redeclare(OptimizerOptions, "lr", 1e-3, help="stage 2's peak learning rate")
    warmup: int | None = redeclare(OptimizerOptions, "warmup", help="stage 2's warmup steps")
    eval_every: int = redeclare(LoopOptions, "eval_every", 100, help="steps between evaluations, 0 = at the end of "
                                                                     "each stage only")
    save_every: int = redeclare(LoopOptions, "save_every", 100, help="steps between checkpoints, 0 = at the end of "
                                                                     "each stage only")
    out: str = redeclare(LoopOptions, "out", "runs/distill")

    @property
    def align_warmup_steps(self) -> int:
        return default_warmup(self.align_steps) if self.align_warmup is None else self.align_warmup

    @property
    def warmup_steps(self) -> int:
        return default_warmup(self.steps) if self.warmup is None else self.warmup

    @property
    def total_steps(self) -> int:
        return self.align_steps + self.steps

    def _check(self) -> None:
        if (self.pattern is None) == (self.keep_attention is None):
            raise ValueError("--pattern / --keep-attention: expected exactly one of them (a fixed pattern such as RRA, "
                             f"or auto:K), got {'both' if self.pattern is not None else 'neither'}")
        if not isinstance(self.model, dict):
            raise ValueError(f"model: expected a dict of HybridConfig overrides, got {type(self.model).__name__}")
        bad = sorted(set(self.model) - {"window", *RNN_FIELDS})
        if bad:
            raise ValueError(f"--set: expected one of the R layers' fields {', '.join(RNN_FIELDS)} (the student "
                             f"keeps the teacher's vocabulary, width, depth, heads and MLPs; --pattern / --window for "
                             f"the layers), got {', '.join(bad)}")
        try:  # a field named twice (rnn_selective and recurrence.selective), refused before the teacher loads
            parse(self.model, ("recompute",), {"recurrence": RecurrenceConfig})
        except ValueError as e:
            raise ValueError(f"--set: {e}") from None
        if self.total_steps < 1:
            raise ValueError("steps: expected at least one step in all (--align-steps + --steps), got 0")
        for name, total in (("align_warmup", self.align_steps), ("warmup", self.steps)):
            if getattr(self, name) is not None and getattr(self, name) > total:
                raise ValueError(f"{name}: expected at most its stage's {total} steps, got {getattr(self, name)}")


# what --resume may change: the options that do not define the run (the loop's, the execution's, the batch layout)
RESUMABLE = tuple(f.name for f in dataclasses.fields(DistillConfig) if f.name not in DistillConfig.FIXED)
