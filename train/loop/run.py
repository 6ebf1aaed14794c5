"""What every run kind's ``fit()`` shares: joining the device and the torchrun job, the seeds, the data prepared on
rank 0 first, and the loop closed whatever happens (finished, diverged, interrupted).

    class Trainer(Run):
        def _fit(self): ...            # builds self.loop, trains, returns the result
    result = Trainer(config).fit()
"""
from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch

from ..output.console import Console
from ..output.run_lock import hold_run_dir
from ..parallel.device import resolve_device
from ..parallel.distributed import DistEnv, init_distributed
from .run_dir import set_aside_later_checkpoints

__all__ = ["Run", "join", "seed_everything", "on_rank0_first", "precision"]


class Run:
    """Base of the run kinds (``Trainer``, ``Distiller``, ``TaskRun``): one run of a ``Config`` into ``out`` (default
    ``config.out``), fresh, or resumed from ``_checkpoint`` with the resume's ``_notes``.

    ``overwrite``: a fresh run may replace what ``out`` holds. ``verbose``: 0 silent, 1 start / evaluation /
    checkpoint / end messages, 2 also one line per metrics record without a progress bar; ``progress``: a bar on
    rank 0 (default: when stderr is a terminal). ``on_log(record)`` / ``on_eval(record)``: every training /
    evaluation record, on rank 0.
    """

    Config: ClassVar[type]

    def __init__(self, config, *, out=None, overwrite: bool = False, verbose: int = 1, progress: bool | None = None,
                 on_log: Callable[[dict], None] | None = None, on_eval: Callable[[dict], None] | None = None,
                 _checkpoint=None, _notes: tuple[str, ...] = ()):
        if not isinstance(config, self.Config):
            raise ValueError(f"config: expected a {self.Config.__name__}, got {type(config).__name__}")
        self.config, self.overwrite, self.on_log, self.on_eval = config, overwrite, on_log, on_eval
        self.out = Path(config.out if out is None else out)
        self.checkpoint, self.notes = _checkpoint, list(_notes)
        self.console = Console(verbose, progress)
        self.verbose, self.progress = verbose, self.console.progress
        self.env, self.loop, self.stage = DistEnv(), None, None
        self.lock = None  # the run directory's lock while fit() runs (take_out_dir)

    def write(self, msg: str) -> None:
        """Print ``msg`` on rank 0, above the progress bar when there is one (for ``on_log`` / ``on_eval``)."""
        self.console.write(msg)

    def fit(self):
        """Run ``_fit()``; whatever happens, close the loop (the bar, the metrics file, the trackers, the job)."""
        self.console = Console(self.verbose, self.progress)
        self.env, self.loop = DistEnv(), None
        finished = False
        try:
            result = self._fit()
            finished = True
            return result
        finally:
            if self.loop is not None:
                self.loop.close(finished=finished)
            else:
                self.console.close_bar()
                self.env.close(finished=finished)
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    def take_out_dir(self, *, command: str, inputs, what: str = "out") -> None:
        """Lock ``out`` for the run's life (one writer: ``hybrid.train.output.run_lock``; under torchrun rank 0 holds
        it and every rank fails together), after the output-path rule against ``inputs`` (what the run reads). A
        resumed run: the checkpoints saved after the one it resumes from belong to an abandoned branch, moved into
        ``abandoned-after-step-N/`` before anything is written (``hybrid.train.loop.run_dir``), and a note says so."""
        self.lock = hold_run_dir(self.out, command=command, env=self.env, device=self.device, what=what,
                                 inputs=inputs)
        if self.checkpoint is not None and self.env.is_main:
            aside = set_aside_later_checkpoints(self.out, self.checkpoint.step, self.checkpoint.path)
            if aside is not None:
                self.notes.append(f"resumed at step {self.checkpoint.step}, before the run's later checkpoints "
                                  f"(steps {', '.join(map(str, aside[1]))}): that branch is abandoned, its "
                                  f"checkpoints and metrics moved to {aside[0]}")

    def _fit(self):
        raise NotImplementedError


def join(device_name: str) -> tuple[torch.device, DistEnv]:
    """This process's device and its place in the torchrun job (joined); on CUDA, its GPU made current, TF32 on."""
    device = resolve_device(device_name)
    env = init_distributed(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device, env


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def on_rank0_first(env: DistEnv, make: Callable):
    """``make()`` on rank 0, then on the others (rank 0 fills a cache the others read)."""
    if env.is_main:
        made = make()
    env.barrier()
    if not env.is_main:
        made = make()
    return made


def precision(device: torch.device, dtype: str = "float32"):
    """``(autocast, scaler)``: bf16 autocast on CUDA (where supported); a float16 model: float16 autocast and a
    GradScaler (float32 master weights; CUDA only); nothing on the CPU."""
    cuda = device.type == "cuda"
    if dtype == "float16":
        if not cuda:
            raise ValueError(
                "dtype: float16 training needs a CUDA device (float32 master weights, float16 autocast and a "
                f"gradient scaler; the CPU has no float16 autocast), got float16 on the {device.type}; train with "
                "--set dtype=float32 or bfloat16"
            )
        return (lambda: torch.autocast("cuda", dtype=torch.float16)), torch.amp.GradScaler("cuda")
    if cuda and torch.cuda.is_bf16_supported():
        return (lambda: torch.autocast("cuda", dtype=torch.bfloat16)), None
    return contextlib.nullcontext, None
