"""Run a suite of ``hybrid-bench``: size its models alike, train each seed into its own run directory, measure.

    records = run_bench("baselines", bench_budget("smoke", "baselines"), out="runs/bench")

Layout: ``OUT/<suite>/results.jsonl`` (one record per finished run, ``hybrid.train.suite``), one run directory
per model and seed, ``OUT/<suite>/<model>/seed<k>/`` (a ``hybrid.train.Trainer`` run: ``load_run`` opens it),
and ``OUT/<suite>/report.md`` with its PNG plots. A second call skips the finished runs.

Equal budgets: every model of the suite is sized to the first one (``match_width``, ±5% non-embedding
parameters); for one seed every model sees the same batches in the same order (the data loader's order is a
function of the seed) with the same AdamW and warmup-cosine schedule.

Each run's metrics: ``params``; ``val_loss`` / ``val_bpb`` at the training length (``eval_size`` validation
batches); the long-context figures of ``hybrid.train.bench.quality``, and ``doc_position_bpb``, loss by position
inside documents past L (``document_positions``); ``tokens_per_s`` (the median of the
trainer's records, the first one left out as warm-up); ``train_memory_bytes`` (``cost.training_memory``);
``loss_curve``; ``window_bpb`` by context length inside documents (``window_gain``); for the first seed of each
model (fine-tunes aside), ``decode`` at each of the budget's contexts; ``phase_seconds``: wall seconds of training
(compile included) and of each measurement.
The extension suite adds, on the Transformer's runs, ``extension``: the figures under each scaling at each
factor; and fine-tune runs (``finetune-none``, ``finetune-pi``, ``finetune-yarn``) that continue a trained
Transformer at 2 × the length with that scaling (none: the control) for ``finetune_steps`` steps at a tenth of the
learning rate.
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from pathlib import Path

import torch

from hybrid.models import HybridConfig, HybridLM

from ..loop.checkpoint import load_checkpoint
from ..lm.config import TrainConfig
from ..data import prepare_data
from ..suite import Budget, ResultsLog, RunSpec, TimeLimit, run_suite
from ..data.tokenizer import round_vocab_size
from ..lm.trainer import Trainer
from .budgets import check_window
from .cost import decode_cost, training_memory
from .document_positions import document_position_metrics
from .quality import context_metrics, long_sequences
from .speed import match_mlp, match_width, non_embedding_parameters
from .suites import FINETUNES, SCALINGS, SUITES, Suite, scaling_for
from .window_gain import window_metrics

__all__ = ["suite_configs", "suite_specs", "check_sets", "measure_run", "run_bench", "PARAM_TOLERANCE"]

PARAM_TOLERANCE = 0.05
MLP_MULTIPLE = 32  # the SwiGLU widths of match "mlp": a multiple of 32, as HybridConfig rounds mlp_ratio's
FINETUNE_LR_RATIO = 0.1


def _resolve(value, budget: Budget):
    return {"window": budget.extra["window"], "seq_len": budget.seq_len}.get(value, value) \
        if isinstance(value, str) else value


def check_sets(sets: dict | None) -> None:
    """``--set`` may not name the attention window (``window``, ``attention.window``, or ``attention`` as a dict
    with a window): it would apply to every model, the global Transformer included, while the past-the-window
    buckets and the report kept the budget's window. ``--window`` sets it for the windowed models alone."""
    for key, value in (sets or {}).items():
        if key in ("window", "attention.window") or (key == "attention" and isinstance(value, dict)
                                                     and "window" in value):
            raise ValueError(f"--set {key}: expected the attention window through --window (the windowed models' "
                             f"and the buckets', the global models kept global), got --set {key}={json.dumps(value)}")


def suite_configs(suite: Suite, budget: Budget, vocab_size: int, sets: dict | None = None) -> dict[str, HybridConfig]:
    """The model configs of ``budget.models``, each sized to the suite's first model at the budget's width: a model
    within ±5% of it at that width keeps it, any other gets ``match_width``'s d_model (and SwiGLU width). With the
    budget's ``match: "mlp"``, every model of another size than the reference keeps the budget's d_model and heads
    and gets the SwiGLU width nearest the reference's size (``match_mlp``). ``sets`` (``--set``) overrides
    HybridConfig fields of every model, after the suite's own; the window is refused there (``check_sets``)."""
    check_sets(sets)

    def config_of(name):
        overrides = {k: _resolve(v, budget) for k, v in suite.models[name].items() if k != "preset"}
        overrides.update(sets or {})
        config = HybridConfig.preset(suite.models[name]["preset"], "tiny", d_model=budget.d_model,
                                     n_layers=budget.n_layers, n_heads=budget.n_heads, vocab_size=vocab_size,
                                     **overrides)
        return config.replace(meta={"preset": suite.models[name]["preset"], "bench": suite.name, "model": name})

    reference = config_of(next(iter(suite.models)))
    target = non_embedding_parameters(reference)
    by_mlp = budget.extra.get("match") == "mlp"
    configs = {}
    for name in budget.models:
        config = config_of(name)
        n = non_embedding_parameters(config)
        if by_mlp and n != target:  # the budget's width and head size, the MLP's width for the size
            config = match_mlp(config, target, multiple=MLP_MULTIPLE)
            n = non_embedding_parameters(config)
        elif abs(n - target) > PARAM_TOLERANCE * target:  # the budget's width unless it misses the reference
            config = match_width(config, target, PARAM_TOLERANCE)
            n = non_embedding_parameters(config)
        if abs(n - target) > PARAM_TOLERANCE * target:
            raise ValueError(f"d_model: no width gives {name} {target:,} ± 5% non-embedding parameters "
                             f"(closest {n:,} at d_model {config.d_model}); change the budget's d_model or n_heads")
        if set(config.layer_types) != set(config.pattern):
            raise ValueError(f"n_layers: {config.n_layers} layers give {name} the mixers {config.layer_types!r}, "
                             f"not every letter of its pattern {config.pattern!r}; use at least {len(config.pattern)}")
        configs[name] = config
    return configs


def _train_config(budget: Budget, model: HybridConfig, seed: int, *, data, tokenizer, device, seq_len=None,
                  steps=None, lr=None, warmup=None, skip_rows_without_text: bool = False,
                  compile: bool = False) -> dict:
    steps = steps or budget.steps
    config = TrainConfig(
        preset="transformer", size="tiny", model=model.to_dict(), data=data, tokenizer=tokenizer,
        seq_len=seq_len or budget.seq_len, batch_size=budget.batch_size, steps=steps, lr=lr or budget.lrs[0],
        warmup=min(budget.extra["warmup"], steps) if warmup is None else warmup, eval_every=0,
        eval_batches=budget.eval_size, log_every=max(1, steps // 50), save_every=0, seed=seed, device=device,
        out="-", skip_rows_without_text=skip_rows_without_text, compile=compile,
    ).to_dict()
    if not skip_rows_without_text:  # recorded only when set: the records of earlier suites still match
        del config["skip_rows_without_text"]
    return config


def suite_specs(suite_name: str, budget: Budget, *, vocab_size: int, data=None, tokenizer=None,
                device: str = "auto", sets: dict | None = None, skip_rows_without_text: bool = False,
                compile: bool = False, data_digest: str | None = None) -> list[RunSpec]:
    """One RunSpec per model and seed (and, for ``extension``, per fine-tune and seed), in run order; ``compile``:
    each run's training step under ``torch.compile`` (``--compile``; the measurements run the model eager);
    ``data_digest``: the prepared tokens' ``content_digest``, kept in every record."""
    suite = SUITES[suite_name]
    configs = suite_configs(suite, budget, vocab_size, sets)
    common = {"suite": suite_name, "budget": budget.to_dict(), "factors": [1, *suite.factors]}
    if data_digest is not None:
        common["data_digest"] = data_digest
    specs = []
    for name, config in configs.items():
        for seed in budget.seeds:
            train = _train_config(budget, config, seed, data=data, tokenizer=tokenizer, device=device,
                                  skip_rows_without_text=skip_rows_without_text, compile=compile)
            specs.append(RunSpec(run=f"{name}/seed{seed}", model=name, seed=seed, steps=budget.steps,
                                 config={**common, "model": config.to_dict(), "train": train}))
    if suite_name == "extension" and "transformer" in configs:
        L, ft_steps = budget.seq_len, budget.extra["finetune_steps"]
        for method in FINETUNES:
            config = configs["transformer"].replace(rope_scaling=scaling_for(method, 2, L))
            for seed in budget.seeds:
                train = _train_config(budget, config, seed, data=data, tokenizer=tokenizer, device=device,
                                      skip_rows_without_text=skip_rows_without_text, compile=compile, seq_len=2 * L,
                                      steps=ft_steps, lr=budget.lrs[0] * FINETUNE_LR_RATIO,
                                      warmup=min(budget.extra["warmup"], ft_steps // 10))
                specs.append(RunSpec(run=f"finetune-{method}/seed{seed}", model=f"finetune-{method}", seed=seed,
                                     steps=ft_steps, config={**common, "model": config.to_dict(), "train": train,
                                                             "base_run": f"transformer/seed{seed}",
                                                             "factors": [1, 2, 4, 8]}))
    return specs


class _FineTune(Trainer):
    """A fresh run whose weights start from another run's checkpoint (the model config may differ in its
    length-only fields, e.g. ``rope_scaling``)."""

    def __init__(self, config, base_dir: Path, **kwargs):
        super().__init__(config, **kwargs)
        self.base_dir = base_dir

    def _setup(self):
        super()._setup()
        if self.checkpoint is None:
            self.model.load_state_dict(load_checkpoint(self.base_dir).model_state)


class _PhaseClock:
    """Wall seconds of a run's phases (``phase_seconds`` of its record): where a budget's time goes."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)


def measure_run(spec: RunSpec, trainer: Trainer, result, budget: Budget, clock: _PhaseClock | None = None) -> dict:
    """The metrics of one trained run's record: size, validation loss and bits per byte, speed, loss curve,
    training memory, bits per byte at k × the training length, and (first seed) the decoding cost; with
    ``clock``, each measurement's wall seconds in it."""
    clock = clock or _PhaseClock()
    model, data = trainer.model, trainer.data
    L = trainer.config.seq_len
    train_records = [r for r in result.history if "tokens_per_s" in r]
    speeds = [r["tokens_per_s"] for r in (train_records[1:] or train_records)]
    metrics = {
        "params": model.num_parameters(exclude_embeddings=True), "val_loss": result.val_loss,
        "val_bpb": result.val_bpb, "bytes_per_token": data.bytes_per_token,
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "loss_curve": [[r["step"], r["loss"]] for r in train_records],
    }
    with clock.phase("memory"):
        metrics.update(training_memory(model, batch_size=budget.batch_size, seq_len=L, autocast=trainer.autocast))
    factors = spec.config["factors"]
    base_len = budget.seq_len  # the long-context figures count in the pre-training length
    with clock.phase("long context"):
        seqs = long_sequences(data.valid, length=max(factors) * base_len, count=budget.extra["long_seqs"])
        metrics.update(context_metrics(model, data, seqs, seq_len=base_len, factors=factors))
        metrics.update(document_position_metrics(model, data, seq_len=base_len, factor=max(factors),
                                                 count=budget.extra["long_seqs"]))
    with clock.phase("window"):
        metrics.update(window_metrics(model, data, window=budget.extra["window"], seq_len=base_len,
                                      count=budget.extra.get("window_blocks", 32)))
    if spec.config["suite"] == "extension" and spec.model == "transformer":
        with clock.phase("extension"):
            metrics["extension"] = extension_metrics(model, data, seqs, seq_len=base_len,
                                                     factors=[k for k in factors if k > 1])
    if spec.seed == budget.seeds[0] and "base_run" not in spec.config:  # a fine-tune decodes as its base
        limit = model.config.max_positions
        with clock.phase("decode"):
            metrics["decode"] = {
                str(c): decode_cost(model, context=c, new_tokens=budget.extra["decode_tokens"])
                if limit is None or c + budget.extra["decode_tokens"] + 1 <= limit else None
                for c in budget.extra["decode_contexts"]}
    metrics["phase_seconds"] = dict(clock.seconds)
    return finite_or_none(metrics)


def finite_or_none(value):
    """``value`` with every NaN or infinite float (nested in dicts and lists) replaced by None: a record is one line
    of strict JSON (``json.dumps`` would write a bare ``NaN``), and the report reads None as "–"."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def extension_metrics(model: HybridLM, data, seqs, *, seq_len: int, factors) -> dict:
    """``{method: {"<k>": figures at k × seq_len}}`` for the model re-read under each scaling of ``SCALINGS``."""
    out = {}
    for method in SCALINGS:
        out[method] = {}
        for k in factors:
            config = model.config.replace(rope_scaling=scaling_for(method, k, seq_len))
            scaled = HybridLM(config).to(model.embed.weight.device)
            scaled.load_state_dict(model.state_dict())
            figures = context_metrics(scaled, data, seqs, seq_len=seq_len, factors=(k,))
            out[method][str(k)] = {key.replace(f"_{k}x", ""): v for key, v in figures.items()
                                   if key.startswith("bpb_")}
    return out


def isolate_compiles() -> None:
    """Forget the graphs Dynamo compiled for earlier runs of this process. Every model's blocks run through the same
    ``forward`` code, so earlier runs' graphs share its recompile limit (8) with this one: a later model could run
    eager past it without a word, and its first steps reused or skipped compiles by the order of the runs (on an
    H200, 2026-11-28, the selective hybrid's 300 steps with their compile took 27 s right after the static one,
    which took 51 s, and the static one 89 s after two Transformers, at 20 % fewer tokens/s)."""
    torch.compiler.reset()


def make_execute(budget: Budget, verbose: bool = False):
    """The ``execute(spec, run_dir, advance)`` of ``run_suite`` for this budget."""

    def execute(spec: RunSpec, run_dir: Path, advance) -> dict:
        config = TrainConfig.from_dict({**spec.config["train"], "out": str(run_dir)})
        last = [0]

        def on_log(record):
            advance(record["step"] - last[0])
            last[0] = record["step"]

        kwargs = dict(verbose=0, progress=False, on_log=on_log)
        if config.compile:  # each run compiles afresh (the disk caches still hit): see isolate_compiles
            isolate_compiles()
        if "base_run" in spec.config:
            trainer = _FineTune(config, run_dir.parents[1] / spec.config["base_run"], **kwargs)
        else:
            trainer = Trainer(config, **kwargs)
        clock = _PhaseClock()
        with clock.phase("train"):  # the compile and the periodic evaluations included
            result = trainer.fit()
        return measure_run(spec, trainer, result, budget, clock=clock)

    return execute


def check_records_match(directory: Path, specs: list[RunSpec]) -> None:
    """A finished run is only skipped if it was trained as asked now; otherwise the suite would mix settings."""
    done = ResultsLog(directory).by_run()
    for spec in specs:
        record = done.get(spec.run)
        if record is None:
            continue
        asked = {k: spec.config[k] for k in ("model", "train")}
        if {k: record["config"].get(k) for k in asked} != json.loads(json.dumps(asked)):
            raise ValueError(f"out: {directory / spec.run} was trained with another model or training config than "
                             f"this command asks for (budget, --steps, --seq-len, --window, --set, --data); use "
                             f"another --out")
        digest, was = spec.config.get("data_digest"), record["config"].get("data_digest", "not recorded")
        if digest is not None and was != digest:  # the same --data path can hold other text on another machine
            raise ValueError(f"out: {directory / spec.run} was trained on other tokens than --data gives here "
                             f"(data digest {was[:12]}, here {digest[:12]}); use another --out")
        # the global model's config has no window, but its past-the-window buckets do
        window, was = spec.config["budget"]["extra"].get("window"), _record_window(record)
        if window != was:
            raise ValueError(f"out: {directory / spec.run} was measured at window {was}, this command asks for "
                             f"{window} (--window); use another --out")


def _record_window(record: dict):
    return (record["config"].get("budget") or {}).get("extra", {}).get("window")


def run_bench(suite_name: str, budget: Budget, *, out, data=None, tokenizer=None, device: str = "auto",
              sets: dict | None = None, verbose: bool = True, skip_rows_without_text: bool = False,
              compile: bool = False, time_limit: TimeLimit | None = None, command: str | None = None) -> list[dict]:
    """Train and measure what is not finished in ``OUT/<suite>``; return the suite's records (with ``time_limit``,
    those finished when it stopped the suite: ``run_suite``; each new record keeps ``command``). The budget's
    window must be shorter than its training length and ``sets`` must not name it (``check_window``,
    ``check_sets``): both are refused before the data is read."""
    check_window(budget)
    check_sets(sets)
    prepared = prepare_data(data, tokenizer=tokenizer, skip_rows_without_text=skip_rows_without_text)
    if verbose:
        s = prepared.stats
        print(f"data: {s['source']}: {s['train_tokens']:,} train / {s['valid_tokens']:,} valid tokens "
              f"({s['tokenizer']}; tokens' sha256 {prepared.content_digest[:12]})", flush=True)
    vocab = round_vocab_size(prepared.tokenizer.vocab_size)
    specs = suite_specs(suite_name, budget, vocab_size=vocab, data=data, tokenizer=tokenizer, device=device,
                        sets=sets, skip_rows_without_text=skip_rows_without_text, compile=compile,
                        data_digest=prepared.content_digest)
    check_records_match(Path(out) / suite_name, specs)
    return run_suite(Path(out) / suite_name, specs, make_execute(budget), suite=suite_name, verbose=verbose,
                     time_limit=time_limit, command=command)
