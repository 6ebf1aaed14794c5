"""What ``--compile`` costs at the start of a run and what it gives per step: the whole model under
``torch.compile`` against each block compiled (``CompiledBlocks``, what ``hybrid-train --compile`` runs), and eager.

    python -m hybrid.train.bench.compile_time                       # transformer and hybrid, gpu-long's shape
    python -m hybrid.train.bench.compile_time --presets hybrid --rounds 1 --seq-len 128

Each (preset, way) runs in a process of its own with Inductor's caches off, so that every first step compiles from
nothing, as on a fresh GPU machine; the ways alternate their order from round to round. A step is the trainer's:
forward on a packed batch (the trainer's default packing, a new document count every step, offsets handed over
as the trainer does), cross-entropy, backward (bf16 autocast on CUDA). Reported per way: the first step (the
compile), the second, the median of the later steps, and the graphs Dynamo built.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

WAYS = ("eager", "whole model", "blocks")


def _child(args) -> dict:
    import torch
    import torch.nn.functional as F

    import torch._dynamo.utils as dynamo_utils

    from hybrid.models import CompiledBlocks, HybridConfig, HybridLM
    from hybrid.train.data.packing import packed_on_device
    from hybrid.train.loop.run import precision
    from hybrid.train.parallel.device import resolve_device

    dynamo_utils.counters.clear()  # this process's graphs alone (the counters are global)
    device = resolve_device(args.device)
    extra = {"window": args.window} if args.preset == "hybrid" else {}
    config = HybridConfig.preset(args.preset, "small", d_model=args.d_model, n_layers=args.n_layers,
                                 n_heads=args.n_heads, vocab_size=args.vocab_size, **extra)
    torch.manual_seed(0)
    model = HybridLM(config).to(device).train()
    if args.way == "whole model":  # offsets as a model compiled whole takes them (the tensor, marked dynamic)
        run = torch.compile(model)
    elif args.way == "blocks":
        run = CompiledBlocks(model)
    else:
        run = model
    autocast, _ = precision(device)  # the trainer's: bf16 on CUDA
    g = torch.Generator().manual_seed(1)
    total = args.batch * args.seq_len
    times = []
    for step in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (1, total + 1), generator=g)
        n = 2 + step % 5  # a new document count every step, as the trainer's packed rows
        cuts = sorted(torch.randperm(total - 1, generator=g)[: n - 1].add(1).tolist())
        cu = packed_on_device(torch.tensor([0, *cuts, total]), device, compiled=args.way == "whole model")
        x, y = ids[:, :-1].to(device), ids[:, 1:].to(device)
        start = time.perf_counter()
        with autocast():
            logits, _ = run(x, cu_seqlens=cu, output_final_state=False)
        F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return dict(first_s=times[0], second_s=times[1], step_ms=statistics.median(times[2:]) * 1e3,
                graphs=dynamo_utils.counters["stats"]["unique_graphs"], device=str(device),
                layer_types=config.layer_types, torch=torch.__version__)


def _measure(args, preset: str, way: str) -> dict:
    argv = [sys.executable, "-m", "hybrid.train.bench.compile_time", "--child", way, "--presets", preset,
            *[f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
              ("d_model", "n_layers", "n_heads", "vocab_size", "window", "seq_len", "batch", "steps",
               "device")]]
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{preset}, {way}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else \
        f"{values[0]:.2f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.compile_time", description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="transformer,hybrid", help="comma-separated presets (default: %(default)s)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=8)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=320, help="the byte tokenizer's rounded size (gpu-long)")
    p.add_argument("--window", type=int, default=64, help="the hybrid's attention window")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per packed row")
    p.add_argument("--batch", type=int, default=2, help="rows laid end to end in one packed batch")
    p.add_argument("--steps", type=int, default=6, help="steps per process (at least 3)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 3:
        p.error(f"--steps: expected at least 3 (the first, the second and the steady steps), got {args.steps}")
    if args.child:
        args.way, args.preset = args.child, args.presets
        print(json.dumps(_child(args)))
        return
    print(f"# --compile's cost: d_model {args.d_model}, {args.n_layers} layers, packed {args.batch} × "
          f"{args.seq_len} tokens, {args.steps} steps a process, {args.rounds} rounds; {platform.processor() or ''} "
          f"{os.cpu_count()} CPUs\n")
    print("| preset | way | first step s | second step s | later steps ms | graphs |")
    print("|---|---|---:|---:|---:|---:|")
    for preset in args.presets.split(","):
        results = {way: [] for way in WAYS}
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                results[way].append(_measure(args, preset, way))
        for way in WAYS:
            rows = results[way]
            print(f"| {preset} ({rows[0]['layer_types']}) | {way} | {_spread([x['first_s'] for x in rows])} | "
                  f"{_spread([x['second_s'] for x in rows])} | {_spread([x['step_ms'] for x in rows])} | "
                  f"{rows[0]['graphs']} |", flush=True)
        whole, blocks = results["whole model"], results["blocks"]
        ratios = [w["first_s"] / b["first_s"] for w, b in zip(whole, blocks)]
        print(f"| {preset} | whole ÷ blocks, first step | {_spread(ratios)}× | | | |", flush=True)


if __name__ == "__main__":
    main()
