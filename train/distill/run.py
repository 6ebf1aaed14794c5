"""The distillation run: student, the two stages, selection, the run directory, exact resume (the teacher:
``teacher.load_teacher``; the run's loss.png: ``plot.plot_stages``).

    result = Distiller(DistillConfig(teacher="runs/tf", pattern="RRA", model={"window": 64}, out="runs/rra")).fit()
    result = Distiller.from_checkpoint("runs/rra", steps=400).fit()          # continue; --steps is the new total

One process, or ``torchrun`` (``torchrun --nproc-per-node N -m hybrid.train.distill …``): ``batch_size`` is per
rank, as in hybrid-train, so one step reads the global batch ``G = batch_size × world_size``
(``hybrid.train.parallel.sharding``: rank ``r`` trains on rows ``[r·batch_size, (r+1)·batch_size)`` of it). Global step
``k`` counts the stage-1 steps, then the stage-2 steps; every step reads one global batch of ``G × seq_len``
training tokens (the data order continues across the stages), so the run's distillation tokens are
``(align_steps + steps) × G × seq_len``.

Under torchrun nothing is wrapped: after each backward pass the trainable gradients are averaged across the ranks
(one all-reduce per bucket), which is DDP's update; both stages' losses are means over equal per-rank token
counts, so N ranks × ``batch_size`` make the update of one process with ``G`` sequences (to float rounding). The
frozen teacher is loaded by every rank; rank 0's model is broadcast at the start of each stage.
Evaluation and the auto:K ranking read global validation batches of ``G`` sequences, each rank its rows, and sum
across the ranks, so every rank gets the same figures and the same ranking (rank 0's ranking is broadcast too):
every rank builds the same student. Rank 0 alone writes ``OUT/`` and prints; logged losses are means over the
ranks. A resumed run keeps its global batch: ``batch_size = G / world_size`` on the ranks it resumes on.

- Stage 1 trains the R mixers only (every other weight frozen) on ``alignment_losses``; in ``auto:K`` mode every
  attention layer of the teacher gets an R layer here (the stage-1 model is the teacher with all of them
  replaced), then ``replacement_costs`` ranks them and the student keeps the K most costly as attention.
- Stage 2 trains the student (``train="all"``) or the replaced layers' mixers (``"new"``) on ``distill_loss``.

Checkpoints (``hybrid.train.loop.checkpoint``) hold the current model (in stage 1 the stage-1 model, after it the
student: a ``HybridLM`` with its own ``HybridConfig``), the optimizer and schedule of the current stage, the data
position, the RNG and the stage; ``extra["tokenizer"]`` is the teacher's, so ``load_run``, ``hybrid-generate``,
``hybrid-export`` and the benchmark's evaluation open the run directory like any other. A non-finite loss or
gradient norm is caught at the next log or save (a flag on the device, no sync per step; under torchrun the
ranks' flags are combined there) and ends the run, on every rank, before anything is written; the last good
checkpoint stays.
"""
from __future__ import annotations

import contextlib
import json
import random
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybrid.models import HybridLM

from ..loop.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from ..output.console import Console
from ..data import prepare_data
from ..data.packing import pack_documents
from ..parallel.device import env_int, resolve_device
from ..parallel.distributed import DistEnv, init_distributed
from .ranks import average_gradients, broadcast_weights, sum_over_ranks
from ..loop.divergence import NonFiniteFlag, nonfinite_weights
from ..loop.init_from import copy_matching
from ..output.metrics import METRICS_FILE, MetricsLogger, read_metrics
from ..loop.optim import build_optimizer
from ..output.outdir import check_output_dir
from ..loop.saved_model import checkpoint_config
from ..loop.schedule import warmup_cosine
from ..parallel.sharding import GlobalBatches
from ..data.tokenizer import tokenizer_from_dict
from ..output.tracking import open_trackers
from .config import RESUMABLE, DistillConfig
from .losses import alignment_losses, capture_mixer_io, distill_loss, token_kl
from .mapping import decay_from_attention, init_student, layer_types_for_pattern, student_config
from .plot import plot_stages
from .select import keep_most_costly, parse_keep_attention, replacement_costs
from .teacher import load_teacher

__all__ = ["Distiller", "DistillResult", "PLOT_FILE", "RANKING_FILE", "SUMMARY_FILE", "CONFIG_FILE"]

PLOT_FILE, RANKING_FILE, SUMMARY_FILE = "loss.png", "layer_ranking.json", "distill.json"
CONFIG_FILE = "distill_config.json"


@dataclass
class DistillResult:
    step: int
    out: Path
    layer_types: str  # the student's
    replaced: list[int]
    val_loss: float | None = None
    val_bpb: float | None = None
    val_kl: float | None = None
    teacher_val_bpb: float | None = None
    ranking: list[dict] | None = None
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


class Distiller:
    """One distillation run (fresh, or resumed with ``from_checkpoint``); ``fit()`` runs it. ``verbose``: 0 silent,
    1 messages, 2 also one line per metrics record without a progress bar. ``on_log(record)``: every record."""

    def __init__(self, config: DistillConfig, *, overwrite: bool = False, verbose: int = 1,
                 progress: bool | None = None, on_log: Callable[[dict], None] | None = None,
                 _checkpoint: Checkpoint | None = None):
        if not isinstance(config, DistillConfig):
            raise ValueError(f"config: expected a DistillConfig, got {type(config).__name__}")
        self.config, self.overwrite = config, overwrite
        self.console = Console(verbose, progress)
        self.on_log, self.checkpoint = on_log, _checkpoint
        self.out = Path(config.out)
        self.last_saved: tuple[int, Path] | None = None
        self.step = 0
        self.env = DistEnv()  # this process's place in a torchrun job, joined by fit()

    @classmethod
    def from_checkpoint(cls, run_dir, *, world_size: int | None = None, distiller_kwargs: dict | None = None,
                        **overrides) -> "Distiller":
        """Continue the run in ``run_dir``; ``overrides`` may change only ``RESUMABLE`` fields (``steps``: the new
        total of stage 2). The global batch is kept: on ``world_size`` ranks (default: torchrun's ``WORLD_SIZE``,
        1 without it) ``batch_size`` becomes ``G / world_size``."""
        ckpt = load_checkpoint(run_dir)
        extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
        record = extra.get("distill")
        if not isinstance(record, dict):
            raise CheckpointError(ckpt.path, "has no distillation record: it was not written by hybrid-distill, so "
                                             "hybrid-distill cannot resume it")
        saved = DistillConfig.from_dict(record["config"])
        world = env_int("WORLD_SIZE", 1) if world_size is None else world_size
        data_state = ckpt.data_state if isinstance(ckpt.data_state, dict) else {}
        global_batch = int(data_state.get("global_batch", saved.batch_size * record.get("world_size", 1)))
        if world < 1 or global_batch % world:
            raise ValueError(f"--resume: expected a number of ranks that divides the run's global batch of "
                             f"{global_batch} sequences (batch_size × ranks, kept on resume), got {world} ranks")
        per_rank = global_batch // world
        if overrides.get("batch_size", per_rank) != per_rank:
            raise ValueError(f"--batch-size: expected {per_rank} per rank on {world} rank(s) (the run's global batch "
                             f"of {global_batch} sequences is kept on resume), got {overrides['batch_size']}")
        overrides.pop("batch_size", None)
        overrides.pop("out", None)
        if "teacher" in overrides and Path(overrides["teacher"]).resolve() == Path(record["teacher"]["path"]):
            overrides.pop("teacher")  # the same run, named another way
        fixed = sorted(k for k, v in overrides.items() if k not in RESUMABLE and v != getattr(saved, k, None))
        if fixed:
            flags = lambda names: ", ".join("--" + k.replace("_", "-") for k in names)  # noqa: E731
            raise ValueError(f"--resume: expected only {flags(RESUMABLE)} to change, got {flags(fixed)} (they define "
                             f"the run)")
        done = record["stage_step"] if record["stage"] == "distill" else 0
        if overrides.get("steps") is not None and overrides["steps"] < done:
            raise ValueError(f"steps: expected the new total of stage 2, at least the {done} steps done, got "
                             f"{overrides['steps']}")
        overrides.pop("teacher", None)  # unchanged: the recorded absolute path works from any directory
        config = saved.replace(**overrides, batch_size=per_rank, teacher=record["teacher"]["path"],
                               out=str(ckpt.path.parent))
        return cls(config, _checkpoint=ckpt, **(distiller_kwargs or {}))

    # ------------------------------------------------------------------------------------------ setup

    def _plan(self) -> None:
        """Check everything the command line gave against the teacher (one line per mistake), before writing."""
        c, t = self.config, self.teacher
        letters = t.config.layer_types
        self.candidates = [i for i, letter in enumerate(letters) if letter == "A"]
        if not self.candidates:
            raise ValueError(f"--teacher: expected a model with attention layers to replace, got layers {letters!r}")
        self.k = None
        if c.pattern is not None:
            types = layer_types_for_pattern(c.pattern, t.config.n_layers)
            for i, (have, want) in enumerate(zip(letters, types)):  # R / A at attention, the teacher's own elsewhere
                if (want not in ("R", "A")) if have == "A" else (want != have):
                    expected = "R or A (the teacher has attention there)" if have == "A" else f"the teacher's {have!r}"
                    raise ValueError(f"--pattern: expected {expected} at layer {i} (the teacher's layers are "
                                     f"{letters!r}), got {want!r} ({c.pattern!r} gives {types!r})")
            self.align_layers = [i for i, (have, want) in enumerate(zip(letters, types)) if want == "R" and have == "A"]
            self.align_pattern = c.pattern
        else:
            self.k = parse_keep_attention(c.keep_attention, t.config.n_layers, len(self.candidates))
            self.align_layers = list(self.candidates)
            self.align_pattern = "".join("R" if i in self.candidates else x for i, x in enumerate(letters))
        try:
            self.align_config = student_config(t.config, self.align_pattern, c.model, str(t.path))
            if c.pattern is None:  # every student auto:K can give must be a valid config too (the window)
                student_config(t.config, letters, c.model, str(t.path))
        except ValueError as e:
            raise ValueError(f"student: {e}") from None
        self.tokenizer = tokenizer_from_dict(t.tokenizer)
        if self.tokenizer.vocab_size > t.config.vocab_size:
            raise ValueError(f"--teacher: expected a tokenizer of at most the model's vocab_size={t.config.vocab_size} "
                             f"tokens, got {self.tokenizer.vocab_size} ({self.tokenizer.name})")

    def _setup(self) -> None:
        c = self.config
        self.device = resolve_device(c.device)
        self.env = init_distributed(self.device)
        self.console.is_main = self.env.is_main
        if self.env.distributed and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.checkpoint is None:  # refuse a used --out before anything slow (and before clearing it)
            inputs = [Path(c.teacher)] + ([Path(c.data)] if c.data and Path(c.data).exists() else [])
            check_output_dir(self.out, overwrite=self.overwrite, what="--out", inputs=inputs)
        random.seed(c.seed)
        np.random.seed(c.seed)
        torch.manual_seed(c.seed)
        self.teacher = load_teacher(c.teacher, self.device)
        if self.checkpoint is not None:
            recorded = self.checkpoint.extra["distill"]["teacher"]
            if recorded["sha256"] != self.teacher.sha256:
                raise ValueError(f"--teacher: expected the teacher this run started from, got {self.teacher.path}, "
                                 f"whose weights changed since (sha256 {self.teacher.sha256[:12]}…, recorded "
                                 f"{recorded['sha256'][:12]}…)")
        self._plan()
        self.autocast = contextlib.nullcontext
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            self.autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
        kwargs = dict(tokenizer=self.tokenizer, valid_fraction=c.valid_fraction, text_column=c.text_column)
        if self.env.is_main:  # rank 0 tokenises into the cache, the others read it
            self.data = prepare_data(c.data, **kwargs)
        self.env.barrier()  # also: every rank has checked --out before rank 0 clears it
        if not self.env.is_main:
            self.data = prepare_data(c.data, **kwargs)
        self.batches = GlobalBatches(self.data, seq_len=c.seq_len, batch_size=c.batch_size, grad_accum=1,
                                     seed=c.seed, rank=self.env.rank, world_size=self.env.world_size,
                                     packing=c.packing)
        self.global_batch = self.batches.global_batch
        if self.checkpoint is None and self.out.exists() and self.env.is_main:  # --overwrite: the old directory
            shutil.rmtree(self.out)  # goes, all being checked
        self.ranking, self.replaced, self.align_init = None, None, None
        self.nonfinite = NonFiniteFlag(self.device)
        ckpt = self.checkpoint
        if ckpt is None or ckpt.extra["distill"]["stage"] == "align":
            self.stage, self.stage_step = "align", 0
            self.model = HybridLM(self.align_config).to(self.device)
            self.notes = [init_student(self.model, self.teacher.model, self.align_layers)]
            if c.decay_init == "attention" and ckpt is None:
                self.notes[0]["decay"] = self._fit_decays()
            self._start_align()
        else:
            record = ckpt.extra["distill"]
            self.stage = "distill"
            self.ranking, self.replaced = record.get("ranking"), record["replaced"]
            self.model = HybridLM(checkpoint_config(ckpt)).to(self.device)
            self._start_distill()
        if ckpt is not None:
            self._restore(ckpt)
        self._broadcast_model()

    def _fit_decays(self) -> dict:
        """Each new R layer's decay from the mean attention distance of the layer it replaces
        (``decay_from_attention``), on the first global batch's worth (``batch_size × world_size``) of windows of
        the training stream, every rank all of them (read directly: the data order is untouched)."""
        c = self.config
        rows = min(self.global_batch, max(1, len(self.data.train) // c.seq_len))
        stream = np.asarray(self.data.train[:rows * c.seq_len]).astype(np.int64)
        ids = torch.from_numpy(stream).reshape(rows, c.seq_len).to(self.device)
        captured = capture_mixer_io(self.teacher.model, self.align_layers, ids, None)
        return {i: [round(g, 4) for g in decay_from_attention(self.teacher.model.blocks[i].mixer,
                                                               self.model.blocks[i].mixer, captured[i][0]).tolist()]
                for i in self.align_layers}

    def _trainable(self, modules: nn.Module) -> None:
        """Only ``modules``' parameters train: every other parameter of the model is frozen."""
        self.model.requires_grad_(False)
        modules.requires_grad_(True)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]

    def _start_align(self) -> None:
        c = self.config
        self.mixers = {i: self.model.blocks[i].mixer for i in self.align_layers}
        group = nn.ModuleDict({str(i): m for i, m in self.mixers.items()})
        self._trainable(group)
        self.optimizer = build_optimizer(group, lr=c.align_lr, weight_decay=c.weight_decay, betas=c.betas)
        self.scheduler = warmup_cosine(self.optimizer, warmup=c.align_warmup_steps, total=max(c.align_steps, 1),
                                       min_lr_ratio=c.min_lr_ratio)

    def _start_distill(self) -> None:
        c = self.config
        if c.train == "all":
            group = self.model
        else:
            group = nn.ModuleDict({str(i): self.model.blocks[i].mixer for i in self.replaced})
        self._trainable(group)
        self.optimizer = build_optimizer(group, lr=c.lr, weight_decay=c.weight_decay, betas=c.betas)
        self.scheduler = warmup_cosine(self.optimizer, warmup=c.warmup_steps, total=max(c.steps, 1),
                                       min_lr_ratio=c.min_lr_ratio)

    def _restore(self, ckpt: Checkpoint) -> None:
        record = ckpt.extra["distill"]
        try:
            self.model.load_state_dict(ckpt.model_state)
            self.optimizer.load_state_dict(ckpt.optimizer_state)
            self.scheduler.load_state_dict(ckpt.scheduler_state)
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            problem = f"does not fit this run ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            raise CheckpointError(ckpt.path, problem) from None
        if self.stage == "distill":  # --steps on resume is the new total
            self.scheduler.set_total(max(self.config.steps, 1))
        self.batches.load_state_dict(ckpt.data_state)
        restore_rng_state(ckpt.rng_state)
        self.step, self.stage_step = ckpt.step, record["stage_step"]
        self.align_init = record.get("align_mse_init")
        self.last_saved = (ckpt.step, ckpt.path)

    # ------------------------------------------------------------------------------------------ batches

    def _to_device(self, x, y, cu):
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x, y, None if cu is None else cu.to(self.device, non_blocking=True)

    def _valid(self, max_batches: int | None):
        """Validation batches ``(x, y, cu_seqlens)`` on the device, packed as training packs them: global batches of
        ``batch_size × world_size`` sequences (``max_batches`` of them), this rank's rows of each (as training
        splits them). Under torchrun a rank whose share of a (short, last) batch is empty gets None for it."""
        c = self.config
        lo, hi = self.env.rank * c.batch_size, (self.env.rank + 1) * c.batch_size
        for x, y in self.data.valid_batches(c.seq_len, self.global_batch, max_batches=max_batches):
            if self.env.distributed:
                x, y = x[lo:hi], y[lo:hi]
                if not len(x):
                    yield None
                    continue
            cu = None
            if c.packing == "documents":
                x, y, cu = pack_documents(x, y, self.tokenizer.eos_id)
            yield self._to_device(x, y, cu)

    def _sum_over_ranks(self, *values: float) -> list[float]:
        """``values`` summed over the ranks (float64; as they are on one process)."""
        return sum_over_ranks(self.env, values, self.device)

    def _broadcast_model(self) -> None:
        broadcast_weights(self.env, self.model)

    # ------------------------------------------------------------------------------------------ steps

    def _clip_and_step(self, loss: torch.Tensor):
        c = self.config
        loss.backward()
        average_gradients(self.env, self.trainable)
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, c.grad_clip) if c.grad_clip is not None else None
        bad = ~torch.isfinite(loss.detach())
        if norm is not None:
            bad = bad | ~torch.isfinite(norm)
        self.nonfinite.record(bad, self.step + 1)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, lr

    def _align_step(self):
        x, _, cu = self._to_device(*self.batches.next_step()[0])
        with self.autocast():
            captured = capture_mixer_io(self.teacher.model, self.align_layers, x, cu)
            losses = alignment_losses(self.mixers, captured, cu)
        loss = sum(losses.values())
        norm, lr = self._clip_and_step(loss)
        return loss.detach(), {f"mse_layer{i}": v.detach() for i, v in losses.items()}, norm, lr

    def _distill_step(self):
        c = self.config
        x, y, cu = self._to_device(*self.batches.next_step()[0])
        with self.autocast():
            with torch.no_grad():
                teacher_logits, _ = self.teacher.model(x, cu_seqlens=cu, output_final_state=False)
            logits, _ = self.model(x, cu_seqlens=cu, output_final_state=False)
        loss, parts = distill_loss(logits, teacher_logits, y, temperature=c.temperature, ce_weight=c.ce_weight)
        norm, lr = self._clip_and_step(loss)
        parts = {k: v for k, v in parts.items() if v is not None}
        return loss.detach(), parts, norm, lr

    # ------------------------------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def align_eval(self) -> dict:
        """Per-layer validation MSE (and MSE over the teacher output's mean square) of the R layers: the mean over
        the validation batches of each batch's MSE (under torchrun, each global batch's, from its ranks' shares)."""
        if self.env.distributed:
            return self._align_eval_ranks()
        sums = {i: [0.0, 0.0] for i in self.align_layers}
        n = 0
        for x, _, cu in self._valid(self.config.eval_batches):
            with self.autocast():
                captured = capture_mixer_io(self.teacher.model, self.align_layers, x, cu)
                losses = alignment_losses(self.mixers, captured, cu)
            for i, v in losses.items():
                sums[i][0] += v.item()
                sums[i][1] += captured[i][1].float().pow(2).mean().item()
            n += 1
        return self._align_figures(sums, n)

    def _align_eval_ranks(self) -> dict:
        """``align_eval`` under torchrun: per global batch and layer, the ranks' squared-error and squared-output
        sums and element counts, summed over the ranks in one all-reduce, then as on one process."""
        rows = []  # per global batch: [sse_l, power_l, elements_l for each layer]
        for batch in self._valid(self.config.eval_batches):
            row = [0.0] * (3 * len(self.align_layers))
            if batch is not None:
                x, _, cu = batch
                with self.autocast():
                    captured = capture_mixer_io(self.teacher.model, self.align_layers, x, cu)
                    losses = alignment_losses(self.mixers, captured, cu)
                for j, i in enumerate(self.align_layers):
                    y = captured[i][1]
                    row[3 * j:3 * j + 3] = [losses[i].item() * y.numel(), y.float().pow(2).sum().item(), y.numel()]
            rows.append(row)
        shape = (len(rows), len(self.align_layers), 3)
        table = self.env.all_reduce(torch.tensor(rows, dtype=torch.float64, device=self.device).reshape(shape))
        sums = {i: [0.0, 0.0] for i in self.align_layers}
        for per_layer in table.tolist():
            for i, (sse, power, count) in zip(self.align_layers, per_layer):
                sums[i][0] += sse / max(count, 1)
                sums[i][1] += power / max(count, 1)
        return self._align_figures(sums, len(rows))

    def _align_figures(self, sums: dict, n: int) -> dict:
        out = {}
        for i, (mse, power) in sums.items():
            out[f"val_mse_layer{i}"] = mse / max(n, 1)
            out[f"val_rel_mse_layer{i}"] = mse / max(power, 1e-30)
        return out

    @torch.no_grad()
    def _teacher_eval(self) -> dict:
        total, count = 0.0, 0
        for batch in self._valid(self.config.eval_batches):
            if batch is None:
                continue
            x, y, cu = batch
            with self.autocast():
                logits, _ = self.teacher.model(x, cu_seqlens=cu, output_final_state=False)
            total += F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
        total, count = self._sum_over_ranks(total, count)
        mean = total / max(count, 1)
        return {"teacher_val_loss": mean, "teacher_val_bpb": self.data.bpb(mean)}

    @torch.no_grad()
    def student_eval(self) -> dict:
        """The student's validation loss, bits per byte and KL to the teacher (per token, τ = 1)."""
        was = self.model.training
        self.model.eval()
        ce, kl, count = 0.0, 0.0, 0
        try:
            for batch in self._valid(self.config.eval_batches):
                if batch is None:
                    continue
                x, y, cu = batch
                with self.autocast():
                    teacher_logits, _ = self.teacher.model(x, cu_seqlens=cu, output_final_state=False)
                    logits, _ = self.model(x, cu_seqlens=cu, output_final_state=False)
                ce += F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="sum").item()
                kl += token_kl(logits, teacher_logits).double().sum().item()
                count += y.numel()
        finally:
            self.model.train(was)
        ce, kl, count = self._sum_over_ranks(ce, kl, count)
        mean = ce / max(count, 1)
        return {"val_loss": mean, "val_bpb": self.data.bpb(mean), "val_kl": kl / max(count, 1),
                "val_tokens": int(count)}

    # ------------------------------------------------------------------------------------------ health, saving

    def _check_health(self, *, weights: bool) -> None:
        """FloatingPointError (on every rank alike: the ranks' flags are combined) if a step so far had a
        non-finite loss or gradient norm, or (``weights``) a trainable weight is not finite."""
        flags = [self.nonfinite.first] + ([nonfinite_weights(self.trainable)] if weights else [])
        first_bad, bad_weights = (self.env.all_reduce(torch.stack(flags), op=dist.ReduceOp.MAX).tolist() + [0.0])[:2]
        if first_bad:
            raise FloatingPointError(self._diverged(f"the loss or gradient norm was not finite at step "
                                                    f"{int(first_bad)}"))
        if bad_weights:
            raise FloatingPointError(self._diverged(f"the weights are not finite after step {self.step}"))

    def _diverged(self, what: str) -> str:
        lr = "--align-lr" if self.stage == "align" else "--lr"
        if self.last_saved is None:
            where = f"no checkpoint was written; start again with a lower {lr}"
        else:
            step, path = self.last_saved
            where = (f"the last good checkpoint is {path} (step {step}); it cannot be resumed with another learning "
                     f"rate: start again with a lower {lr} (--overwrite)")
        return f"distillation diverged: {what}; {where}"

    def _save(self) -> None:
        c = self.config
        self._check_health(weights=True)
        record = {"config": c.to_dict(), "stage": self.stage, "stage_step": self.stage_step,
                  "teacher": {"path": str(self.teacher.path), "sha256": self.teacher.sha256},
                  "layer_types": self.model.config.layer_types, "align_layers": self.align_layers,
                  "replaced": self.replaced, "ranking": self.ranking, "align_mse_init": self.align_init,
                  "world_size": self.env.world_size}
        extra = {"tokenizer": self.tokenizer.to_dict(), "distill": record,
                 "data_stats": {k: v for k, v in self.data.stats.items() if isinstance(v, (int, str, bool))}}
        if self.env.is_main:  # every rank holds the same weights and state: rank 0 writes them
            save_checkpoint(self.out, model_state=self.model.state_dict(), config=self.model.config.to_dict(),
                            optimizer_state=self.optimizer.state_dict(), scheduler_state=self.scheduler.state_dict(),
                            rng_state=capture_rng_state(), data_state=self.batches.state_dict(), step=self.step,
                            extra=extra, keep=c.keep)
        self.env.barrier()
        self.last_saved = (self.step, self.out / "checkpoint")
        self.console.say(f"step {self.step:>6}  checkpoint saved to {self.out / 'checkpoint'}", level=2)

    def _record(self, record: dict) -> None:
        """Every rank keeps ``record`` (its figures are the ranks' combined ones); rank 0 writes it and calls
        ``on_log``."""
        self.history.append(record)
        if self.env.is_main:
            self.metrics.log(**record)
            self.tracker.log(record)
            if self.on_log:
                self.on_log(record)

    # ------------------------------------------------------------------------------------------ run

    def fit(self) -> DistillResult:
        self.metrics, self.tracker = None, None
        finished = False
        try:
            result = self._fit()
            finished = True
            return result
        finally:
            self.console.close_bar()
            if self.metrics is not None:
                self.metrics.close()
            if self.tracker is not None:
                self.tracker.close()
            self.env.close(finished=finished)

    def _fit(self) -> DistillResult:
        self._setup()
        c = self.config
        resumed = self.checkpoint is not None
        self.history = []
        if self.env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.metrics = MetricsLogger(self.out, resume_step=self.step if resumed else None)
            self.tracker = open_trackers(c.log, self.out, c.to_dict(), resume_step=self.step if resumed else None)
            (self.out / CONFIG_FILE).write_text(json.dumps(c.to_dict(), indent=2) + "\n")
        self._announce(resumed)
        if self.console.verbose:
            self.console.open_bar(total=c.total_steps, initial=self.step, desc="hybrid-distill")
        if self.stage == "align":
            if not resumed and self.align_layers:
                self.align_init = self.align_eval()
                self._record({"step": 0, "stage": "align", **self.align_init})
            self._loop("align", c.align_steps, self._align_step)
            self._select_and_build()
        teacher = self._teacher_figures = self._teacher_eval()
        if self.stage_step == 0:
            self._record({"step": self.step, "stage": "distill", **teacher})
        self.last_eval = None
        self._loop("distill", c.steps, self._distill_step)
        final = self.last_eval
        if final is None:  # no stage-2 step ran (--steps 0, or a finished run resumed)
            final = self.student_eval()
            self._record({"step": self.step, "stage": "distill", **final})
        if self.last_saved is None or self.last_saved[0] != self.step or self.stage_step == 0:
            self._save()
        self.console.close_bar()
        summary = {}
        if self.env.is_main:  # the summary reads the metrics file, which rank 0 alone writes
            self._plot()
            summary = self._summary(teacher, final)
            (self.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
            self.console.say(self._layout(summary))
        return DistillResult(step=self.step, out=self.out, layer_types=self.model.config.layer_types,
                             replaced=list(self.replaced), val_loss=final["val_loss"], val_bpb=final["val_bpb"],
                             val_kl=final["val_kl"], teacher_val_bpb=teacher["teacher_val_bpb"], ranking=self.ranking,
                             history=self.history, summary=summary)

    def _loop(self, stage: str, total: int, step_fn) -> None:
        c = self.config
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        part_sums: dict[str, torch.Tensor] = {}
        n, seconds = 0, 0.0
        while self.stage_step < total:
            t0, postfix = time.perf_counter(), {}
            loss, parts, norm, lr = step_fn()
            self.step += 1
            self.stage_step += 1
            n += 1
            loss_sum += loss.double()
            for k, v in parts.items():
                part_sums[k] = part_sums.get(k, 0.0) + v.double()
            last = self.stage_step == total
            if self.step % c.log_every == 0 or last:
                self._check_health(weights=False)
                sums = {"loss": loss_sum, **part_sums}
                if self.env.distributed:  # the mean over the ranks
                    reduced = self.env.all_reduce(torch.stack(list(sums.values()))) / self.env.world_size
                    sums = dict(zip(sums, reduced))
                seconds += time.perf_counter() - t0
                record = {"step": self.step, "stage": stage, "loss": (sums.pop("loss") / n).item(), "lr": lr,
                          "tokens_per_s": n * self.global_batch * c.seq_len / max(seconds, 1e-9),
                          **{k: (v / n).item() for k, v in sums.items()}}
                if norm is not None:
                    record["grad_norm"] = float(norm)
                self._record(record)
                if self.console.bar is not None:
                    postfix = dict(stage=stage, loss=f"{record['loss']:.4f}")
                else:
                    self.console.say(f"step {self.step:>6}  {stage:<7}  loss {record['loss']:.5f}  lr {lr:.2e}  "
                                     f"{record['tokens_per_s']:,.0f} tok/s", level=2)
                loss_sum.zero_()
                part_sums, n, seconds = {}, 0, 0.0
            else:
                seconds += time.perf_counter() - t0
            self.console.advance(**postfix)
            if (c.eval_every and self.step % c.eval_every == 0) or last:
                self._check_health(weights=True)
                figures = self.align_eval() if stage == "align" else self.student_eval()
                if stage == "distill":
                    self.last_eval = figures
                self._record({"step": self.step, "stage": stage, **figures})
                if self.env.is_main:
                    self._plot()
                shown = "  ".join(f"{k} {v:.4g}" for k, v in figures.items()
                                  if k.startswith(("val_rel", "val_bpb", "val_kl")))
                self.console.say(f"step {self.step:>6}  {stage:<7}  {shown}")
            if (c.save_every and self.step % c.save_every == 0) or last:
                self._save()

    def _select_and_build(self) -> None:
        """After stage 1: rank the layers (auto:K), build the student, start stage 2."""
        c = self.config
        kept = []
        if self.k is not None:
            shares = list(self._valid(c.select_batches))
            batches = [(b[0], b[2]) for b in shares if b is not None]
            costs = replacement_costs(self.teacher.model, self.mixers, batches,
                                      reduce=self.env.all_reduce if self.env.distributed else None)
            if self.env.distributed:  # every rank has the same sums; rank 0's costs make certain of one student
                shared = torch.tensor([costs[i] for i in self.align_layers], dtype=torch.float64, device=self.device)
                dist.broadcast(shared, src=0)
                costs = dict(zip(self.align_layers, shared.tolist()))
            self.ranking = keep_most_costly(costs, self.k)
            kept = [r["layer"] for r in self.ranking if r["kept"]]
            letters = self.teacher.config.layer_types
            types = "".join("A" if i in kept or x != "A" else "R" for i, x in enumerate(letters))
            rows = (f"  {r['rank']:>2}. layer {r['layer']:>3}  KL {r['kl']:.5f}  "
                    f"{'kept as attention' if r['kept'] else 'replaced by R'}" for r in self.ranking)
            self.console.say("layer ranking (KL of the teacher with only that layer replaced, nats/token):\n"
                             + "\n".join(rows))
            if self.env.is_main:
                (self.out / RANKING_FILE).write_text(json.dumps(
                    {"teacher": str(self.teacher.path), "k": self.k, "layer_types": types,
                     "metric": "mean per-token KL(teacher || teacher with only this layer replaced by its stage-1 R "
                               f"layer), nats, over {len(shares)} validation batches",
                     "ranking": self.ranking}, indent=2) + "\n")
            config = student_config(self.teacher.config, types, c.model, str(self.teacher.path))
            student = HybridLM(config).to(self.device)
            self.replaced = [i for i in self.align_layers if i not in kept]
            copy_matching(student, {k: v for k, v in self.teacher.model.state_dict().items()  # kept attention too
                                    if not any(k.startswith(f"blocks.{i}.mixer.") for i in self.replaced)})
            for i in self.replaced:
                student.blocks[i].mixer.load_state_dict(self.model.blocks[i].mixer.state_dict())
            self.model = student
        else:
            self.replaced = list(self.align_layers)
        self.stage, self.stage_step = "distill", 0
        self._start_distill()
        self._broadcast_model()

    # ------------------------------------------------------------------------------------------ reporting

    def _announce(self, resumed: bool) -> None:
        c, s = self.config, self.data.stats
        mode = f"pattern {c.pattern}" if c.pattern is not None else f"keep-attention {c.keep_attention}"
        what = f"resuming at step {self.step} ({self.stage})" if resumed else "distilling"
        say = self.console.say
        say(f"{what}: teacher {self.teacher.path} (layers {self.teacher.config.layer_types}, "
            f"{self.teacher.model.num_parameters():,} parameters) -> {mode}, window "
            f"{self.align_config.window or 'global'}\n"
            f"data: {s['source']}: {s['train_tokens']:,} train / {s['valid_tokens']:,} valid tokens "
            f"({s['tokenizer']})\n"
            f"stage 1 (align {len(self.align_layers)} R layers): {c.align_steps} steps, lr {c.align_lr:g}; "
            f"stage 2 (KL, τ={c.temperature:g}, ce_weight {c.ce_weight:g}, train {c.train}): {c.steps} steps, "
            f"lr {c.lr:g}; {self._per_step()} (packing {c.packing})")
        if resumed and self.checkpoint.extra["distill"]["config"]["batch_size"] != c.batch_size:
            say(f"note: batch layout: batch_size {c.batch_size} × {self.env.world_size} rank(s) keeps the run's "
                f"global batch of {self.global_batch}")
        for note in getattr(self, "notes", []):
            say(f"note: copied {note['copied']} teacher tensors; R layers {note['mapped_layers']} from the "
                f"attention they replace (V, O)")
            if "decay" in note:
                per_layer = (f"layer {i}: {', '.join(f'{g:.3f}' for g in gs)}" for i, gs in note["decay"].items())
                say("note: decay γ per head from the attention's mean distance: " + "; ".join(per_layer))

    def _per_step(self) -> str:
        c, ws = self.config, self.env.world_size
        if not self.env.distributed:
            return f"{c.batch_size} × {c.seq_len} tokens per step"
        return (f"{self.global_batch} × {c.seq_len} tokens per step (batch_size {c.batch_size} × {ws} ranks, "
                f"gradients averaged across the ranks)")

    def _plot(self) -> None:
        teacher = getattr(self, "_teacher_figures", None)
        plot_stages(self.out / METRICS_FILE, self.out / PLOT_FILE,
                    teacher_val_loss=teacher["teacher_val_loss"] if teacher else None)

    def _summary(self, teacher: dict, final: dict) -> dict:
        c = self.config
        records = read_metrics(self.out / METRICS_FILE)
        speeds = {stage: [r["tokens_per_s"] for r in records if r.get("stage") == stage and "tokens_per_s" in r]
                  for stage in ("align", "distill")}
        align_final = next((r for r in reversed(records) if r.get("stage") == "align"
                            and any(k.startswith("val_mse") for k in r)), None)
        tokens = self.global_batch * c.seq_len
        return {
            "teacher": str(self.teacher.path), "teacher_layer_types": self.teacher.config.layer_types,
            "layer_types": self.model.config.layer_types, "replaced": self.replaced,
            "window": self.model.config.attention.window, "ranking": self.ranking, **teacher, **final,
            "tokens": {"align": c.align_steps * tokens, "distill": c.steps * tokens, "total": c.total_steps * tokens},
            "tokens_per_s": {k: statistics.median(v) if v else None for k, v in speeds.items()},
            "align_mse_init": self.align_init,
            "align_mse_final": None if align_final is None else {k: v for k, v in align_final.items()
                                                                   if k.startswith("val_")},
        }

    def _layout(self, s: dict) -> str:
        return (f"done at step {self.step}: student {s['layer_types']} (R at {s['replaced']}, window {s['window']}): "
                f"val_bpb {s['val_bpb']:.4f} (teacher {s['teacher_val_bpb']:.4f}), KL to the teacher "
                f"{s['val_kl']:.4f} nats/token\n"
                f"run directory {self.out}/\n"
                f"  checkpoint/          the student (hybrid-generate, hybrid-export, load_run open it); resumable\n"
                f"  {METRICS_FILE:<20} stage 1 and stage 2 records (JSON lines)\n"
                f"  {PLOT_FILE:<20} both stages' curves\n"
                + (f"  {RANKING_FILE:<20} the layer ranking\n" if self.ranking else "")
                + f"  {SUMMARY_FILE:<20} the summary; {CONFIG_FILE}: the run's options")
