"""The training loop: data, model, AdamW + warmup-cosine, evaluation, metrics, checkpoints, exact resume.

    result = Trainer(TrainConfig(steps=200, out="runs/x")).fit()        # a fresh run
    result = Trainer.from_checkpoint("runs/x", steps=400).fit()          # continue it to step 400

One optimizer step: ``grad_accum`` micro-batches per rank (``hybrid.train.parallel.sharding``), each ``cross_entropy /
grad_accum`` backpropagated (gradient sync only on the last, under DDP or FSDP2), the global gradient norm
clipped, AdamW (``hybrid.train.loop.optim``), the LambdaLR warmup-cosine schedule. bf16 autocast on CUDA, none on CPU;
a ``dtype=float16`` model trains on CUDA only, with float32 master weights, float16 autocast and a GradScaler.

Divergence never reaches a checkpoint (``hybrid.train.loop.divergence``: ``on_nonfinite`` "stop" or "skip"); what
the run prints is ``hybrid.train.output.console``'s. ``keep`` checkpoints are kept.

Step ``k`` (1-based) is logged when ``k % log_every == 0`` (the mean loss of the steps since the previous
record), evaluated when ``k % eval_every == 0``, saved when ``k % save_every == 0``, and the last step is
always evaluated and saved. Rank 0 alone writes ``OUT/``.

Exact resume: a checkpoint holds the weights, the AdamW state (keyed by parameter name), the scheduler, the
RNG states, the data position and the step; a resumed run with the same global batch makes the same updates
on the same batches as the uninterrupted run, so on a CPU its losses are bit-for-bit equal. ``steps`` may
grow on resume: it is the new total, and the cosine is stretched to it from the current step on.
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hybrid.checks import check_int
from hybrid.models import HybridConfig, HybridLM

from ..loop.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture_rng_state,
    has_checkpoint,
    kept_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from .config import MAX_SKIPS_IN_A_ROW, TrainConfig
from ..output.console import Console, end_message, start_message, train_record_line
from ..data import PreparedData, prepare_data
from ..parallel.device import env_int, resolve_device
from ..parallel.distributed import DistEnv, full_state, init_distributed, load_full_state, wrap_model
from ..loop.divergence import DivergenceGuard
from .evaluate import evaluate
from ..loop.footprint import check_fits
from ..loop.init_from import init_weights, load_init
from ..output.metrics import METRICS_FILE, MetricsLogger, plot_loss_curve
from ..loop.optim import build_optimizer, set_weight_decay
from ..loop.resume import resume_config
from ..loop.saved_model import checkpoint_config
from ..loop.schedule import warmup_cosine
from ..parallel.sharding import GlobalBatches
from ..data.tokenizer import Tokenizer, round_vocab_size
from ..output.tracking import TENSORBOARD_DIR, WANDB_DIR, open_trackers

__all__ = ["Trainer", "TrainResult", "model_config_for", "train", "PLOT_FILE", "CONFIG_FILE", "MAX_SKIPS_IN_A_ROW"]

PLOT_FILE, CONFIG_FILE = "loss.png", "train_config.json"


def model_config_for(config: TrainConfig, tokenizer: Tokenizer, base: HybridConfig | None = None) -> HybridConfig:
    """The preset at its size, ``vocab_size = round_vocab_size(tokenizer.vocab_size)``, then ``config.model``;
    with ``base`` (``--init-from``'s model), ``base`` then ``config.model``."""
    if base is not None:
        model_config = base.replace(**config.model)
    else:
        overrides = {"vocab_size": round_vocab_size(tokenizer.vocab_size), **config.model}
        model_config = HybridConfig.preset(config.preset, config.size, **overrides)
    if model_config.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"vocab_size: the model's {model_config.vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} ({tokenizer.name})"
        )
    return model_config


@dataclass
class TrainResult:
    step: int
    out: Path
    model_config: HybridConfig
    num_parameters: int
    val_loss: float | None = None
    val_bpb: float | None = None
    unigram_bpb: float | None = None
    history: list[dict] = field(default_factory=list)  # the metrics records of this call, train and eval
    paths: dict[str, Path] = field(default_factory=dict)  # checkpoint, metrics, plot, config

    @property
    def losses(self) -> dict[int, float]:
        """{step: training loss} of the records this call wrote."""
        return {r["step"]: r["loss"] for r in self.history if "loss" in r}


class Trainer:
    """One training run (fresh, or resumed with ``from_checkpoint``); ``fit()`` runs it.

    ``verbose``: 0 silent, 1 start / evaluation / checkpoint / end messages, 2 also one line per metrics
    record when there is no progress bar. ``progress``: a progress bar on rank 0 (default: when stderr is a
    TTY; ``hybrid.train.output.console``). ``on_log(record)`` / ``on_eval(record)`` are called on rank 0 with every train / eval record.
    """

    def __init__(self, config: TrainConfig, *, overwrite: bool = False, verbose: int = 1,
                 progress: bool | None = None, on_log: Callable[[dict], None] | None = None,
                 on_eval: Callable[[dict], None] | None = None, _checkpoint: Checkpoint | None = None,
                 _notes: tuple[str, ...] = ()):
        if not isinstance(config, TrainConfig):
            raise ValueError(f"config: expected a TrainConfig, got {type(config).__name__}")
        self.config, self.overwrite = config, overwrite
        self.console = Console(verbose, progress)
        self.verbose, self.progress = verbose, self.console.progress  # read again by fit()
        self.on_log, self.on_eval = on_log, on_eval
        self.checkpoint, self.notes = _checkpoint, list(_notes)
        self.out = Path(config.out)
        self.env = DistEnv()

    @classmethod
    def from_checkpoint(cls, run_dir, *, world_size: int | None = None, trainer_kwargs: dict | None = None,
                        **overrides) -> "Trainer":
        """Resume the run in ``run_dir``: its saved TrainConfig with ``overrides`` (see ``hybrid.train.loop.resume``).

        A missing checkpoint is a FileNotFoundError; a corrupt or incompatible one a CheckpointError.
        """
        ckpt = load_checkpoint(run_dir)
        run_dir = ckpt.path.parent  # run_dir may name a checkpoint directory itself (checkpoint-step-N/)
        extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
        if "train_config" not in extra or "global_batch" not in extra:
            raise CheckpointError(ckpt.path, "has no training record (train_config, global_batch): it was not "
                                             "written by train.Trainer, so it cannot be resumed")
        # runs saved before `packing` existed trained on the plain stream: resume them that way
        saved = TrainConfig.from_dict({"packing": "stream", **extra["train_config"]})
        if world_size is None:
            world_size = env_int("WORLD_SIZE", 1)
        overrides.pop("out", None)
        if overrides.get("steps") is not None and overrides["steps"] < ckpt.step:
            raise ValueError(f"steps: expected the new total, at least the checkpoint's step {ckpt.step}, got "
                             f"{overrides['steps']}")
        config, notes = resume_config(saved, saved_global_batch=int(extra["global_batch"]),
                                      world_size=world_size, out=str(run_dir), **overrides)
        return cls(config, _checkpoint=ckpt, _notes=tuple(notes), **(trainer_kwargs or {}))

    # ------------------------------------------------------------------------------------------ setup

    def write(self, msg: str) -> None:
        """Print ``msg`` on rank 0, above the progress bar when there is one (for ``on_log`` / ``on_eval``)."""
        self.console.write(msg)

    def _prepare_data(self) -> PreparedData:
        c = self.config
        kwargs = dict(tokenizer=c.tokenizer, valid_fraction=c.valid_fraction, text_column=c.text_column)
        if self.env.is_main:  # rank 0 tokenises into the cache, the others read it
            data = prepare_data(c.data, **kwargs)
        self.env.barrier()
        if not self.env.is_main:
            data = prepare_data(c.data, **kwargs)
        return data

    def _check_out_dir(self) -> None:
        if self.checkpoint is not None:
            return
        if has_checkpoint(self.out) and not self.overwrite:
            raise ValueError(
                f"out: {self.out} already holds a checkpoint; continue it with --resume {self.out}, start over "
                f"with --overwrite, or pick another --out"
            )
        self.env.barrier()  # every rank has looked before rank 0 clears anything
        if self.env.is_main:
            for name in ("checkpoint", "checkpoint.old"):
                shutil.rmtree(self.out / name, ignore_errors=True)
            for _, kept in kept_checkpoints(self.out):
                shutil.rmtree(kept, ignore_errors=True)
            for name in (METRICS_FILE, PLOT_FILE, CONFIG_FILE):
                (self.out / name).unlink(missing_ok=True)
            for name in (TENSORBOARD_DIR, WANDB_DIR):  # the old run's tracker logs
                shutil.rmtree(self.out / name, ignore_errors=True)

    def _setup(self) -> None:
        c = self.config
        self.device = resolve_device(c.device)
        self.env = init_distributed(self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self._check_out_dir()
        random.seed(c.seed)
        np.random.seed(c.seed)
        torch.manual_seed(c.seed)

        init = load_init(c.init_from) if c.init_from and self.checkpoint is None else None
        if init is not None and c.tokenizer is None:  # the source run's tokenizer, recorded in train_config.json
            self.config = c = c.replace(tokenizer=init.tokenizer)
        self.data = self._prepare_data()
        self.tokenizer = self.data.tokenizer
        base = init.config if init is not None else None
        if c.init_from and self.checkpoint is not None:  # resuming a run that started from another's weights
            base = checkpoint_config(self.checkpoint)
        self.model_config = model_config_for(c, self.tokenizer, base)
        # read back as a config: a checkpoint saved before the config had sections stores the old flat names
        as_saved = HybridConfig.from_dict(json.loads(json.dumps(self.model_config.to_dict())))
        if self.checkpoint is not None and checkpoint_config(self.checkpoint) != as_saved:
            raise CheckpointError(self.checkpoint.path / "config.json",
                                  "the model config does not match the one its training record describes")
        if c.fsdp and not self.env.distributed:
            self.notes.append("--fsdp: one process, nothing to shard; training without FSDP")
        self._set_precision()
        check_fits(self.model_config, self.device, shards=self.env.world_size if c.fsdp else 1)  # before allocating
        self.model = HybridLM(self.model_config).to(self.device)  # the module: state dicts, evaluation
        if init is not None:
            self.notes += init_weights(self.model, init, source=c.init_from, partial=c.init_partial)
        if self.scaler is not None:
            self.model.float()  # float32 master weights; float16 autocast runs the model
        self.num_parameters = self.model.num_parameters()
        wrapped = wrap_model(self.model, self.env, fsdp=c.fsdp, device=self.device)
        self.ddp = wrapped if wrapped is not self.model else None
        self.fsdp = c.fsdp and self.env.distributed
        self.train_model = torch.compile(wrapped) if c.compile else wrapped
        self.optimizer = build_optimizer(self.model, lr=c.lr, weight_decay=c.weight_decay, betas=c.betas)
        self.scheduler = warmup_cosine(self.optimizer, warmup=c.warmup_steps, total=c.steps,
                                       min_lr_ratio=c.min_lr_ratio)
        self.batches = GlobalBatches(self.data, seq_len=c.seq_len, batch_size=c.batch_size,
                                     grad_accum=c.grad_accum, seed=c.seed, rank=self.env.rank,
                                     world_size=self.env.world_size, packing=c.packing)
        self.step = 0
        self.divergence = DivergenceGuard(c.on_nonfinite, device=self.device, env=self.env, out=self.out, lr=c.lr,
                                          float16=self.scaler is not None)
        if self.checkpoint is not None:
            self._restore(self.checkpoint)

    def _set_precision(self) -> None:
        """``autocast`` and ``scaler``: bf16 autocast on CUDA; a float16 model: float16 autocast and a GradScaler."""
        self.scaler = None
        cuda = self.device.type == "cuda"
        if self.model_config.dtype == "float16":
            if not cuda:
                raise ValueError(
                    "dtype: float16 training needs a CUDA device (float32 master weights, float16 autocast and a "
                    "gradient scaler; the CPU has no float16 autocast), got float16 on the cpu; train with "
                    "--set dtype=float32 or bfloat16"
                )
            self.scaler = torch.amp.GradScaler("cuda")
            self.autocast = lambda: torch.autocast("cuda", dtype=torch.float16)
        elif cuda and torch.cuda.is_bf16_supported():
            self.autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
        else:
            self.autocast = contextlib.nullcontext

    def _restore(self, ckpt: Checkpoint) -> None:
        """Weights, optimizer, scheduler (its total set to ``steps``), data position, RNG, step."""
        try:
            load_full_state(self.model, self.optimizer, ckpt.model_state, ckpt.optimizer_state)
            self.scheduler.load_state_dict(ckpt.scheduler_state)  # after the optimizer's (it holds the lrs)
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            problem = f"does not fit this model and optimizer ({type(e).__name__}: {e})"
            raise CheckpointError(ckpt.path, problem) from None
        c = self.config  # --steps (the new total), --lr, --warmup, --weight-decay given on resume
        self.scheduler.set_total(c.steps, warmup=c.warmup_steps, lr=c.lr)
        set_weight_decay(self.optimizer, c.weight_decay)
        scaler_state = (ckpt.extra or {}).get("grad_scaler")
        if self.scaler is not None and scaler_state:
            self.scaler.load_state_dict(scaler_state)
        exact = self.batches.load_state_dict(ckpt.data_state)
        if not exact:
            self.notes.append("the data position is not on a global-batch boundary: up to one global batch of "
                              "this epoch is seen again")
        restore_rng_state(ckpt.rng_state)
        self.step = ckpt.step
        self.divergence.last_saved = (ckpt.step, ckpt.path)

    def set_total_steps(self, steps: int) -> None:
        """Change the run's total while it runs (from ``on_log``, so on one process): the cosine is
        re-stretched to it. Under torchrun every rank would have to call it at the same step.

        Called before the warmup ends, the learning rates seen so far are unchanged (warmup does not depend
        on the total), so the run is the one that ``steps`` would have given from the start.
        """
        warmup = self.config.warmup_steps  # kept: a derived warmup does not follow a total changed mid-run
        steps = check_int("steps", steps, low=max(self.step, 1, warmup),
                          what=f"an int >= max(current step {self.step}, warmup {warmup})")
        self.config = self.config.replace(steps=steps, warmup=warmup)
        self.scheduler.set_total(steps)
        self.console.set_total(steps)

    # ------------------------------------------------------------------------------------------ steps

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor | None, float, bool]:
        """One optimizer step; returns (mean loss over this rank's micro-batches, grad norm or None, lr,
        whether the update was skipped)."""
        c = self.config
        micro = self.batches.next_step()
        loss_sum = torch.zeros((), device=self.device)
        for i, (x, y, cu_seqlens) in enumerate(micro):
            last = i == len(micro) - 1
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if cu_seqlens is not None:
                cu_seqlens = cu_seqlens.to(self.device, non_blocking=True)
            if self.fsdp:
                self.model.set_requires_gradient_sync(last)
            sync = self.ddp.no_sync() if (self.ddp is not None and not last) else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    logits, _ = self.train_model(x, cu_seqlens=cu_seqlens, output_final_state=False)
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
                scaled = loss / len(micro)
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum += loss.detach()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # true gradients for clipping; records float16 overflows
        norm = None
        if c.grad_clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.grad_clip)
            if hasattr(norm, "full_tensor"):  # a DTensor under FSDP
                norm = norm.full_tensor()
        mean_loss = loss_sum / len(micro)
        skip = self.divergence.after_backward(mean_loss, norm, self.step + 1)
        lr = self.optimizer.param_groups[0]["lr"]
        if skip:
            if self.scaler is not None:
                self.scaler.update()  # the overflow recorded by unscale_ lowers the scale
        elif self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the update itself when float16 gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        with warnings.catch_warnings():  # a skipped first step: "lr_scheduler.step() before optimizer.step()"
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return mean_loss, norm, lr, skip

    def _check_health(self, *, weights: bool) -> None:
        """FloatingPointError (on every rank) if a step so far was not finite, or (``weights``) a weight is not."""
        self.divergence.check(self.step, self.model.parameters() if weights else None)

    def _evaluate(self) -> dict:
        c = self.config
        result = evaluate(self.model, self.data, seq_len=c.seq_len, batch_size=c.batch_size,
                          max_batches=c.eval_batches, device=self.device, env=self.env, autocast=self.autocast,
                          packing=c.packing)
        record = {"step": self.step, **result}
        if self.env.is_main:
            self.metrics.log_eval(self.step, **result)
            self.history.append(record)
            self.tracker.log(record)
            plot_loss_curve(self.metrics.path, self.out / PLOT_FILE)
            if self.on_eval:
                self.on_eval(record)
        self.console.say(f"step {self.step:>6}  val_loss {result['val_loss']:.4f}  val_bpb {result['val_bpb']:.4f}")
        return record

    def _save(self) -> None:
        c = self.config
        self._check_health(weights=True)  # never write a diverged model
        model_state, optim_state = full_state(self.model, self.optimizer)  # a collective under FSDP
        if self.env.is_main:
            (self.out / CONFIG_FILE).write_text(json.dumps(c.to_dict(), indent=2) + "\n")
            extra = {"train_config": c.to_dict(), "tokenizer": self.tokenizer.to_dict(),
                     "world_size": self.env.world_size, "global_batch": self.batches.global_batch,
                     "data_stats": {k: v for k, v in self.data.stats.items() if isinstance(v, (int, str, bool))}}
            if self.scaler is not None:
                extra["grad_scaler"] = self.scaler.state_dict()
            save_checkpoint(self.out, model_state=model_state, config=self.model_config.to_dict(),
                            optimizer_state=optim_state, scheduler_state=self.scheduler.state_dict(),
                            rng_state=capture_rng_state(), data_state=self.batches.state_dict(),
                            step=self.step, extra=extra, keep=c.keep)
        self.env.barrier()
        self.divergence.last_saved = (self.step, self.out / "checkpoint")
        self.console.say(f"step {self.step:>6}  checkpoint saved to {self.out / 'checkpoint'}")

    def _log(self, loss_sum: torch.Tensor, norm, lr: float, n_steps: int, n_skipped: int, seconds: float) -> dict:
        c = self.config
        self._check_health(weights=False)
        n_kept = n_steps - n_skipped  # skipped steps' losses are not in loss_sum
        total = self.env.all_reduce(loss_sum.double().clone()).item()
        loss = total / (n_kept * self.env.world_size) if n_kept else None
        if loss is not None and not math.isfinite(loss):
            raise FloatingPointError(self.divergence.message(f"the training loss is {loss} at step {self.step}"))
        tokens = n_steps * self.batches.global_batch * c.seq_len
        record = {"step": self.step, **({"loss": loss} if loss is not None else {}), "lr": lr,
                  "tokens_per_s": tokens / max(seconds, 1e-9)}
        if norm is not None and math.isfinite(float(norm)):
            record["grad_norm"] = float(norm)
        if n_skipped:
            record["skipped"] = n_skipped
        if self.env.is_main:
            self.metrics.log_train(**{"loss": None, **record})
            self.history.append(record)
            self.tracker.log(record)
            if self.on_log:
                self.on_log(record)
        return record

    # ------------------------------------------------------------------------------------------ run

    def fit(self) -> TrainResult:
        self.console = Console(self.verbose, self.progress)
        self.env = DistEnv()
        finished = False
        try:
            result = self._fit()
            finished = True
            return result
        finally:
            self.console.close_bar()
            if getattr(self, "metrics", None) is not None:
                self.metrics.close()
            if getattr(self, "tracker", None) is not None:
                self.tracker.close()
            self.env.close(finished=finished)

    def _fit(self) -> TrainResult:
        self._setup()
        c, env, console = self.config, self.env, self.console
        console.is_main = env.is_main
        start = self.step
        self.history = []
        self.metrics = self.tracker = None
        if env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.metrics = MetricsLogger(self.out, resume_step=start if self.checkpoint is not None else None)
            self.tracker = open_trackers(c.log, self.out, c.to_dict(),  # TensorBoard / W&B: each metrics record
                                         resume_step=start if self.checkpoint is not None else None)
            (self.out / CONFIG_FILE).write_text(json.dumps(c.to_dict(), indent=2) + "\n")
        console.open_bar(total=c.steps, initial=start, desc="train")
        wrap = "FSDP2" if self.fsdp else ("DDP" if self.ddp is not None else "single process")
        console.say(start_message(resumed=self.checkpoint is not None, config=c, model_config=self.model_config,
                                  num_parameters=self.num_parameters, device=self.device, wrap=wrap,
                                  stats=self.data.stats, start=start, global_batch=self.batches.global_batch,
                                  world_size=env.world_size))
        for note in self.notes:
            console.say(f"note: {note}")
        unigram = self.data.unigram_bpb() if env.is_main else None

        last_eval = self._loop()
        if last_eval is None:  # resumed at the final step: nothing to train, the checkpoint is current
            last_eval = self._evaluate()
        paths = {"out": self.out, "checkpoint": self.out / "checkpoint", "metrics": self.out / METRICS_FILE,
                 "plot": self.out / PLOT_FILE, "config": self.out / CONFIG_FILE}  # the plot: drawn by _evaluate
        console.close_bar()
        console.say(end_message(paths, last_eval, unigram, self.config.packing))
        return TrainResult(step=self.step, out=self.out, model_config=self.model_config,
                           num_parameters=self.num_parameters, val_loss=last_eval["val_loss"],
                           val_bpb=last_eval["val_bpb"], unigram_bpb=unigram, history=self.history, paths=paths)

    def _loop(self) -> dict | None:
        """Train to ``self.config.steps`` (read every step: ``set_total_steps`` may change it); returns the last
        evaluation record, None when there was nothing to train."""
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        n_steps, n_skipped, seconds, last_eval = 0, 0, 0.0, None
        while self.step < self.config.steps:
            t0 = time.perf_counter()
            loss, norm, lr, skipped = self._train_step()
            self.step += 1
            n_steps += 1
            self.divergence.count(self.step, skipped, self.console.say)
            if skipped:
                n_skipped += 1
            else:
                loss_sum += loss.double()
            c, postfix = self.config, {}
            if self.step % c.log_every == 0 or self.step == c.steps:
                seconds += time.perf_counter() - t0  # after the loss sync, so queued GPU work is counted
                record = self._log(loss_sum, norm, lr, n_steps, n_skipped, seconds)
                loss_sum.zero_()
                n_steps, n_skipped, seconds = 0, 0, 0.0
                if self.console.bar is not None:
                    postfix = dict(loss=f"{record['loss']:.4f}" if "loss" in record else "-",
                                   lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
                else:
                    self.console.say(train_record_line(record), level=2)
            else:
                seconds += time.perf_counter() - t0
            self.console.advance(**postfix)
            c = self.config  # on_log may have changed the total
            if (c.eval_every and self.step % c.eval_every == 0) or self.step == c.steps:
                self._check_health(weights=True)  # no NaN validation record either
                last_eval = self._evaluate()
            if (c.save_every and self.step % c.save_every == 0) or self.step == c.steps:
                self._save()
        return last_eval

def train(config: TrainConfig, **kwargs) -> TrainResult:
    """``Trainer(config, **kwargs).fit()``."""
    return Trainer(config, **kwargs).fit()
