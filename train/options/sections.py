"""The option sections every run kind draws from, each option declared here once (torchtitan's nested config, kept
flat so a run's config stays one dict: ``train_config.json``, a ``--config`` file, a checkpoint's record).

- ``ModelOptions``: which model (a preset at a size, HybridConfig overrides, another run's weights to start from);
- ``DataOptions``: the corpus, its sequences and the batch;
- ``OptimizerOptions``: AdamW and its warmup-cosine schedule, gradient clipping;
- ``LoopOptions``: how long, and how often the loop records, evaluates and saves; the divergence policy; the seed
  and the run directory;
- ``LoggingOptions``: the experiment trackers;
- ``ExecutionOptions``: where it runs (the device, torch.compile, FSDP2 under torchrun);
- ``ContextParallelOptions``: how many ranks share one sequence (context parallelism; the language model's runs
  only, the one run kind with a context-parallel path).

A run config is the sections it takes (``TrainConfig`` all of them, ``DistillConfig`` all but the model's, a task
run the model's and the optimizer's) plus its own options; where it takes an option with another default it says
so with ``redeclare``. The defaults here are the language model's (``hybrid-train``).
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid.models import PRESETS, SIZES

from ..data.packing import PACKINGS
from ..loop.divergence import MAX_SKIPS_IN_A_ROW, NONFINITE_POLICIES
from ..output.tracking import TRACKERS
from .checks import (a_bool, a_path, check_betas, check_device, check_fraction, check_optional_str, check_text_column,
                     clip, one_of, optional_whole, overrides, real, tracker_list, whole)
from .fields import option

__all__ = ["ModelOptions", "DataOptions", "OptimizerOptions", "LoopOptions", "LoggingOptions", "ExecutionOptions",
           "ContextParallelOptions"]


@dataclass
class ModelOptions:
    preset: str = option("hybrid", "model", check=one_of(sorted(PRESETS)), choices=tuple(sorted(PRESETS)),
                         help="architecture: the RRA hybrid, all RetNet, all attention, all VO-RoPE gated linear "
                              "attention, or all recurrence")
    size: str = option("tiny", "model", check=one_of(list(SIZES)), choices=tuple(SIZES),
                       help="tiny ≈0.8M, small ≈25M, base ≈125M, large ≈350M parameters")
    model: dict = option({}, "model", check=overrides, flag=False,
                         help="HybridConfig overrides, e.g. {'pattern': 'RRA', 'window': 128} (--set, the model "
                              "flags)")
    init_from: str | None = option(None, "model", check=check_optional_str, metavar="RUN_DIR",
                                   help="start from the weights and model config of another run (e.g. one written "
                                        "by hybrid-import); not its optimizer or step; --preset/--size are then "
                                        "refused", shown_default="none, a fresh model")


@dataclass
class DataOptions:
    data: str | None = option(None, "data", check=check_optional_str, metavar="PATH_OR_DATASET",
                              help="a text file, a .jsonl/.parquet/.csv file with a 'text' column (.gz/.bz2/.xz "
                                   "too), a directory of text files and .jsonl/.parquet shards, or a Hugging Face "
                                   "dataset name (needs internet)",
                              shown_default="this Python's stdlib sources")
    text_column: str = option("text", "data", check=check_text_column, metavar="NAME",
                              help="the column holding the text in .jsonl / .parquet / .csv data")
    skip_rows_without_text: bool = option(False, "data", check=a_bool, action="store_true",
                                          help="train on the rows of .jsonl / .parquet / .csv data that have the text "
                                               "column; without it a file with rows that lack it is refused, naming "
                                               "the file")
    valid_fraction: float = option(0.05, "data", check=check_fraction, type=float,
                                   help="fraction of documents held out for validation")
    seq_len: int = option(256, "data", check=whole(1), help="tokens per sequence")
    packing: str = option("documents", "data", check=one_of(PACKINGS), choices=PACKINGS,
                          help="documents: every mixer restarts at each document inside a sequence (cu_seqlens); "
                               "stream: sequences read across document ends (docs/training.md)")
    batch_size: int = option(16, "data", check=whole(1),
                             help="sequences per micro-batch per rank; one optimizer step reads batch_size × "
                                  "grad_accum × ranks sequences")
    grad_accum: int = option(1, "data", check=whole(1), help="micro-batches per optimizer step")


@dataclass
class OptimizerOptions:
    lr: float = option(2e-3, "optimizer", check=real(0.0, low_open=True), type=float, help="peak learning rate")
    min_lr_ratio: float = option(0.1, "optimizer", check=real(0.0, 1.0), type=float,
                                 help="the cosine decays to lr × this")
    warmup: int | None = option(None, "optimizer", check=optional_whole(0),
                                help="linear warmup steps", shown_default="min(100, steps / 10)")
    weight_decay: float = option(0.1, "optimizer", check=real(0.0), type=float,
                                 help="AdamW decay of Linear/Embedding weights only")
    betas: tuple[float, float] = option((0.9, 0.95), "optimizer", check=check_betas, type=float, nargs=2,
                                        metavar=("B1", "B2"), help="AdamW betas", shown_default="0.9 0.95")
    grad_clip: float | None = option(1.0, "optimizer", check=clip, type=float,
                                     help="max gradient norm; 0 turns clipping off")


@dataclass
class LoopOptions:
    steps: int = option(1000, "loop", check=whole(1),
                        help="total optimizer steps, counted from the run's start")
    eval_every: int = option(250, "loop", check=whole(0),
                             help="steps between evaluations, 0 = only at the end")
    eval_batches: int | None = option(50, "loop", check=optional_whole(1, "all"),
                                      help="validation size per evaluation, in global batches (batch_size × "
                                           "grad_accum × ranks sequences each, however laid out), or 'all'")
    log_every: int = option(10, "loop", check=whole(1), help="steps between metrics records")
    save_every: int = option(500, "loop", check=whole(0),
                             help="steps between checkpoints, 0 = only at the end")
    keep: int = option(2, "loop", check=whole(1),
                       help="checkpoints to keep: checkpoint/ and the newest N-1 as checkpoint-step-STEP/")
    on_nonfinite: str = option("stop", "loop", check=one_of(NONFINITE_POLICIES), choices=NONFINITE_POLICIES,
                               help="a non-finite loss or gradient: stop (the run ends; no checkpoint holds it) or "
                                    f"skip (drop that step's update; stop after {MAX_SKIPS_IN_A_ROW} in a row)")
    seed: int = option(0, "loop", check=whole(0), help="model init and data order")
    out: str = option("runs/train", "loop", check=a_path, metavar="DIR", help="run directory")


@dataclass
class LoggingOptions:
    log: list = option([], "logging", check=tracker_list, choices=TRACKERS, action="append",
                       help="experiment trackers that also get the metrics records and the config: TensorBoard "
                            "(RUN/tensorboard/) or Weights & Biases (WANDB_MODE=offline works offline); repeatable; "
                            "extras [tensorboard], [wandb]")


@dataclass
class ExecutionOptions:
    device: str = option("auto", "execution", check=check_device,
                         help="auto (cuda when available), cpu, cuda or cuda:N")
    compile: bool = option(False, "execution", check=a_bool, action="store_true", help="torch.compile each block of the model (one graph per kind of block; docs/training.md, 'Compile')")
    fsdp: bool = option(False, "execution", check=a_bool, action="store_true",
                        help="under torchrun: shard with FSDP2 instead of replicating with DDP")


@dataclass
class ContextParallelOptions:
    cp: int = option(1, "execution", check=whole(1), metavar="N",
                     help="under torchrun: split each sequence across N ranks (context parallelism; the ranks form "
                          "a data × context mesh of WORLD_SIZE / N × N; seq_len must divide by N; docs/training.md)")
