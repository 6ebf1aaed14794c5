"""Packed sequences (``cu_seqlens``): what packing costs or saves, measured side by side in one process.

    python -m hybrid.train.bench.packing padded        # training tokens/s: packed vs padded to the longest
    python -m hybrid.train.bench.packing hf            # HybridForCausalLM on a padded batch of 16: before / after
    python -m hybrid.train.bench.packing state         # T = 8192: building the decoding state in training or not
    python -m hybrid.train.bench.packing compile       # hybrid training: torch.compile(fullgraph=True) vs eager
    python -m hybrid.train.bench.packing overhead      # the demo's batches: --packing documents vs stream
    python -m hybrid.train.bench.packing resets        # the demo's val bpb with and without document resets

Every timing alternates its contenders round by round (so a load change hits both alike) and reports the
median ratio with its min–max spread over the rounds. ``state`` runs each contender in a process of its own,
for its peak resident memory (``ru_maxrss``). ``resets`` trains the demo recipe once per (packing, seed):
about 5 minutes each on two idle cores.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hybrid.models import HybridConfig, HybridLM


def _model(preset: str, d_model: int = 128, n_layers: int = 4, window: int = 64) -> HybridLM:
    extra = {"window": window} if preset == "hybrid" else {}
    torch.manual_seed(0)
    return HybridLM(HybridConfig.preset(preset, "tiny", d_model=d_model, n_layers=n_layers, **extra)).train()


def _rounds(contenders: dict, rounds: int) -> dict:
    """Seconds of each contender per round, alternating; one warm-up call each first."""
    for fn in contenders.values():
        fn()
    times = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders.items()) if r % 2 == 0 else list(contenders.items())[::-1]
        for name, fn in order:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _ratio(times: dict, slow: str, fast: str) -> str:
    ratios = sorted(a / b for a, b in zip(times[slow], times[fast]))
    return f"{statistics.median(ratios):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f})"


def stdlib_document_lengths(n: int, cap: int, seed: int) -> list[int]:
    """Lengths in bytes (= byte tokens) of ``n`` random files of this Python's standard library (its ``.py``
    files, recursively), drawn from those of at most ``cap`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    sizes = sorted(s for s in (p.stat().st_size for p in root.rglob("*.py")) if 0 < s <= cap)
    rng = random.Random(seed)
    return [rng.choice(sizes) for _ in range(n)]


def bench_padded(args) -> list[str]:
    """Training step on the same documents: packed into one row with ``cu_seqlens``, or padded to the longest
    (pads masked from the loss). tokens/s counts real tokens only."""
    lines = ["| model | docs/step | real tokens/step | padded tokens/step | packed tok/s | padded tok/s | packed ÷ padded |",
             "|---|---|---|---|---|---|---|"]
    for preset in args.presets.split(","):
        model = _model(preset)
        lengths = stdlib_document_lengths(args.docs, args.cap, seed=0)
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(0)
        docs = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
        packed = torch.cat(docs).unsqueeze(0)  # (1, Σ L)
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
        longest = max(lengths)
        padded = torch.stack([F.pad(d, (0, longest - d.numel())) for d in docs])  # (N, longest)
        keep = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]  # (N, longest)

        def step_packed():
            logits, _ = model(packed, cu_seqlens=cu, output_final_state=False)
            F.cross_entropy(logits[0, :-1], packed[0, 1:]).backward()
            model.zero_grad(set_to_none=True)

        def step_padded():
            logits, _ = model(padded, output_final_state=False)
            F.cross_entropy(logits[:, :-1][keep[:, 1:]], padded[:, 1:][keep[:, 1:]]).backward()
            model.zero_grad(set_to_none=True)

        times = _rounds({"packed": step_packed, "padded": step_padded}, args.rounds)
        real = sum(lengths)
        tps = {k: real / statistics.median(v) for k, v in times.items()}
        lines.append(f"| {preset} | {len(lengths)} | {real:,} | {len(lengths) * longest:,} | {tps['packed']:,.0f} | "
                     f"{tps['padded']:,.0f} | {_ratio(times, 'padded', 'packed')} |")
    return lines


def bench_hf(args) -> list[str]:
    """``HybridForCausalLM`` forward on a padded batch of 16 random lengths (left padding, a fresh cache, as
    ``generate``'s prefill): one forward per padding pattern (before) against one packed forward (after)."""
    from hybrid.models.hf import HybridForCausalLM, HybridHFConfig

    lines = ["| model | batch | lengths | per-pattern forward (before) | packed forward (after) | speed-up |",
             "|---|---|---|---|---|---|"]
    for preset in args.presets.split(","):
        extra = {"window": 64} if preset == "hybrid" else {}
        torch.manual_seed(0)
        hf = HybridForCausalLM(HybridHFConfig(HybridConfig.preset(preset, "tiny", **extra))).eval()
        rng = random.Random(0)
        lengths = [rng.randint(16, args.cap) for _ in range(16)]
        T = max(lengths)
        ids = torch.randint(0, 256, (16, T))
        mask = torch.zeros(16, T, dtype=torch.long)
        for i, n in enumerate(lengths):
            mask[i, T - n:] = 1  # left padding

        @torch.no_grad()
        def before():  # what the wrapper did before packing: one forward per distinct padding pattern
            patterns, inverse = torch.unique(mask.bool(), dim=0, return_inverse=True)
            for g in range(patterns.shape[0]):
                rows, positions = (inverse == g).nonzero().flatten(), patterns[g].nonzero().flatten()
                hf.model(ids[rows][:, positions])

        @torch.no_grad()
        def after():
            hf(ids, attention_mask=mask, use_cache=True)

        times = _rounds({"before": before, "after": after}, args.rounds)
        lines.append(f"| {preset} | 16 | {min(lengths)}–{max(lengths)} | {statistics.median(times['before']) * 1e3:.0f} ms | "
                     f"{statistics.median(times['after']) * 1e3:.0f} ms | {_ratio(times, 'before', 'after')} |")
    return lines


def _state_cell(preset: str, seq_len: int, build_state: bool, reps: int) -> dict:
    """In a child process: training steps at (1, seq_len) with or without the decoding state."""
    model = _model(preset)
    ids = torch.randint(0, model.config.vocab_size, (1, seq_len))

    def step():
        logits, state = model(ids, output_final_state=build_state)
        F.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()
        model.zero_grad(set_to_none=True)
        return state

    step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"tokens_per_s": seq_len / statistics.median(times), "times": times,
            "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def bench_state(args) -> list[str]:
    lines = ["| model | T | state built (before): tok/s, peak RSS | no state (after): tok/s, peak RSS | speed ratio | memory saved |",
             "|---|---|---|---|---|---|"]
    for preset in args.presets.split(","):
        cells = {}
        for build in (True, False):
            cmd = [sys.executable, "-m", "hybrid.train.bench.packing", "_state_cell", "--presets", preset,
                   "--seq-len", str(args.seq_len), "--rounds", str(args.rounds)] + (["--build-state"] if build else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            cells[build] = json.loads(proc.stdout.strip().splitlines()[-1])
        b, a = cells[True], cells[False]
        ratios = sorted(x / y for x, y in zip(b["times"], a["times"]))
        lines.append(f"| {preset} | {args.seq_len} | {b['tokens_per_s']:,.0f}, {b['peak_bytes'] / 2**20:,.0f} MiB | "
                     f"{a['tokens_per_s']:,.0f}, {a['peak_bytes'] / 2**20:,.0f} MiB | "
                     f"{statistics.median(ratios):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}) | "
                     f"{(b['peak_bytes'] - a['peak_bytes']) / 2**20:,.0f} MiB |")
    return lines


def bench_compile(args) -> list[str]:
    """Training steps of the hybrid, eager against ``torch.compile(model, fullgraph=True)`` (inductor)."""
    lines = ["| model | B×T | eager tok/s | compiled tok/s | compiled ÷ eager | compile time |", "|---|---|---|---|---|---|"]
    for preset in args.presets.split(","):
        model = _model(preset)
        compiled = torch.compile(model, fullgraph=True)
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len))

        def make(m):
            def step():
                logits, _ = m(ids, output_final_state=False)
                F.cross_entropy(logits.flatten(0, 1)[:-1], ids.flatten()[1:]).backward()
                model.zero_grad(set_to_none=True)
            return step

        start = time.perf_counter()
        make(compiled)()
        compile_s = time.perf_counter() - start
        times = _rounds({"eager": make(model), "compiled": make(compiled)}, args.rounds)
        tps = {k: args.batch * args.seq_len / statistics.median(v) for k, v in times.items()}
        lines.append(f"| {preset} | {args.batch}×{args.seq_len} | {tps['eager']:,.0f} | {tps['compiled']:,.0f} | "
                     f"{_ratio(times, 'eager', 'compiled')} | {compile_s:.0f} s |")
    return lines


def bench_overhead(args) -> list[str]:
    """What document resets cost per training step: the demo's batches (16 × 256 tokens of the stdlib stream),
    run as ``--packing documents`` (one packed row, offsets at every window start and eos) and as ``stream``."""
    from hybrid.train.data import prepare_data
    from hybrid.train.data.packing import pack_documents

    data = prepare_data(None)
    loader = data.train_loader(256, 16, seed=0)
    batches = [next(loader) for _ in range(args.rounds + 1)]
    lines = ["| model | documents per batch (mean) | documents tok/s | stream tok/s | documents ÷ stream |",
             "|---|---|---|---|---|"]
    for preset in args.presets.split(","):
        model = _model(preset)
        state = {"i": 0}
        counts = []

        def step(packing):
            x, y = batches[state["i"] % len(batches)]
            cu = None
            if packing == "documents":
                x, y, cu = pack_documents(x, y, data.tokenizer.eos_id)
                counts.append(cu.numel() - 1)
            logits, _ = model(x, cu_seqlens=cu, output_final_state=False)
            F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
            model.zero_grad(set_to_none=True)

        def documents():
            step("documents")

        def stream():
            step("stream")
            state["i"] += 1

        times = _rounds({"documents": documents, "stream": stream}, args.rounds)
        tps = {k: 16 * 256 / statistics.median(v) for k, v in times.items()}
        lines.append(f"| {preset} | {statistics.mean(counts):.1f} | {tps['documents']:,.0f} | {tps['stream']:,.0f} | "
                     f"{_ratio(times, 'stream', 'documents')} |")
    return lines


def bench_resets(args) -> list[str]:
    """The demo recipe (``hybrid.train.demo.RECIPE``) with ``--packing documents`` and ``stream``, per seed."""
    from hybrid.train.demo import RECIPE
    from hybrid.train.lm.trainer import Trainer
    from hybrid.train.lm.config import TrainConfig

    lines = ["| packing | seed | val bpb (whole split, scored as trained) | tokens/s |", "|---|---|---|---|"]
    results = {}
    for seed in range(args.seeds):
        for packing in ("documents", "stream"):
            out = Path(args.out_dir) / f"{packing}-seed{seed}"
            config = TrainConfig(**{**RECIPE, "steps": args.steps}, packing=packing, seed=seed, out=str(out),
                                 device="cpu")
            start = time.perf_counter()
            result = Trainer(config, overwrite=True, verbose=0).fit()
            seconds = time.perf_counter() - start
            results.setdefault(packing, []).append(result.val_bpb)
            tokens = args.steps * RECIPE["batch_size"] * RECIPE["seq_len"]
            lines.append(f"| {packing} | {seed} | {result.val_bpb:.4f} | {tokens / seconds:,.0f} (with evaluations) |")
            print(lines[-1], flush=True)
    diffs = [d - s for d, s in zip(results["documents"], results["stream"])]
    lines.append(f"\ndocuments − stream: {', '.join(f'{d:+.4f}' for d in diffs)} bpb (per seed)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.packing", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("part", choices=["padded", "hf", "state", "compile", "overhead", "resets", "_state_cell"])
    p.add_argument("--presets", default="hybrid,transformer")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--docs", type=int, default=16, help="documents per step (padded)")
    p.add_argument("--cap", type=int, default=1024, help="longest document, in tokens (padded, hf)")
    p.add_argument("--seq-len", type=int, default=None, help="state: T (default 8192); compile: T per row (default 256)")
    p.add_argument("--batch", type=int, default=16, help="compile: rows (default 16: the demo's batch)")
    p.add_argument("--build-state", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=1200, help="resets: training steps per run")
    p.add_argument("--seeds", type=int, default=2, help="resets: seeds")
    p.add_argument("--out-dir", default="runs/bench-resets", help="resets: where the runs go")
    args = p.parse_args(argv)
    if args.seq_len is None:
        args.seq_len = 256 if args.part == "compile" else 8192
    if args.part == "_state_cell":
        print(json.dumps(_state_cell(args.presets, args.seq_len, args.build_state, args.rounds)))
        return 0
    parts = {"padded": bench_padded, "hf": bench_hf, "state": bench_state, "compile": bench_compile,
             "overhead": bench_overhead, "resets": bench_resets}
    header = (f"{args.part}: torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
              f"{time.strftime('%Y-%m-%d')}")
    lines = parts[args.part](args)
    print(header)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
