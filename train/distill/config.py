"""DistillConfig: everything one ``hybrid-distill`` run needs, validated on construction."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from hybrid import RecurrenceConfig
from hybrid.checks import check_int
from hybrid.models.config_names import parse

from ..options.checks import check_betas, check_fraction, check_optional_str, check_real, check_text_column, tracker_list
from ..options.record import ConfigRecord
from ..data.packing import PACKINGS
from ..parallel.device import check_device
from ..loop.schedule import default_warmup
from .mapping import RNN_FIELDS

__all__ = ["DistillConfig", "TRAIN_PARTS", "DECAY_INITS", "RESUMABLE"]

TRAIN_PARTS = ("all", "new")  # stage 2 trains every weight, or only the replaced layers' mixers
DECAY_INITS = ("attention", "ring")  # the R layers' decay: fitted to the attention's mean distance, or the LRU ring
# what --resume may change (the rest defines the run: the teacher, the student, the data order, the losses)
RESUMABLE = ("steps", "eval_every", "eval_batches", "log_every", "save_every", "keep", "device", "log")


@dataclass
class DistillConfig(ConfigRecord):
    KIND: ClassVar[str] = "distill config"  # how errors name it
    teacher: str = ""  # a run directory (hybrid-train, hybrid-import, hybrid-distill)
    out: str = "runs/distill"
    # the student: exactly one of pattern / keep_attention
    pattern: str | None = None  # R = replaced, A = kept; repeated and cut at the teacher's n_layers
    keep_attention: str | None = None  # "auto:K": keep the K attention layers whose replacement costs the most
    model: dict = field(default_factory=dict)  # HybridConfig overrides: window, the R layers' RNN_FIELDS
    decay_init: str = "attention"  # DECAY_INITS
    # data (as hybrid-train; the tokenizer is always the teacher's)
    data: str | None = None
    text_column: str = "text"
    valid_fraction: float = 0.05
    seq_len: int = 256
    packing: str = "documents"
    batch_size: int = 16
    # stage 1: alignment
    align_steps: int = 100
    align_lr: float = 3e-3
    align_warmup: int | None = None  # None: min(100, align_steps // 10)
    # stage 2: end to end
    steps: int = 200
    lr: float = 1e-3
    warmup: int | None = None  # None: min(100, steps // 10)
    temperature: float = 1.0
    ce_weight: float = 0.0
    train: str = "all"
    # both stages' AdamW
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    # layer selection
    select_batches: int = 8
    # bookkeeping
    eval_every: int = 100
    eval_batches: int | None = 50
    log_every: int = 10
    save_every: int = 100
    keep: int = 2
    log: list = field(default_factory=list)
    seed: int = 0
    device: str = "auto"

    def __post_init__(self):
        if self.grad_clip == 0:
            self.grad_clip = None
        self._validate()

    @property
    def align_warmup_steps(self) -> int:
        return default_warmup(self.align_steps) if self.align_warmup is None else self.align_warmup

    @property
    def warmup_steps(self) -> int:
        return default_warmup(self.steps) if self.warmup is None else self.warmup

    @property
    def total_steps(self) -> int:
        return self.align_steps + self.steps

    def _validate(self) -> None:
        if not isinstance(self.teacher, str) or not self.teacher:
            raise ValueError(f"teacher: expected a run directory, got {self.teacher!r}")
        if not isinstance(self.out, str) or not self.out:
            raise ValueError(f"out: expected a directory path, got {self.out!r}")
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
        check_optional_str("data", self.data)
        check_text_column("text_column", self.text_column)
        check_fraction("valid_fraction", self.valid_fraction)
        if self.packing not in PACKINGS:
            raise ValueError(f"packing: expected one of {list(PACKINGS)}, got {self.packing!r}")
        for name, low in (("seq_len", 1), ("batch_size", 1), ("log_every", 1), ("keep", 1), ("select_batches", 1),
                          ("align_steps", 0), ("steps", 0), ("eval_every", 0), ("save_every", 0), ("seed", 0)):
            setattr(self, name, check_int(name, getattr(self, name), low=low))
        if self.total_steps < 1:
            raise ValueError("steps: expected at least one step in all (--align-steps + --steps), got 0")
        for name, total in (("align_warmup", self.align_steps), ("warmup", self.steps)):
            if getattr(self, name) is not None:
                setattr(self, name, check_int(name, getattr(self, name), low=0))
                if getattr(self, name) > total:
                    raise ValueError(f"{name}: expected at most its stage's {total} steps, got {getattr(self, name)}")
        for name in ("align_lr", "lr", "temperature"):
            check_real(name, getattr(self, name), low=0.0, low_open=True)
        check_real("ce_weight", self.ce_weight, low=0.0)
        check_real("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_real("weight_decay", self.weight_decay, low=0.0)
        if self.decay_init not in DECAY_INITS:
            raise ValueError(f"decay_init: expected one of {list(DECAY_INITS)}, got {self.decay_init!r}")
        if self.train not in TRAIN_PARTS:
            raise ValueError(f"train: expected one of {list(TRAIN_PARTS)}, got {self.train!r}")
        self.betas = check_betas("betas", self.betas)
        if self.grad_clip is not None:
            check_real("grad_clip", self.grad_clip, low=0.0, low_open=True)
        if self.eval_batches is not None:
            self.eval_batches = check_int("eval_batches", self.eval_batches, low=1)
        self.log = tracker_list("log", self.log)
        check_device("device", self.device)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

