"""TrainConfig: everything a training run needs besides the model config, validated on construction.

The model is ``HybridConfig.preset(preset, size, vocab_size=round_vocab_size(tokenizer.vocab_size), **model)``
(``model`` overrides any HybridConfig field, vocab_size included). ``batch_size`` is per rank; one optimizer
step sees ``batch_size × grad_accum × world_size`` sequences of ``seq_len`` tokens (the global batch).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from hybrid.models import PRESETS, SIZES

from .data.packing import PACKINGS

__all__ = ["TrainConfig", "NONFINITE_POLICIES", "MAX_SKIPS_IN_A_ROW", "TRACKERS"]

TRACKERS = ("tensorboard", "wandb")  # experiment trackers (hybrid.train.tracking)

NONFINITE_POLICIES = ("stop", "skip")
MAX_SKIPS_IN_A_ROW = 5  # on_nonfinite="skip": more consecutive non-finite steps than this end the run


@dataclass
class TrainConfig:
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
    weight_decay: float = 0.1  # on the weights of nn.Linear / nn.Embedding only (hybrid.train.optim)
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
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)
        if self.grad_clip == 0:
            self.grad_clip = None
        self._validate()

    @property
    def warmup_steps(self) -> int:
        """``warmup``, or when it is None the derived ``min(100, steps // 10)``."""
        return min(100, self.steps // 10) if self.warmup is None else self.warmup

    def _validate(self) -> None:
        def integer(name, low):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")

        def number(name, low, high=math.inf, low_open=False, or_else=""):
            v = getattr(self, name)
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            ok = ok and (v > low if low_open else v >= low) and v <= high
            if not ok:  # no upper bound: "a finite number > 0", never "(0.0, inf]" (which inf would be in)
                what = (f"a finite number {'>' if low_open else '>='} {low:g}" if high == math.inf
                        else f"a number in {'(' if low_open else '['}{low:g}, {high:g}]")
                raise ValueError(f"{name}: expected {what}{or_else}, got {v!r}")

        if self.preset not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.size not in SIZES:
            raise ValueError(f"size: expected one of {list(SIZES)}, got {self.size!r}")
        if not isinstance(self.model, dict):
            raise ValueError(f"model: expected a dict of HybridConfig overrides, got {type(self.model).__name__}")
        for name in ("data", "tokenizer", "init_from"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: expected a string or None, got {getattr(self, name)!r}")
        if self.init_partial and self.init_from is None:
            raise ValueError("init_partial: expected together with init_from (the run to copy weights from), got no init_from")
        number("valid_fraction", 0.0, 1.0, low_open=True)
        if self.valid_fraction >= 1.0:
            raise ValueError(f"valid_fraction: expected a number in (0, 1), got {self.valid_fraction!r}")
        for name in ("seq_len", "batch_size", "grad_accum", "steps", "log_every"):
            integer(name, 1)
        for name in ("eval_every", "save_every", "seed"):
            integer(name, 0)
        integer("keep", 1)
        if self.warmup is not None:
            integer("warmup", 0)
            if self.warmup > self.steps:
                raise ValueError(f"warmup: expected at most steps={self.steps}, got {self.warmup}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing: expected one of {list(PACKINGS)}, got {self.packing!r}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite: expected one of {list(NONFINITE_POLICIES)}, got {self.on_nonfinite!r}")
        number("lr", 0.0, low_open=True)
        number("min_lr_ratio", 0.0, 1.0)
        number("weight_decay", 0.0)
        if (not isinstance(self.betas, tuple) or len(self.betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"betas: expected two numbers in [0, 1), got {self.betas!r}")
        if self.grad_clip is not None:
            number("grad_clip", 0.0, low_open=True, or_else=", or 0 (or None) for no clipping")
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(f"text_column: expected a column name, got {self.text_column!r}")
        if isinstance(self.log, (tuple, str)):
            self.log = [self.log] if isinstance(self.log, str) else list(self.log)
        if (not isinstance(self.log, list) or any(k not in TRACKERS for k in self.log)
                or len(set(self.log)) != len(self.log)):
            raise ValueError(f"log: expected a list of distinct trackers from {list(TRACKERS)}, got {self.log!r}")
        if self.eval_batches is not None:
            integer("eval_batches", 1)
        if not isinstance(self.out, str) or not self.out:
            raise ValueError(f"out: expected a directory path, got {self.out!r}")
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")
        ):
            raise ValueError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        for name in ("compile", "fsdp", "init_partial"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False, got {getattr(self, name)!r}")

    # ------------------------------------------------------------------------------------------ I/O

    def to_dict(self) -> dict:
        """Plain values only (it is stored in checkpoints, which are read with ``weights_only=True``)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        if not isinstance(d, dict):
            raise ValueError(f"train config: expected a dict, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"train config: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**d)

    def replace(self, **overrides) -> "TrainConfig":
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"train config: unknown field(s) {unknown}")
        return dataclasses.replace(self, **overrides)
