"""``python -m hybrid.train.demo`` (``make demo``): train the tiny hybrid on this Python's standard library, then
generate from it in recurrent and in parallel mode.

The recipe is fixed (same seed, steps and numbers on every run): the tiny hybrid preset (RRA, ≈0.8M
parameters, byte vocabulary), 1200 steps of 16 × 256 tokens (4.9M tokens, about 40% of an epoch of the
11.7M-token training split), AdamW at 3e-3 with 100 warmup steps and a cosine to 3e-4, the whole validation
split scored every 300 steps. About 7 minutes on two idle CPU cores. It prints the validation bits per byte
next to the unigram baseline of the same data, greedy samples from both decoding modes, and where the run is.

On a machine too slow (or too busy) for that, the demo measures its speed over steps 50–100, still in the
warmup, and lowers the step count so that training ends within ``--budget`` seconds (the warmup does not
depend on the total, so the shorter run is exactly the run that step count would give).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .cli.flags import add_device_flag
from .cli.parts import Parser, count, finite_float, positive_int, run_command
from .lm.config import TrainConfig

PROMPT = "class Point:\n    def __init__(self"
BUDGET_S = 450.0  # from the start to the end of training, evaluations included
CHECK_AT = 100  # the step at which the training time is projected (the last warmup step)
RECIPE = dict(preset="hybrid", size="tiny", seq_len=256, batch_size=16, steps=1200, lr=3e-3, warmup=100,
              eval_every=300, eval_batches=None, log_every=25, save_every=600)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def _show(text: str) -> str:
    return "\n".join(("    │ " + line).rstrip() for line in text.rstrip().split("\n"))


def _steps_within(budget: float, elapsed: float, per_step: float, eval_s: float, steps: int, eval_every: int) -> int:
    """The largest step count (a multiple of 50, at least 3 × CHECK_AT) whose training and evaluations end
    within ``budget`` seconds, given ``elapsed`` seconds at step CHECK_AT; ``steps`` when that fits."""
    def projected(n):
        return elapsed + (n - CHECK_AT) * per_step + (n // eval_every + (n % eval_every > 0)) * eval_s

    n = steps
    while n > 3 * CHECK_AT and projected(n) > budget:
        n = (n - 1) // 50 * 50
    return n


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m hybrid.train.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/demo", help="run directory; an earlier demo's is replaced, any other "
                                                       "run only with --overwrite (default: runs/demo)")
    p.add_argument("--overwrite", action="store_true", help="replace --out whatever it holds")
    p.add_argument("--steps", type=positive_int, default=RECIPE["steps"],
                   help=f"training steps (default: {RECIPE['steps']})")
    add_device_flag(p)
    p.add_argument("--new-tokens", type=count, default=160, help="tokens per sample (default: 160)")
    p.add_argument("--budget", type=finite_float(0.0), default=BUDGET_S,
                   help="seconds for the training (evaluations included); a slower machine trains fewer steps, "
                        f"0 = no limit (default: {BUDGET_S:.0f})")
    return p


MARK = "demo.json"  # written into the run directory before training: the demo's TrainConfig


def check_replaceable(out: Path, overwrite: bool) -> None:
    """The demo replaces ``out`` when it is missing or empty, when it holds a demo's run that nothing changed
    since (its mark, the run's recorded config equal to the mark's, no step past the mark's steps:
    ``hybrid-train --resume runs/demo --steps 2400`` makes it the user's), or with ``overwrite``; else a one-line
    error."""
    out = Path(out)
    if overwrite or not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    holds = "files the demo did not write"
    if (out / MARK).is_file():
        from .lm.trainer import CONFIG_FILE
        from .loop.checkpoint import CheckpointError, load_checkpoint

        demo = json.loads((out / MARK).read_text())
        recorded = json.loads((out / CONFIG_FILE).read_text()) if (out / CONFIG_FILE).is_file() else demo
        try:
            step = load_checkpoint(out).step
        except (CheckpointError, FileNotFoundError, ValueError):
            step = 0  # a demo stopped before its first checkpoint
        same = {k: v for k, v in recorded.items() if k != "steps"} == {k: v for k, v in demo.items() if k != "steps"}
        if same and max(step, recorded.get("steps", 0)) <= demo.get("steps", 0):
            return
        holds = f"a run trained on from the demo's (to {max(step, recorded.get('steps', 0))} steps)" if same else \
            "a run of another config (over a demo's)"
    raise ValueError(f"--out: expected no directory or an earlier demo's run (or --overwrite), got {out}, which "
                     f"holds {holds}")


def main(argv: list[str] | None = None) -> int:
    """The demo: returns the exit status (1 when the two modes' samples differ)."""
    return run_command(parser(), argv, _demo)


def _demo(args: argparse.Namespace) -> int:
    import datasets

    from hybrid.models import HybridLM

    from .data import prepare_data
    from .parallel.device import resolve_device
    from .lm.inference import generate_ids, load_run
    from .lm.trainer import Trainer, model_config_for

    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    short = args.steps < RECIPE["steps"]
    recipe = {**RECIPE, "steps": args.steps}
    if short:  # a quick look: keep warmup, evaluations and saves in proportion
        recipe.update(warmup=min(RECIPE["warmup"], args.steps // 4), eval_every=max(1, args.steps // 4),
                      save_every=max(1, args.steps // 2))
    config = TrainConfig(out=args.out, device=args.device, **recipe)
    check_replaceable(Path(config.out), args.overwrite)
    print(f"hybrid demo: train the tiny hybrid model (RRA: two VO-RoPE recurrence layers per attention layer)\n"
          f"on this Python's standard-library sources, then generate in recurrent and parallel mode\n"
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)\n", flush=True)
    data = prepare_data(config.data, tokenizer=config.tokenizer, valid_fraction=config.valid_fraction)
    d, m = data.stats, model_config_for(config, data.tokenizer)
    print(f"data   {d['documents']} files, {d['train_tokens']:,} train / {d['valid_tokens']:,} valid byte tokens\n"
          f"model  {HybridLM(m).num_parameters():,} parameters, layers {m.layer_types}, attention window {m.window}, "
          f"d_model {m.d_model}, on {resolve_device(config.device)}\n"
          f"train  {config.steps} steps × {config.batch_size} × {config.seq_len} tokens, AdamW lr {config.lr:g}, "
          f"warmup {config.warmup_steps}, cosine\n", flush=True)
    trainer = Trainer(config, overwrite=True, verbose=0, progress=None)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    (Path(config.out) / MARK).write_text(json.dumps(config.to_dict()))
    speed = []

    def on_log(record):
        if CHECK_AT // 2 < record["step"] <= CHECK_AT:
            speed.append(record["tokens_per_s"])
        if record["step"] == CHECK_AT and args.budget > 0 and not short:
            tps = sum(speed) / len(speed)
            per_step = config.batch_size * config.seq_len / tps
            eval_s = per_step * len(trainer.data.valid) / (config.batch_size * config.seq_len) / 3  # forward only
            steps = _steps_within(args.budget, time.perf_counter() - t0, per_step, eval_s, config.steps,
                                  config.eval_every)
            if steps < config.steps:
                trainer.write(f"note: {tps:,.0f} tokens/s is too slow for {config.steps} steps in "
                              f"{_clock(args.budget)} (a busy machine?); training {steps} steps instead\n")
                trainer.set_total_steps(steps)

    def on_eval(record):
        trainer.write(f"  step {record['step']:>5}/{trainer.config.steps}  val_loss {record['val_loss']:.3f}  "
                      f"val_bpb {record['val_bpb']:.3f}   [{_clock(time.perf_counter() - t0)}]")

    trainer.on_log, trainer.on_eval = on_log, on_eval
    result = trainer.fit()
    t_train = time.perf_counter() - t0
    tps = [r["tokens_per_s"] for r in result.history if "tokens_per_s" in r]
    final = [r for r in result.history if "val_bpb" in r][-1]
    scope = "the whole split" if config.eval_batches is None else f"{config.eval_batches} batches"
    print(f"\nvalidation ({final['val_tokens']:,} tokens, {scope}, packed by {config.packing} as in training)\n"
          f"  model    {final['val_bpb']:.3f} bits per byte   (loss {final['val_loss']:.3f} nats per token)\n"
          f"  unigram  {result.unigram_bpb:.3f} bits per byte   (baseline: byte frequencies of the training split)\n",
          flush=True)

    run = load_run(config.out, device=trainer.device)  # back from the checkpoint on disk
    samples = {}
    for mode in ("recurrent", "parallel"):
        t = time.perf_counter()
        samples[mode] = generate_ids(run, PROMPT, max_new_tokens=args.new_tokens, mode=mode, temperature=0.0)
        print(f"greedy sample, {mode} mode ({_clock(time.perf_counter() - t)}):", flush=True)
        print(_show(run.tokenizer.decode(samples[mode])), flush=True)
    same = samples["recurrent"] == samples["parallel"]
    print(f"identical: {same}\n")

    print(f"run directory {result.out}/  (trained in {_clock(t_train)}, {sum(tps) / max(1, len(tps)):,.0f} tokens/s)\n"
          f"  checkpoint/     weights, optimizer, data position; continue with\n"
          f"                  {_command('hybrid-train')} --resume {result.out} --steps {2 * result.step}\n"
          f"  metrics.jsonl   loss, lr, tokens/s every {config.log_every} steps; val_loss, val_bpb per evaluation\n"
          f"  loss.png        loss curve\n"
          f"sample more:  {_command('hybrid-generate')} --run {result.out} --prompt 'def ' --temperature 0.8\n"
          f"total {_clock(time.perf_counter() - t0)}")
    return 0 if same else 1


def _command(name: str) -> str:
    """``name`` as a fresh shell finds it: the script beside this interpreter (``.venv/bin/name`` after
    ``make demo``), relative to the working directory when it is below it."""
    path = Path(sys.executable).parent / name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
