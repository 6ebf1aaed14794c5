"""The distillation run: the teacher, the plan, the two stages on the one loop, the layer selection between them,
exact resume (the stages: ``stages``; what it prints and writes: ``report``; the teacher: ``teacher``).

    result = Distiller(DistillConfig(teacher="runs/tf", pattern="RRA", model={"window": 64}, out="runs/rra")).fit()
    result = Distiller.from_checkpoint("runs/rra", steps=400).fit()          # continue; --steps is the new total

One process, or ``torchrun`` (``torchrun --nproc-per-node N -m hybrid.train.cli.distill …``), as ``hybrid-train``:
``batch_size`` is per rank and one step reads the global batch ``G = batch_size × grad_accum × ranks``
(``hybrid.train.parallel.sharding``); what trains is wrapped in DDP, or sharded by FSDP2 with ``fsdp``. Global step
``k`` counts the stage-1 steps, then the stage-2 steps; the data order continues across the stages, so the run's
distillation tokens are ``(align_steps + steps) × G × seq_len``. Every rank loads the frozen teacher and builds the
same student (rank 0's layer ranking is broadcast); rank 0 alone writes ``OUT/`` and prints.

- Stage 1 trains the R mixers only (every other weight frozen) on ``alignment_losses``; in ``auto:K`` mode every
  attention layer of the teacher gets an R layer here (the stage-1 model is the teacher with all of them
  replaced), then ``replacement_costs`` ranks them and the student keeps the K most costly as attention.
- Stage 2 trains the student (``train="all"``) or the replaced layers' mixers (``"new"``) on ``distill_loss``.

Checkpoints hold the current model (in stage 1 the stage-1 model, after it the student: a ``HybridLM`` with its own
``HybridConfig``), the optimizer and schedule of the current stage, the data position, the RNG and the stage record
(``extra["distill"]``); ``extra["tokenizer"]`` is the teacher's, so ``load_run``, ``hybrid-generate``,
``hybrid-export`` and the benchmark's evaluation open the run directory like any other. Divergence is the loop's
(``on_nonfinite``); the last good checkpoint stays.
"""
from __future__ import annotations

import gc
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hybrid.models import CompiledBlocks, HybridLM

from ..data import prepare_data
from ..data.tokenizer import tokenizer_from_dict
from ..loop.checkpoint import CheckpointError, load_checkpoint
from ..loop.divergence import DivergenceGuard
from ..loop.init_from import copy_matching
from ..loop.loop import Cadence, TrainingLoop
from ..loop.optim import build_optimizer
from ..loop.parts import Record, RNGPart
from ..output.records import RunLog
from ..loop.resume import resume_config
from ..loop.run import Run, join, on_rank0_first, precision, seed_everything
from ..loop.run_dir import check_resumed_run_dir
from ..loop.saved_model import checkpoint_config
from ..loop.schedule import warmup_cosine
from ..output.metrics import METRICS_FILE
from ..output.outdir import check_output_dir, clear_dir
from ..output.paths import data_input
from ..parallel.device import env_int
from ..parallel.distributed import model_state_everywhere, wrap_model
from ..parallel.sharding import GlobalBatches
from .config import DistillConfig
from .losses import capture_mixer_io
from .mapping import decay_from_attention, init_student, layer_types_for_pattern, student_config
from .plot import plot_stages
from .report import (CONFIG_FILE, PLOT_FILE, RANKING_FILE, SUMMARY_FILE, announce, layout, ranking_lines, summary,
                     write_ranking)
from .select import keep_most_costly, parse_keep_attention, replacement_costs
from .stages import AlignStage, StudentStage, Validation
from .teacher import load_teacher

__all__ = ["Distiller", "DistillResult", "PLOT_FILE", "RANKING_FILE", "SUMMARY_FILE", "CONFIG_FILE"]


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


class Distiller(Run):
    """One distillation run (fresh, or resumed with ``from_checkpoint``); ``fit()`` runs it. ``Distiller(config,
    overwrite=False, verbose=1, progress=None, on_log=None, on_eval=None)`` (``hybrid.train.loop.run.Run``)."""

    Config = DistillConfig

    @classmethod
    def from_checkpoint(cls, run_dir, *, world_size: int | None = None, distiller_kwargs: dict | None = None,
                        **overrides) -> "Distiller":
        """Continue the run in ``run_dir``: its saved DistillConfig with ``overrides`` (``steps``: the new total of
        stage 2; what defines the run, ``DistillConfig.FIXED``, may not change). The global batch is kept where a
        batch layout on ``world_size`` ranks gives it (``hybrid.train.loop.resume``); ``teacher`` may name where the
        teacher is now, if it moved (its weights must be the ones the run started from)."""
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
        done = record["stage_step"] if record["stage"] == "distill" else 0
        if overrides.get("steps") is not None and overrides["steps"] < done:
            raise ValueError(f"steps: expected the new total of stage 2, at least the {done} steps done, got "
                             f"{overrides['steps']}")
        overrides["teacher"] = overrides.get("teacher") or record["teacher"]["path"]
        run_dir = check_resumed_run_dir(ckpt.path, kind="hybrid-distill", record=CONFIG_FILE,
                                        names=(PLOT_FILE, RANKING_FILE, SUMMARY_FILE),
                                        reads_record=lambda text: DistillConfig.from_dict(json.loads(text)))
        config, notes = resume_config(saved, saved_global_batch=global_batch, world_size=world, out=str(run_dir),
                                      **overrides)
        return cls(config, _checkpoint=ckpt, _notes=tuple(notes), **(distiller_kwargs or {}))

    step = property(lambda self: self.loop.step if self.loop is not None else 0)
    model = property(lambda self: self.stage.model if self.stage is not None else None)

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
            if not self.align_layers:  # nothing to distil: refused before anything is written
                raise ValueError(f"--pattern: expected an R at one of the teacher's attention layers {self.candidates} "
                                 f"(a layer to replace), got {c.pattern!r}, which gives {types!r} on the teacher's "
                                 f"layers {letters!r}: no layer would be replaced")
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

    def _load_teacher(self) -> None:
        self.teacher = load_teacher(self.config.teacher, self.device)
        if self.checkpoint is not None:
            recorded = self.checkpoint.extra["distill"]["teacher"]
            if recorded["sha256"] != self.teacher.sha256:
                raise ValueError(f"--teacher: expected the teacher this run started from, got {self.teacher.path}, "
                                 f"whose weights changed since (sha256 {self.teacher.sha256[:12]}…, recorded "
                                 f"{recorded['sha256'][:12]}…)")

    def _setup(self) -> None:
        c = self.config
        self.device, self.env = join(c.device)
        self.console.is_main = self.env.is_main
        inputs = [("--teacher", c.teacher), ("--data", data_input(c.data))]
        self.take_out_dir(command="hybrid-distill", inputs=inputs, what="--out")  # one writer, never into an input
        if self.checkpoint is None:  # refuse a used --out before anything slow (and before clearing it)
            check_output_dir(self.out, overwrite=self.overwrite, what="--out", inputs=inputs)
        seed_everything(c.seed)
        self._load_teacher()
        self._plan()
        self.autocast, _ = precision(self.device)
        self.data = on_rank0_first(self.env, lambda: prepare_data(  # also: every rank has checked --out
            c.data, tokenizer=self.tokenizer, valid_fraction=c.valid_fraction, text_column=c.text_column,
            skip_rows_without_text=c.skip_rows_without_text))
        self.batches = GlobalBatches(self.data, seq_len=c.seq_len, batch_size=c.batch_size, grad_accum=c.grad_accum,
                                     seed=c.seed, rank=self.env.rank, world_size=self.env.world_size,
                                     packing=c.packing)
        self.global_batch = self.batches.global_batch
        self.validation = Validation(self.data, seq_len=c.seq_len, global_batch=self.global_batch,
                                     packing=c.packing, eos_id=self.tokenizer.eos_id, env=self.env, device=self.device)
        if self.checkpoint is None and self.out.exists() and self.env.is_main:  # --overwrite: the old directory
            clear_dir(self.out)  # goes, all being checked (the lock stays: this run holds it)
        record = self.checkpoint.extra["distill"] if self.checkpoint is not None else {"stage": "align"}
        self.ranking, self.replaced = record.get("ranking"), record.get("replaced")
        self.align_init = record.get("align_mse_init")
        self.wrap = ("FSDP2" if c.fsdp else "DDP") if self.env.distributed else "single process"
        self.loop = TrainingLoop(self.out, Cadence(c.log_every, c.eval_every, c.save_every, c.keep),
                                 grad_clip=c.grad_clip, divergence=self._divergence(), env=self.env,
                                 device=self.device, console=self.console, parts=self._parts(),
                                 model_config=lambda: self.stage.model.config.to_dict(), after_eval=self._plot,
                                 after_save=self._write_config)
        if record["stage"] == "align":
            self.stage = self._align_stage()
        else:
            self.stage = self._student_stage(HybridLM(checkpoint_config(self.checkpoint)).to(self.device))
        if self.checkpoint is not None:
            self.loop.restore(self.checkpoint, self.stage)
            self.stage.done = record["stage_step"]
            if self.stage.name == "distill":  # --steps on resume is the new total
                self.stage.scheduler.set_total(max(c.steps, 1))

    def _divergence(self) -> DivergenceGuard:
        def advice(step: int, path: Path) -> str:
            return (f"the last good checkpoint is {path} (step {step}); it cannot be resumed with another learning "
                    f"rate: start again with a lower {self._lr_flag()} (--overwrite)")

        return DivergenceGuard(self.config.on_nonfinite, device=self.device, env=self.env, out=self.out,
                               lr=self.config.lr, float16=False, run="distillation", advice=advice,
                               restart=lambda: f"start again with a lower {self._lr_flag()}")

    def _lr_flag(self) -> str:
        return "--align-lr" if self.stage is None or self.stage.name == "align" else "--lr"

    def _parts(self) -> dict:
        """The run's checkpoint parts beside the stage's: the data position, the RNG, the stage record."""
        stats = {k: v for k, v in self.data.stats.items() if isinstance(v, (int, str, bool))}
        return {"data": self.batches, "rng": RNGPart(), "tokenizer": Record(self.tokenizer.to_dict()),
                "distill": Record(self._record), "data_stats": Record(stats)}

    def _record(self) -> dict:
        """What the checkpoint says of the run: its config, its stage and how far into it, the teacher, the layers."""
        return {"config": self.config.to_dict(), "stage": self.stage.name, "stage_step": self.stage.done,
                "teacher": {"path": str(self.teacher.path), "sha256": self.teacher.sha256},
                "layer_types": self.stage.model.config.layer_types, "align_layers": self.align_layers,
                "replaced": self.replaced, "ranking": self.ranking, "align_mse_init": self.align_init,
                "world_size": self.env.world_size}

    def _train(self, stage, model: HybridLM, wrapped: nn.Module, trainable: nn.Module, *, lr: float, warmup: int,
               steps: int, units=None):
        """``stage`` training ``trainable`` (every other weight of ``model`` frozen) through ``wrapped`` (in DDP or
        FSDP2 under torchrun), with AdamW and a warmup-cosine over ``steps`` (at least one)."""
        c = self.config
        model.requires_grad_(False)
        trainable.requires_grad_(True)
        train_model = wrap_model(wrapped, self.env, fsdp=c.fsdp, device=self.device, units=units)
        optimizer = build_optimizer(trainable, lr=lr, weight_decay=c.weight_decay, betas=c.betas)
        scheduler = warmup_cosine(optimizer, warmup=warmup, total=max(steps, 1), min_lr_ratio=c.min_lr_ratio)
        if c.compile:  # the student's blocks one by one (CompiledBlocks); the alignment module whole
            train_model = CompiledBlocks(model, train_model) if wrapped is model else torch.compile(train_model)
        stage.train_on(model, train_model, optimizer, scheduler)
        return stage

    def _stage_kwargs(self, steps: int, traced_whole: bool) -> dict:
        """``traced_whole``: the stage's module is compiled whole (its packed offsets then go as the tensor alone)."""
        c = self.config
        return dict(teacher=self.teacher, batches=self.batches, validation=self.validation, steps=steps,
                    eval_batches=c.eval_batches, autocast=self.autocast, device=self.device, seq_len=c.seq_len,
                    compiled=traced_whole)

    def _align_stage(self) -> AlignStage:
        """Stage 1's model (the teacher with an R layer at every layer to align), its R layers initialised from the
        attention they replace (and their decays fitted to it), training the R mixers only."""
        c = self.config
        model = HybridLM(self.align_config).to(self.device)
        note = init_student(model, self.teacher.model, self.align_layers)
        if c.decay_init == "attention" and self.checkpoint is None:
            note["decay"] = self._fit_decays(model)
        self.notes.append(note)
        stage = AlignStage(model=model, layers=self.align_layers,
                           **self._stage_kwargs(c.align_steps, traced_whole=c.compile))
        alignment = stage.alignment
        return self._train(stage, model, alignment, alignment.mixers, lr=c.align_lr, warmup=c.align_warmup_steps,
                           steps=c.align_steps, units=list(alignment.mixers.values()))

    def _student_stage(self, student: HybridLM) -> StudentStage:
        """Stage 2: the student trained whole (``train="all"``) or only its replaced layers' mixers (``"new"``)."""
        c = self.config
        stage = StudentStage(temperature=c.temperature, ce_weight=c.ce_weight,
                             **self._stage_kwargs(c.steps, traced_whole=False))
        trainable = student if c.train == "all" else nn.ModuleDict(
            {str(i): student.blocks[i].mixer for i in self.replaced})
        return self._train(stage, student, student, trainable, lr=c.lr, warmup=c.warmup_steps, steps=c.steps)

    def _fit_decays(self, model: HybridLM) -> dict:
        """Each new R layer's decay from the mean attention distance of the layer it replaces
        (``decay_from_attention``), on the first global batch's worth of windows of the training stream, every rank
        all of them (read directly: the data order is untouched)."""
        c = self.config
        rows = min(self.global_batch, max(1, len(self.data.train) // c.seq_len))
        stream = np.asarray(self.data.train[:rows * c.seq_len]).astype(np.int64)
        ids = torch.from_numpy(stream).reshape(rows, c.seq_len).to(self.device)
        captured = capture_mixer_io(self.teacher.model, self.align_layers, ids, None)
        return {i: [round(g, 4) for g in decay_from_attention(self.teacher.model.blocks[i].mixer,
                                                               model.blocks[i].mixer, captured[i][0]).tolist()]
                for i in self.align_layers}

    def _select_and_build(self) -> None:
        """After stage 1: rank the layers (auto:K), build the student, start stage 2. What follows reads the stage-1
        model as a plain copy on every rank (its weights gathered whole: under FSDP2 the trained one is sharded)."""
        c = self.config
        aligned = model_state_everywhere(self.stage.model)
        self.stage = None  # stage 1's model and its wrappers go
        gc.collect()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            align_model = HybridLM(self.align_config).to(self.device)  # the copy draws no random numbers
        align_model.load_state_dict(aligned)
        if self.k is None:
            self.replaced = list(self.align_layers)
            self.stage = self._student_stage(align_model)
            return
        batches = [(b[0], b[2]) for b in self.validation.batches(c.select_batches) if b is not None]
        costs = replacement_costs(self.teacher.model, {i: align_model.blocks[i].mixer for i in self.align_layers},
                                  batches, reduce=self.env.all_reduce if self.env.distributed else None)
        if self.env.distributed:  # every rank has the same sums; rank 0's costs make certain of one student
            shared = torch.tensor([costs[i] for i in self.align_layers], dtype=torch.float64, device=self.device)
            dist.broadcast(shared, src=0)
            costs = dict(zip(self.align_layers, shared.tolist()))
        self.ranking = keep_most_costly(costs, self.k)
        kept = [r["layer"] for r in self.ranking if r["kept"]]
        # the kept attention layers, the others R; the teacher's own R, M or G layers as they are
        types = "".join(x if x != "A" or i in kept else "R" for i, x in enumerate(self.teacher.config.layer_types))
        self.console.say(ranking_lines(self.ranking))
        if self.env.is_main:
            write_ranking(self.out, self.teacher.path, self.k, types, self.ranking, len(batches))
        student = HybridLM(student_config(self.teacher.config, types, c.model, str(self.teacher.path)))
        student = student.to(self.device)
        self.replaced = [i for i in self.align_layers if i not in kept]
        mine = lambda k: any(k.startswith(f"blocks.{i}.mixer.") for i in self.replaced)  # noqa: E731
        copy_matching(student, {k: v for k, v in self.teacher.model.state_dict().items() if not mine(k)})
        copy_matching(student, {k: v for k, v in aligned.items() if mine(k)})
        self.stage = self._student_stage(student)

    # ------------------------------------------------------------------------------------------ run

    def _write_config(self) -> None:
        (self.out / CONFIG_FILE).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    def _plot(self) -> None:
        teacher = getattr(self, "teacher_figures", None)
        plot_stages(self.out / METRICS_FILE, self.out / PLOT_FILE,
                    teacher_val_loss=teacher["teacher_val_loss"] if teacher else None)

    def _teacher_logged(self) -> bool:
        """Whether the metrics a resumed run kept already hold stage 2's first record (the teacher's figures): a
        resume at the stage boundary, from a run that had written it. Rank 0 reads its file; every rank follows."""
        held = float(self.loop.log.holds(self.loop.step, "teacher_val_loss"))
        return self.env.all_reduce(torch.tensor(held, dtype=torch.float64, device=self.device)).item() > 0

    def _fit(self) -> DistillResult:
        self._setup()
        c, loop = self.config, self.loop
        resumed = self.checkpoint is not None
        loop.open(RunLog(self.out, trackers=c.log, config=c.to_dict(), resume_step=loop.step if resumed else None,
                         is_main=self.env.is_main, on_log=self.on_log, on_eval=self.on_eval))
        if self.env.is_main:
            self._write_config()
        self.console.say(announce(self, resumed))
        self.console.open_bar(total=c.total_steps, initial=loop.step, desc="hybrid-distill")
        if self.stage.name == "align":
            if not resumed and self.align_layers:
                self.align_init = self.stage.evaluate()
                loop.log.eval({"step": 0, "stage": "align", **self.align_init})
            loop.train(self.stage)
            self._select_and_build()
        self.teacher_figures = self.stage.teacher_figures()
        if self.stage.done == 0 and not (resumed and self._teacher_logged()):
            loop.log.eval({"step": loop.step, "stage": "distill", **self.teacher_figures})
        final = loop.train(self.stage)
        if final is None:  # no stage-2 step ran (--steps 0, or a finished run resumed)
            final = loop.evaluate(self.stage)
        if loop.divergence.last_saved is None or loop.divergence.last_saved[0] != loop.step or self.stage.done == 0:
            loop.save(self.stage)
        self.console.close_bar()
        result = {}
        if self.env.is_main:  # the summary reads the metrics file, which rank 0 alone writes
            self._plot()
            result = summary(self, self.teacher_figures, final)
            (self.out / SUMMARY_FILE).write_text(json.dumps(result, indent=2) + "\n")
            self.console.say(layout(self, result))
        return DistillResult(step=loop.step, out=self.out, layer_types=self.stage.model.config.layer_types,
                             replaced=list(self.replaced), val_loss=final["val_loss"], val_bpb=final["val_bpb"],
                             val_kl=final["val_kl"], teacher_val_bpb=self.teacher_figures["teacher_val_bpb"],
                             ranking=self.ranking, history=loop.log.history, summary=result)
