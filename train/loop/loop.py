"""The one training loop. A language model, a distillation's two stages and a synthetic task all train through it:

    loop = TrainingLoop(out, cadence, grad_clip=1.0, divergence=guard, env=env, device=device, console=console,
                        parts=run_parts, model_config=lambda: model.config.to_dict())
    loop.open(log)                     # the run's RunLog: metrics.jsonl and the trackers, until close()
    loop.restore(checkpoint, stage)    # a resumed run: every part back, and the step
    last = loop.train(stage)           # to stage.steps: records, evaluations and checkpoints on the cadence
    loop.close(finished=True)

What every run does alike is here, once:

- the optimizer step: this rank's micro-batches (``stage.micro_batches``), each loss (``stage.loss``) divided by their
  number and backpropagated, the gradients synchronised on the last only (DDP's ``no_sync``, FSDP2's
  ``set_requires_gradient_sync``), a GradScaler's unscale, the global norm of ``stage.trainable`` clipped to
  ``grad_clip``, the update, the schedule's step;
- the divergence policy (``DivergenceGuard``): a non-finite loss or gradient norm is folded into a flag on the
  device, checked at every record, evaluation and save (``stop``), or read every step to drop that update
  (``skip``); no checkpoint ever holds a diverged model;
- the cadence (``Cadence``): a record every ``log_every`` steps (means since the last one, every rank together),
  an evaluation every ``eval_every``, a checkpoint every ``save_every``, and all three at a stage's last step; the
  step counts across stages;
- the checkpoint: the run's named parts and the stage's (``hybrid.train.loop.parts``), saved whole by rank 0 and
  restored part by part, so a resumed run continues bit for bit; the loop's own part, ``pending_record``
  (``PendingRecord``), holds what the next record averages, so a run resumed between two records writes the
  uninterrupted run's records;
- the records' way out (``hybrid.train.output.records.RunLog``) from ``open`` to ``close``.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..output.console import Console
from ..parallel.distributed import DistEnv, gradient_sync
from .checkpoint import Checkpoint
from .divergence import DivergenceGuard
from .parts import load_parts, save_parts
from ..output.records import RunLog
from .stage import Stage

__all__ = ["Cadence", "TrainingLoop", "PendingRecord", "PENDING"]

PENDING = "pending_record"  # the checkpoint part of the loop's PendingRecord


@dataclass
class Cadence:
    """When the loop records, evaluates and saves (global steps; 0 = only at a stage's last step)."""

    log_every: int
    eval_every: int = 0
    save_every: int = 0
    keep: int = 1  # checkpoints kept: checkpoint/ and the newest keep − 1 of checkpoint-step-N/


class PendingRecord:
    """What the next training record averages, gathered since the last one: this rank's sums of the loss and the
    stage's parts (float64 on the device), the steps, the skipped ones among them, the tokens and the training
    seconds. A checkpoint part (``PENDING``; optional: a checkpoint written before it existed starts from zero), so a
    run resumed between two records writes the uninterrupted run's: the same means of the same steps, bit for bit
    on one process and on as many ranks as saved it. ``tokens_per_s`` is measured, so it never repeats exactly."""

    optional = True

    def __init__(self, env: DistEnv, device: torch.device):
        self.env, self.device = env, device
        self.clear()

    def clear(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps, self.skipped, self.tokens, self.seconds = 0, 0, 0, 0.0

    def add(self, values: dict[str, torch.Tensor] | None, tokens: int) -> None:
        """One step: its loss and parts (None: the step was skipped), and its tokens."""
        self.steps += 1
        self.tokens += tokens
        if values is None:
            self.skipped += 1
            return
        for k, v in values.items():
            self.sums[k] = self.sums[k] + v.double() if k in self.sums else v.double()

    def state_dict(self) -> dict:
        """The counts, and every rank's sums as a list by rank (one collective when there are sums: every rank
        holds the same names, as the steps skipped are skipped on every rank)."""
        sums = {}
        if self.sums:
            table = torch.zeros(self.env.world_size, len(self.sums), dtype=torch.float64, device=self.device)
            table[self.env.rank] = torch.stack(list(self.sums.values()))
            by_rank = self.env.all_reduce(table).T.tolist()  # adds zeros only: each rank's sums unchanged
            sums = dict(zip(self.sums, by_rank))
        return {"sums": sums, "steps": self.steps, "skipped": self.skipped, "tokens": self.tokens,
                "seconds": self.seconds}

    def load_state_dict(self, state: dict) -> None:
        """The saved sums back: each rank its own on as many ranks as saved them; on another number, rank 0 holds
        their total scaled to it, the others zero (the record's means are the same, up to rounding)."""
        self.clear()
        ws, rank = self.env.world_size, self.env.rank
        for k, rows in state["sums"].items():
            value = rows[rank] if len(rows) == ws else (sum(rows) * ws / len(rows) if rank == 0 else 0.0)
            self.sums[k] = torch.tensor(value, dtype=torch.float64, device=self.device)
        self.steps, self.skipped = int(state["steps"]), int(state["skipped"])
        self.tokens, self.seconds = int(state["tokens"]), float(state["seconds"])


def _wait_for(device: torch.device) -> None:
    """Block until ``device`` has run what was queued on it (CUDA), so the clock read next covers it: nothing in a
    step waits for the GPU before the record, so without it tokens/s would time how fast the host queues work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class TrainingLoop:
    """``parts``: the run's checkpoint parts beside the stage's (data position, RNG, the run's records);
    ``model_config()``: the config of the model being trained, saved beside its weights; ``scaler``: a GradScaler
    (float16 training); ``after_save()`` / ``after_eval()``: called on rank 0 (the run's config file, its plot);
    ``on_step(step)``: after every step, on every rank."""

    def __init__(self, out, cadence: Cadence, *, grad_clip: float | None, divergence: DivergenceGuard, env: DistEnv,
                 device: torch.device, console: Console, parts: dict, model_config: Callable[[], dict],
                 scaler=None, after_save: Callable[[], None] | None = None,
                 after_eval: Callable[[], None] | None = None, on_step: Callable[[int], None] | None = None):
        self.out, self.cadence, self.grad_clip = Path(out), cadence, grad_clip
        self.divergence, self.env, self.device, self.console = divergence, env, device, console
        self.parts, self.model_config, self.scaler = parts, model_config, scaler
        self.after_save, self.after_eval, self.on_step = after_save, after_eval, on_step
        self.step = 0
        self.log: RunLog | None = None
        self.pending = PendingRecord(env, device)

    # ------------------------------------------------------------------------------------------ lifecycle

    def open(self, log: RunLog) -> None:
        self.log = log

    def close(self, *, finished: bool) -> None:
        """End the run: the bar, the metrics file and the trackers closed, this rank out of the job."""
        self.console.close_bar()
        if self.log is not None:
            self.log.close()
        self.env.close(finished=finished)

    def restore(self, ckpt: Checkpoint, stage: Stage, *, optional: tuple[str, ...] = ()) -> None:
        """Every part of the run and of ``stage`` from ``ckpt`` (the loop's pending record too), and the step."""
        load_parts(ckpt, {**self.parts, **stage.parts(), PENDING: self.pending}, optional=optional)
        self.step = ckpt.step
        self.divergence.last_saved = (ckpt.step, ckpt.path)

    # ------------------------------------------------------------------------------------------ one step

    def _optimizer_step(self, stage: Stage):
        """One optimizer step of ``stage``: (mean loss and parts on this rank, grad norm or None, lr, skipped)."""
        micro = stage.micro_batches(self.step + 1)
        loss_sum = None  # in the loss's dtype (a float64 model's losses stay float64)
        part_sums: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(micro):
            with gradient_sync(stage.train_model, i == len(micro) - 1):
                loss, parts = stage.loss(batch)
                scaled = loss / len(micro)
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            for k, v in parts.items():
                part_sums[k] = part_sums[k] + v.detach() if k in part_sums else v.detach()
        if self.scaler is not None:
            self.scaler.unscale_(stage.optimizer)  # true gradients for clipping; records float16 overflows
        # the global norm, clipped to grad_clip; with clipping off (None) measured all the same (max_norm inf scales
        # by exactly 1), so that a non-finite gradient is still seen by the divergence policy and recorded
        max_norm = self.grad_clip if self.grad_clip is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(stage.trainable, max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP
            norm = norm.full_tensor()
        mean_loss = loss_sum / len(micro)
        skip = self.divergence.after_backward(mean_loss, norm, self.step + 1)
        lr = stage.optimizer.param_groups[0]["lr"]
        if self.scaler is not None:
            if not skip:
                self.scaler.step(stage.optimizer)  # skips the update itself when float16 gradients overflowed
            self.scaler.update()  # after a skip too: the overflow recorded by unscale_ lowers the scale
        elif not skip:
            stage.optimizer.step()
        with warnings.catch_warnings():  # a skipped first step: "lr_scheduler.step() before optimizer.step()"
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            stage.scheduler.step()
        stage.optimizer.zero_grad(set_to_none=True)
        return mean_loss, {k: v / len(micro) for k, v in part_sums.items()}, norm, lr, skip

    # ------------------------------------------------------------------------------------------ the cadence

    def train(self, stage: Stage) -> dict | None:
        """Train ``stage`` until ``stage.done == stage.steps`` (read every step: it may grow); returns its last
        evaluation record, None when there was nothing to train."""
        last_eval, pending = None, self.pending  # pending: restored with a checkpoint taken between records
        while stage.done < stage.steps:
            t0 = time.perf_counter()
            loss, parts, norm, lr, skipped = self._optimizer_step(stage)
            self.step += 1
            stage.done += 1
            stage.after_step(self.step, loss)
            self.divergence.count(self.step, skipped, self.console.say)
            pending.add(None if skipped else {"loss": loss, **parts}, stage.tokens_per_step)
            postfix = {}
            if self.step % self.cadence.log_every == 0 or stage.done == stage.steps:
                _wait_for(self.device)  # the steps' queued GPU work, timed (the record reads the loss back anyway)
                pending.seconds += time.perf_counter() - t0
                record = self._record(stage, pending, norm, lr)
                pending.clear()
                postfix = self._show(stage, record)
            else:
                pending.seconds += time.perf_counter() - t0
            self.console.advance(**postfix)
            if self.on_step is not None:
                self.on_step(self.step)
            last = stage.done == stage.steps  # on_log may have changed the total
            if (self.cadence.eval_every and self.step % self.cadence.eval_every == 0) or last:
                last_eval = self.evaluate(stage)
            if (self.cadence.save_every and self.step % self.cadence.save_every == 0) or last:
                self.save(stage)
        return last_eval

    def _record(self, stage: Stage, pending: PendingRecord, norm, lr: float) -> dict:
        """The training record of the steps since the last one: means over them and over the ranks (one collective)."""
        self.divergence.check(self.step)
        sums, n_skipped, tokens_per_s = pending.sums, pending.skipped, pending.tokens / max(pending.seconds, 1e-9)
        n_kept, ws = pending.steps - n_skipped, self.env.world_size
        names = list(sums) or ["loss"]
        totals = torch.stack([sums[k] for k in sums]) if sums else torch.zeros(1, dtype=torch.float64,
                                                                                device=self.device)
        totals = self.env.all_reduce(totals.clone()).tolist()
        means = {k: t / (n_kept * ws) for k, t in zip(names, totals)} if n_kept else {}
        if "loss" in means and not math.isfinite(means["loss"]):
            raise FloatingPointError(self.divergence.message(f"the loss is {means['loss']} at step {self.step}"))
        record = {"step": self.step, **stage.tag, **({"loss": means.pop("loss")} if "loss" in means else {}),
                  "lr": lr, "tokens_per_s": tokens_per_s, **means}
        if norm is not None and math.isfinite(float(norm)):
            record["grad_norm"] = float(norm)
        if n_skipped:
            record["skipped"] = n_skipped
        self.log.train(record)
        return record

    def _show(self, stage: Stage, record: dict) -> dict:
        """The record beside the progress bar, or as a line (verbose 2) without one."""
        loss = f"{record['loss']:.4f}" if "loss" in record else "-"
        if self.console.bar is not None:
            return dict(**stage.tag, loss=loss, lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
        skips = f"  skipped {record['skipped']}" if "skipped" in record else ""
        where = f"{stage.tag['stage']:<7}  " if "stage" in stage.tag else ""
        self.console.say(f"step {self.step:>6}  {where}loss {loss}  lr {record['lr']:.3e}  "
                         f"{record['tokens_per_s']:,.0f} tok/s{skips}", level=2)
        return {}

    def evaluate(self, stage: Stage, *, write: bool = True) -> dict:
        """``stage.evaluate()`` as a record (never of a diverged model), written and shown. ``write`` False: shown
        and kept in the run's history, not written (the metrics file, the trackers, ``on_eval``): the records a
        resumed run kept hold it already (``holds``)."""
        self.divergence.check(self.step, stage.trainable)
        figures = stage.evaluate()
        record = {"step": self.step, **stage.tag, **figures}
        if not write:
            self.log.history.append(record)
        else:
            self.log.eval(record)
            if self.env.is_main and self.after_eval is not None:
                self.after_eval()
        self.console.say(stage.eval_line(self.step, figures))
        return record

    def holds(self, key: str) -> bool:
        """Whether the records a resumed run kept hold one with ``key`` at the current step: rank 0 reads its file,
        every rank gets its answer (one collective)."""
        held = torch.tensor(float(self.log.holds(self.step, key)), dtype=torch.float64, device=self.device)
        return self.env.all_reduce(held).item() > 0

    def save(self, stage: Stage) -> None:
        """A checkpoint of every part (never of a diverged model), written by rank 0."""
        self.divergence.check(self.step, stage.trainable)
        save_parts(self.out, {**stage.parts(), **self.parts, PENDING: self.pending}, step=self.step,
                   model_config=self.model_config(), keep=self.cadence.keep, env=self.env)
        if self.env.is_main and self.after_save is not None:
            self.after_save()
        self.env.barrier()
        self.divergence.last_saved = (self.step, self.out / "checkpoint")
        self.console.say(f"step {self.step:>6}  checkpoint saved to {self.out / 'checkpoint'}")
