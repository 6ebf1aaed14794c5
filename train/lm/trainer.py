"""Training a language model: ``Trainer`` sets the run up and the one loop trains it (``hybrid.train.loop``).

    result = Trainer(TrainConfig(steps=200, out="runs/x")).fit()        # a fresh run
    result = Trainer.from_checkpoint("runs/x", steps=400).fit()          # continue it to step 400

Context parallelism (``cp``): the ranks form a data × context mesh (``hybrid.train.parallel.mesh``); each rank of a
context group trains on its shard of the group's sequences (``hybrid.train.lm.stage``), and the global batch counts
sequences, ``batch_size × grad_accum × WORLD_SIZE / cp``. A checkpoint holds full state dicts and a data position
that do not depend on ``cp``, so a run saved with one ``cp`` resumes with another.

One optimizer step: ``grad_accum`` micro-batches per rank (``hybrid.train.parallel.sharding``), each cross-entropy
backpropagated (gradient sync only on the last, under DDP or FSDP2), the global gradient norm clipped, AdamW
(``hybrid.train.loop.optim``), the warmup-cosine schedule. bf16 autocast on CUDA, none on CPU; a ``dtype=float16``
model trains on CUDA only, with float32 master weights, float16 autocast and a GradScaler.

Divergence never reaches a checkpoint (``on_nonfinite`` "stop" or "skip"); ``keep`` checkpoints are kept. Step
``k`` (1-based) is logged when ``k % log_every == 0`` (the mean loss of the steps since the previous record),
evaluated when ``k % eval_every == 0``, saved when ``k % save_every == 0``, and the last step is always evaluated
and saved. Rank 0 alone writes ``OUT/``.

Exact resume: a checkpoint holds the weights, the AdamW state (keyed by parameter name), the scheduler, the RNG
states, the data position, the step and the sums since the last metrics record, each a named part
(``hybrid.train.loop.parts``); a resumed run with the same global batch makes the same updates on the same batches
as the uninterrupted run, so on a CPU its losses, and its records, are bit-for-bit equal (but the measured
``tokens_per_s``). A finished run resumed again evaluates for its result, and writes that record only if the
metrics it kept lack it. ``steps`` may grow on resume: it is the new total, and the cosine is stretched to it from
the current step on.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from hybrid.checks import check_int
from hybrid.models import CompiledBlocks, HybridConfig, HybridLM
from hybrid.models.context_parallel import check_shardable

from ..data import prepare_data
from ..data.tokenizer import Tokenizer, round_vocab_size
from ..loop.checkpoint import Checkpoint, CheckpointError, has_checkpoint, kept_checkpoints, load_checkpoint
from ..loop.divergence import DivergenceGuard
from ..loop.footprint import check_fits
from ..loop.init_from import init_weights, load_init
from ..loop.loop import Cadence, TrainingLoop
from ..loop.optim import build_optimizer, set_weight_decay
from ..loop.parts import Record, RNGPart
from ..output.records import RunLog
from ..loop.resume import resume_config
from ..loop.run import Run, join, on_rank0_first, precision, seed_everything
from ..loop.run_dir import ABANDONED_PREFIX, check_resumed_run_dir, check_run_out, run_inputs
from ..loop.saved_model import checkpoint_config
from ..loop.schedule import warmup_cosine
from ..output.console import end_message, start_message
from ..output.metrics import METRICS_FILE, plot_loss_curve
from ..output.paths import data_input
from ..output.tracking import TENSORBOARD_DIR, WANDB_DIR
from ..parallel.device import env_int
from ..parallel.distributed import wrap_model
from ..parallel.mesh import build_mesh
from ..parallel.sharding import GlobalBatches
from .config import MAX_SKIPS_IN_A_ROW, TrainConfig
from .stage import LMStage

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


def _saved_cp_message(world_size: int, cp: int) -> str:
    """A checkpoint's ``cp`` that this job's ranks cannot form: what to pass instead (``--cp`` may change on
    resume: the checkpoint does not depend on it)."""
    fits = math.gcd(world_size, cp)
    return (f"cp: expected a divisor of WORLD_SIZE={world_size}, got {cp}, the checkpoint's (the run was saved with "
            f"--cp {cp}); pass --cp {fits} to resume on these ranks, or resume on a multiple of {cp} ranks")


class Trainer(Run):
    """One language model's training run (fresh, or resumed with ``from_checkpoint``); ``fit()`` runs it.
    ``Trainer(config, overwrite=False, verbose=1, progress=None, on_log=None, on_eval=None)`` (``hybrid.train.loop.run
    .Run``): ``verbose`` 0 silent, 1 start / evaluation / checkpoint / end messages, 2 also one line per metrics
    record when there is no progress bar; ``progress`` a progress bar on rank 0 (default: when stderr is a TTY);
    ``on_log(record)`` / ``on_eval(record)`` called on rank 0 with every train / eval record."""

    Config = TrainConfig

    @classmethod
    def from_checkpoint(cls, run_dir, *, world_size: int | None = None, trainer_kwargs: dict | None = None,
                        **overrides) -> "Trainer":
        """Resume the run in ``run_dir``: its saved TrainConfig with ``overrides`` (see ``hybrid.train.loop.resume``).

        A missing checkpoint is a FileNotFoundError; a corrupt or incompatible one a CheckpointError.
        """
        ckpt = load_checkpoint(run_dir)
        # run_dir may name a checkpoint directory itself (checkpoint-step-N/): the run writes in its parent
        run_dir = check_resumed_run_dir(ckpt.path, kind="hybrid-train", record=CONFIG_FILE, names=(PLOT_FILE,),
                                        reads_record=lambda text: TrainConfig.from_dict(json.loads(text)))
        extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
        if "train_config" not in extra or "global_batch" not in extra:
            raise CheckpointError(ckpt.path, "has no training record (train_config, global_batch): it was not "
                                             "written by train.Trainer, so it cannot be resumed")
        # runs saved before `packing` existed trained on the plain stream: resume them that way
        saved = TrainConfig.from_dict({"packing": "stream", **extra["train_config"]})
        if world_size is None:
            world_size = env_int("WORLD_SIZE", 1)
        cp = overrides.get("cp") or saved.cp
        if world_size % cp and not overrides.get("cp"):
            raise ValueError(_saved_cp_message(world_size, cp))
        world_size = world_size // cp if world_size % cp == 0 else world_size  # data-parallel groups (else refused)
        overrides.pop("out", None)
        if overrides.get("steps") is not None and overrides["steps"] < ckpt.step:
            raise ValueError(f"steps: expected the new total, at least the checkpoint's step {ckpt.step}, got "
                             f"{overrides['steps']}")
        config, notes = resume_config(saved, saved_global_batch=int(extra["global_batch"]),
                                      world_size=world_size, out=str(run_dir), **overrides)
        return cls(config, _checkpoint=ckpt, _notes=tuple(notes), **(trainer_kwargs or {}))

    # the run's parts, for callers that look inside (the model, its optimizer, schedule and data position)
    model = property(lambda self: self.stage.model)
    optimizer = property(lambda self: self.stage.optimizer)
    scheduler = property(lambda self: self.stage.scheduler)
    batches = property(lambda self: self.stage.data_batches)
    step = property(lambda self: self.loop.step if self.loop is not None else None)

    def set_total_steps(self, steps: int) -> None:
        """Change the run's total while it runs (from ``on_log``, so on one process): the cosine is
        re-stretched to it. Under torchrun every rank would have to call it at the same step.

        Called before the warmup ends, the learning rates seen so far are unchanged (warmup does not depend
        on the total), so the run is the one that ``steps`` would have given from the start.
        """
        warmup = self.config.warmup_steps  # kept: a derived warmup does not follow a total changed mid-run
        done = self.loop.step
        steps = check_int("steps", steps, low=max(done, 1, warmup),
                          what=f"an int >= max(current step {done}, warmup {warmup})")
        self.config = self.config.replace(steps=steps, warmup=warmup)
        self.stage.steps = steps
        self.stage.scheduler.set_total(steps)
        self.console.set_total(steps)

    # ------------------------------------------------------------------------------------------ setup

    def _clear_out_dir(self) -> None:
        """A fresh run: refuse an --out that holds a checkpoint, or is not empty and not a run of ours
        (``hybrid.train.loop.run_dir``), unless ``overwrite``; then clear the old run's files (no others)."""
        if has_checkpoint(self.out) and not self.overwrite:
            raise ValueError(
                f"out: {self.out} already holds a checkpoint; continue it with --resume {self.out}, start over "
                f"with --overwrite, or pick another --out"
            )
        check_run_out(self.out, overwrite=self.overwrite, kind="hybrid-train", record=CONFIG_FILE,
                      reads_record=lambda text: TrainConfig.from_dict(json.loads(text)), names=(PLOT_FILE,))
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
            for branch in self.out.glob(ABANDONED_PREFIX + "*"):  # and its abandoned branches
                shutil.rmtree(branch, ignore_errors=True)

    def _model(self, init) -> None:
        """The model config (checked against a resumed checkpoint's), the model, its initial weights."""
        c = self.config
        base = init.config if init is not None else None
        if c.init_from and self.checkpoint is not None:  # resuming a run that started from another's weights
            base = checkpoint_config(self.checkpoint)
        self.model_config = model_config_for(c, self.tokenizer, base)
        # read back as a config: a checkpoint saved before the config had sections stores the old flat names
        as_saved = HybridConfig.from_dict(json.loads(json.dumps(self.model_config.to_dict())))
        if self.checkpoint is not None and checkpoint_config(self.checkpoint) != as_saved:
            raise CheckpointError(self.checkpoint.path / "config.json",
                                  "the model config does not match the one its training record describes")
        self.autocast, self.scaler = precision(self.device, self.model_config.dtype)
        check_fits(self.model_config, self.device, shards=self.env.world_size if c.fsdp else 1)  # before allocating
        model = HybridLM(self.model_config)
        if not (c.fsdp and self.env.distributed):  # FSDP2 moves each unit to the device as it shards it: a rank
            model = model.to(self.device)         # never holds the whole model there (check_fits counts shards)
        if init is not None:
            self.notes += init_weights(model, init, source=c.init_from, partial=c.init_partial)
        if self.scaler is not None:
            model.float()  # float32 master weights; float16 autocast runs the model
        self.num_parameters = model.num_parameters()
        return model

    def _setup(self) -> None:
        c = self.config
        self.device, self.env = join(c.device)
        self.take_out_dir(command="hybrid-train", inputs=[  # one writer; never into what the run reads
            ("data", data_input(c.data)), *run_inputs(tokenizer=c.tokenizer, init_from=c.init_from)])
        if self.checkpoint is None:
            self._clear_out_dir()
        seed_everything(c.seed)
        init = load_init(c.init_from) if c.init_from and self.checkpoint is None else None
        if init is not None and c.tokenizer is None:  # the source run's tokenizer, recorded in train_config.json
            self.config = c = c.replace(tokenizer=init.tokenizer)
        self.data = on_rank0_first(self.env, lambda: prepare_data(
            c.data, tokenizer=c.tokenizer, valid_fraction=c.valid_fraction, text_column=c.text_column,
            skip_rows_without_text=c.skip_rows_without_text))
        self.tokenizer = self.data.tokenizer
        model = self._model(init)
        if c.cp > 1:
            try:
                check_shardable(model)
            except ValueError as e:
                raise ValueError(f"cp: expected 1 for this model (it has no context-parallel path: {e}), "
                                 f"got {c.cp}") from None
        self.mesh = build_mesh(self.env, c.cp, self.device)
        if c.fsdp and not self.env.distributed:
            self.notes.append("--fsdp: one process, nothing to shard; training without FSDP")
        wrapped = wrap_model(model, self.env, fsdp=c.fsdp, device=self.device)
        self.wrap = "FSDP2" if c.fsdp and self.env.distributed else ("DDP" if wrapped is not model else
                                                                     "single process")
        if c.cp > 1:
            self.wrap += f", {self.mesh.describe()} ranks"
        optimizer = build_optimizer(model, lr=c.lr, weight_decay=c.weight_decay, betas=c.betas)
        batches = GlobalBatches(self.data, seq_len=c.seq_len, batch_size=c.batch_size, grad_accum=c.grad_accum,
                                seed=c.seed, rank=self.mesh.dp_rank, world_size=self.mesh.dp_size, packing=c.packing,
                                cp_group=self.mesh.cp_group)
        self.stage = LMStage(model=model, train_model=CompiledBlocks(model, wrapped) if c.compile else wrapped,
                             optimizer=optimizer, scheduler=warmup_cosine(optimizer, warmup=c.warmup_steps,
                                                                          total=c.steps, min_lr_ratio=c.min_lr_ratio),
                             batches=batches, data=self.data, steps=c.steps, seq_len=c.seq_len,
                             batch_size=c.batch_size, eval_batches=c.eval_batches, packing=c.packing,
                             device=self.device, env=self.env, autocast=self.autocast)
        divergence = DivergenceGuard(c.on_nonfinite, device=self.device, env=self.env, out=self.out, lr=c.lr,
                                     float16=self.scaler is not None)
        self.loop = TrainingLoop(self.out, Cadence(c.log_every, c.eval_every, c.save_every, c.keep),
                                 grad_clip=c.grad_clip, divergence=divergence, env=self.env, device=self.device,
                                 console=self.console, parts=self._parts(),
                                 model_config=self.model_config.to_dict, scaler=self.scaler,
                                 after_save=self._write_config, after_eval=self._plot)
        if self.checkpoint is not None:
            self._restore(self.checkpoint)

    def _parts(self) -> dict:
        """The run's checkpoint parts beside the stage's (model, optimizer, scheduler)."""
        stats = {k: v for k, v in self.data.stats.items() if isinstance(v, (int, str, bool))}
        parts = {"data": self.stage.data_batches, "rng": RNGPart(),
                 "train_config": Record(lambda: self.config.to_dict()), "tokenizer": Record(self.tokenizer.to_dict()),
                 "world_size": Record(self.env.world_size), "global_batch": Record(self.stage.data_batches.global_batch),
                 "data_stats": Record(stats)}
        if self.scaler is not None:
            parts["grad_scaler"] = self.scaler
        return parts

    def _restore(self, ckpt: Checkpoint) -> None:
        """Every part back, then what the resume changes: the schedule's total (``steps``), lr, warmup, weight decay."""
        self.loop.restore(ckpt, self.stage, optional=("grad_scaler",))
        c = self.config  # --steps (the new total), --lr, --warmup, --weight-decay given on resume
        self.stage.done = ckpt.step
        self.stage.scheduler.set_total(c.steps, warmup=c.warmup_steps, lr=c.lr)
        set_weight_decay(self.stage.optimizer, c.weight_decay)
        if ckpt.data_state["samples_in_epoch"] % self.stage.data_batches.global_batch:
            self.notes.append("the data position is not on a global-batch boundary: up to one global batch of "
                              "this epoch is seen again")

    def _write_config(self) -> None:
        (self.out / CONFIG_FILE).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    def _plot(self) -> None:
        plot_loss_curve(self.out / METRICS_FILE, self.out / PLOT_FILE)

    # ------------------------------------------------------------------------------------------ run

    def _fit(self) -> TrainResult:
        self._setup()
        c, env, console, loop = self.config, self.env, self.console, self.loop
        console.is_main = env.is_main
        start = loop.step
        resumed = self.checkpoint is not None
        if env.is_main:  # the record first: a folder with a run's files and no record is not a run of ours
            self.out.mkdir(parents=True, exist_ok=True)
            self._write_config()
        loop.open(RunLog(self.out, trackers=c.log, config=c.to_dict(), resume_step=start if resumed else None,
                         is_main=env.is_main, on_log=self.on_log, on_eval=self.on_eval))
        console.open_bar(total=c.steps, initial=start, desc="train")
        console.say(start_message(resumed=resumed, config=c, model_config=self.model_config,
                                  num_parameters=self.num_parameters, device=self.device, wrap=self.wrap,
                                  stats=self.data.stats, start=start, global_batch=self.stage.data_batches.global_batch,
                                  world_size=self.mesh.dp_size))
        for note in self.notes:
            console.say(f"note: {note}")
        unigram = self.data.unigram_bpb() if env.is_main else None

        last_eval = loop.train(self.stage)
        if last_eval is None:  # resumed at the final step: nothing to train, the checkpoint is current
            last_eval = loop.evaluate(self.stage, write=not loop.holds("val_loss"))  # not twice in the metrics
        paths = {"out": self.out, "checkpoint": self.out / "checkpoint", "metrics": self.out / METRICS_FILE,
                 "plot": self.out / PLOT_FILE, "config": self.out / CONFIG_FILE}  # the plot: drawn at each evaluation
        console.close_bar()
        console.say(end_message(paths, last_eval, unigram, self.config.packing))
        return TrainResult(step=loop.step, out=self.out, model_config=self.model_config,
                           num_parameters=self.num_parameters, val_loss=last_eval["val_loss"],
                           val_bpb=last_eval["val_bpb"], unigram_bpb=unigram, history=loop.log.history, paths=paths)


def train(config: TrainConfig, **kwargs) -> TrainResult:
    """``Trainer(config, **kwargs).fit()``."""
    return Trainer(config, **kwargs).fit()
