"""TrainConfig: everything a training run needs besides the model config, validated on construction.

The model is ``HybridConfig.preset(preset, size, vocab_size=round_vocab_size(tokenizer.vocab_size), **model)``
(``model`` overrides any HybridConfig field, vocab_size included). ``batch_size`` is per rank; one optimizer
step sees ``batch_size × grad_accum × world_size`` sequences of ``seq_len`` tokens (the global batch).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from hybrid.checks import check_int
from hybrid.models import PRESETS, SIZES

from ..options.checks import check_betas, check_fraction, check_optional_str, check_real, check_text_column, tracker_list
from ..options.record import ConfigRecord
from ..data.packing import PACKINGS
from ..parallel.device import check_device
from ..loop.schedule import default_warmup
from ..output.tracking import TRACKERS

__all__ = ["TrainConfig", "NONFINITE_POLICIES", "MAX_SKIPS_IN_A_ROW", "TRACKERS"]


NONFINITE_POLICIES = ("stop", "skip")
MAX_SKIPS_IN_A_ROW = 5  # on_nonfinite="skip": more consecutive non-finite steps than this end the run


@dataclass
class TrainConfig(ConfigRecord):
    KIND: ClassVar[str] = "train config"  # how errors name it
    # the model
    preset: str = "hybrid"
    size: str = "tiny"
    model: dict = field(default_factory=dict)  # HybridConfig overrides, e.g. {"pattern": "RRA", "window": 128}
    # the data
    data: str | None = None  # None / "stdlib": this Python's standard library; a path; a hub dataset name
    tokenizer: str | None = None  # None / "bytes": byte-level; a tokenizer.json (or its directory)
    text_column: str = "text"  # the column holding the text in .jsonl / .parquet / .csv data (and hub datasets)
    init_from: str | None = None  # a run directory whose weights and model config start this run (train/init_from.py)
    init_partial: bool = False  # with init_from: copy the weights whose name and shape match, initialise the rest
    valid_fraction: float = 0.05
    seq_len: int = 256
    packing: str = "documents"  # "documents": every mixer restarts at each document (cu_seqlens); "stream": not
    batch_size: int = 16  # sequences per rank per micro-batch
    grad_accum: int = 1
    # optimisation
    steps: int = 1000  # total optimizer steps (the new total when resuming)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # the cosine decays to lr · min_lr_ratio
    warmup: int | None = None  # linear warmup steps; None = min(100, steps // 10), following steps on resume
    weight_decay: float = 0.1  # on the weights of nn.Linear / nn.Embedding only (hybrid.train.loop.optim)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0  # max global gradient norm; None or 0 = no clipping
    # bookkeeping
    eval_every: int = 250  # steps between evaluations (0 = only at the end)
    eval_batches: int | None = 50  # validation batches per evaluation (None = the whole validation split)
    log_every: int = 10  # steps between metrics records
    save_every: int = 500  # steps between checkpoints (0 = only at the end)
    keep: int = 2  # checkpoints kept: checkpoint/ and the newest keep − 1 of checkpoint-step-N/
    on_nonfinite: str = "stop"  # a non-finite loss or gradient: "stop" the run, or "skip" the step's update
    log: list = field(default_factory=list)  # experiment trackers fed every metrics record: "tensorboard", "wandb"
    seed: int = 0
    out: str = "runs/train"
    # execution
    device: str = "auto"  # "auto" = cuda when available, else cpu; or "cpu", "cuda", "cuda:1"
    compile: bool = False  # torch.compile the model
    fsdp: bool = False  # FSDP2 (fully_shard per block, then the root) instead of DDP under torchrun

    def __post_init__(self):
        if self.grad_clip == 0:
            self.grad_clip = None
        self._validate()

    @property
    def warmup_steps(self) -> int:
        """``warmup``, or when it is None the derived ``default_warmup(steps)`` (``min(100, steps // 10)``)."""
        return default_warmup(self.steps) if self.warmup is None else self.warmup

    def _validate(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.size not in SIZES:
            raise ValueError(f"size: expected one of {list(SIZES)}, got {self.size!r}")
        if not isinstance(self.model, dict):
            raise ValueError(f"model: expected a dict of HybridConfig overrides, got {type(self.model).__name__}")
        for name in ("data", "tokenizer", "init_from"):
            check_optional_str(name, getattr(self, name))
        if self.init_partial and self.init_from is None:
            raise ValueError("init_partial: expected together with init_from (the run to copy weights from), got no init_from")
        check_fraction("valid_fraction", self.valid_fraction)
        for name, low in (("seq_len", 1), ("batch_size", 1), ("grad_accum", 1), ("steps", 1), ("log_every", 1),
                          ("eval_every", 0), ("save_every", 0), ("seed", 0), ("keep", 1)):
            setattr(self, name, check_int(name, getattr(self, name), low=low))
        if self.warmup is not None:
            self.warmup = check_int("warmup", self.warmup, low=0)
            if self.warmup > self.steps:
                raise ValueError(f"warmup: expected at most steps={self.steps}, got {self.warmup}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing: expected one of {list(PACKINGS)}, got {self.packing!r}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite: expected one of {list(NONFINITE_POLICIES)}, got {self.on_nonfinite!r}")
        check_real("lr", self.lr, low=0.0, low_open=True)
        check_real("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_real("weight_decay", self.weight_decay, low=0.0)
        self.betas = check_betas("betas", self.betas)
        if self.grad_clip is not None:
            check_real("grad_clip", self.grad_clip, low=0.0, low_open=True, or_else=", or 0 (or None) for no clipping")
        check_text_column("text_column", self.text_column)
        self.log = tracker_list("log", self.log)
        if self.eval_batches is not None:
            self.eval_batches = check_int("eval_batches", self.eval_batches, low=1)
        if not isinstance(self.out, str) or not self.out:
            raise ValueError(f"out: expected a directory path, got {self.out!r}")
        check_device("device", self.device)
        for name in ("compile", "fsdp", "init_partial"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False, got {getattr(self, name)!r}")

    # ------------------------------------------------------------------------------------------ I/O

    def to_dict(self) -> dict:
        """Plain values only (it is stored in checkpoints, which are read with ``weights_only=True``)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

