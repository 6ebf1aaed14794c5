"""Context parallelism's cost: peak memory per rank, tokens/s, and the bytes each rank exchanges per layer
against the bytes its activations take, for one long sequence split across ``--cp`` ranks.

    python -m hybrid.train.bench.context_parallel                         # CPU: T = 16K, 32K, 64K; cp 1 and 2
    python -m hybrid.train.bench.context_parallel --lengths 16384 --cp 1,2,4 --threads 2 --out table.md
    python -m hybrid.train.bench.context_parallel --rounds 3 --reps 2     # cp sizes alternated, ratios with spread
    python -m hybrid.train.bench.context_parallel --device cuda --lengths 65536,131072 --cp 1,2,4,8   # one GPU a rank
    python -m hybrid.train.bench.context_parallel --pattern GGAG --lengths 16384    # the G mixer in place of R

One training step is forward + backward of the global token mean of the cross-entropy
(``HybridLM.forward(ids, shard=…)`` and ``global_token_mean``): the model the long-context table measures (the
hybrid preset, d_model 256, 4 layers "RRAR", 4 heads, window 256, byte vocabulary, B = 1, fp32); ``--pattern``
sets the layers (e.g. "GGAG": the G mixer, whose carry is a ``Dk × Dv`` matrix per head). Every (T, cp)
cell runs in its own processes, one per rank (a gloo group over a file store; ``--cp 1`` is one process, no
collectives). ``--threads`` intra-op threads are shared out among the ranks (2 on a 2-core machine: cp 1 runs
one process with 2 threads, cp 2 two processes with 1 thread each, so both use the whole machine).

Per cell: tokens/s = T / the median over ``--reps`` steps (after one warm-up step) of the slowest rank's step
time. ``--rounds R`` measures every cell R times, the cp sizes of one T one after the other in each round, and
reports the median tokens/s over the rounds and, per round, each cp size's speed as a ratio to the first one's
(median and range: on a shared machine only ratios measured side by side mean something). Peak memory = the largest peak resident set size over the ranks (``ru_maxrss``: it includes about
0.35 GB of interpreter and torch), and each rank's rise over its RSS before the step (``rise``). With
``--device cuda`` each rank takes GPU ``rank`` (NCCL) and the memory is ``torch.cuda.max_memory_allocated`` (rise:
over the memory allocated before the step). Per layer kind,
on one step: the bytes each rank's collectives received (forward and backward, ``count_traffic``) and the
bytes of the tensors its layer saved for the backward (``saved_tensors_hooks``, each storage counted once).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from hybrid.kernels.context_parallel import count_traffic, global_token_mean, shard_sequence
from hybrid.models import HybridConfig, HybridLM

DEFAULT_LENGTHS = (16384, 32768, 65536)


def build(args) -> HybridLM:
    pattern = {"pattern": args.pattern} if args.pattern else {}
    config = HybridConfig.preset("hybrid", "tiny", d_model=args.d_model, n_layers=args.n_layers,
                                 n_heads=args.n_heads, window=args.window, **pattern)
    torch.manual_seed(0)
    return HybridLM(config)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def saved_bytes_per_block(model: HybridLM, step) -> dict[int, int]:
    """The bytes of the tensors each block saves for the backward during ``step()`` (each storage once; the
    parameters, which autograd saves too, are not activations and are left out)."""
    current, per_block = [None], defaultdict(int)
    seen = {(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()) for p in model.parameters()}  # not these
    hooks = [block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i))
             for i, block in enumerate(model.blocks)]
    hooks.append(model.norm.register_forward_pre_hook(lambda m, a: current.__setitem__(0, None)))

    def pack(t):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if current[0] is not None and key not in seen and t.device.type != "meta":
            seen.add(key)
            per_block[current[0]] += storage.nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
    finally:
        for h in hooks:
            h.remove()
    return dict(per_block)


def measure_cell(args) -> dict:
    """One rank of one (T, cp) cell (runs in the child process)."""
    torch.set_num_threads(args.threads_per_rank)
    device = torch.device("cuda", args.rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = None
    if args.world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=args.rank, world_size=args.world,
                                store=dist.FileStore(args.store, args.world))
        group = dist.group.WORLD
    model = build(args).to(device)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq_len + 1), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    shard = shard_sequence(args.seq_len, group)
    inputs, targets = shard.take(ids[:, :-1]), shard.take(ids[:, 1:])

    def step():
        logits, _ = model(inputs, shard=shard, output_final_state=False)
        loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        share, _ = global_token_mean(loss_sum, targets.numel(), shard)
        share.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def barrier():
        if group is not None:
            torch.distributed.barrier(group)

    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else _rss()
    barrier()
    with count_traffic() as traffic:
        step()  # warm-up, and the bytes exchanged
    times = []
    for _ in range(args.reps):
        barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    saved = saved_bytes_per_block(model, step)
    layers = model.config.layer_types
    exchanged = defaultdict(lambda: [0, 0])  # label -> [forward, backward]
    for (label, direction), nbytes in traffic.by_label.items():
        exchanged[label][direction == "backward"] += nbytes
    if group is not None:
        torch.distributed.barrier(group)
        torch.distributed.destroy_process_group()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"rank": args.rank, "world": args.world, "seq_len": args.seq_len, "layers": layers, "times": times,
            "peak_bytes": peak, "rss_before": before,
            "exchanged": dict(exchanged), "saved_per_block": {str(k): v for k, v in saved.items()}}


def run_cell(args, seq_len: int, world: int) -> dict:
    """Start ``world`` ranks of one cell and merge what they report."""
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        common = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                  ("device", "d_model", "n_layers", "n_heads", "window", "reps")]
        common += [f"--pattern={args.pattern}"] if args.pattern else []
        threads = max(1, args.threads // world)
        procs = [subprocess.Popen([sys.executable, "-m", "hybrid.train.bench.context_parallel", "--cell",
                                   f"--seq-len={seq_len}", f"--world={world}", f"--rank={rank}", f"--store={store}",
                                   f"--threads-per-rank={threads}", *common],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": str(threads)})
                 for rank in range(world)]
        outs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        err = next(e for p, (_, e) in zip(procs, outs) if p.returncode)
        return {"seq_len": seq_len, "world": world, "error": (err.strip().splitlines() or ["no output"])[-1]}
    ranks = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    steps = [max(r["times"][i] for r in ranks) for i in range(args.reps)]  # a step ends when its slowest rank does
    seconds = statistics.median(steps)
    return {"seq_len": seq_len, "world": world, "layers": ranks[0]["layers"], "tokens_per_s": seq_len / seconds,
            "spread": (min(steps) / seconds, max(steps) / seconds),
            "peak_bytes": max(r["peak_bytes"] for r in ranks),
            "rise_bytes": max(r["peak_bytes"] - r["rss_before"] for r in ranks), "ranks": ranks}


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f} GB"


def _mb(n: float) -> str:
    return f"{n / 2**20:.3g} MB" if n >= 2**20 else f"{n / 2**10:.3g} KB"


def _machine(args) -> str:
    if args.device == "cuda":
        return f"one {torch.cuda.get_device_name(0)} per rank"
    return f"{platform.machine()} CPU, {args.threads} threads shared by the ranks"


def _memory(args) -> str:
    return "peak allocated" if args.device == "cuda" else "peak RSS"


def merge_rounds(rounds: list[dict]) -> dict:
    """One cell measured in several rounds: median tokens/s, the largest memory, the first round's traffic."""
    good = [c for c in rounds if "error" not in c]
    if not good:
        return rounds[0]
    merged = dict(good[0])
    merged["tokens_per_s"] = statistics.median(c["tokens_per_s"] for c in good)
    merged["per_round"] = [c["tokens_per_s"] for c in good]
    merged["peak_bytes"] = max(c["peak_bytes"] for c in good)
    merged["rise_bytes"] = max(c["rise_bytes"] for c in good)
    return merged


def ratio_rows(cells: dict) -> list[str]:
    """Per T and cp size: its tokens/s over the first cp size's, round by round (median, min–max)."""
    lines = []
    for (t, world), c in cells.items():
        first = cells[t, next(w for (tt, w) in cells if tt == t)]
        if "per_round" not in c or "per_round" not in first or c is first:
            continue
        ratios = [a / b for a, b in zip(c["per_round"], first["per_round"])]
        lines.append(f"| {t} | {world} | {statistics.median(ratios):.2f} | {min(ratios):.2f} – {max(ratios):.2f} | "
                     f"{len(ratios)} |")
    return lines


def tables(args, cells: dict) -> list[str]:
    lines = [f"Training forward+backward of the hybrid (d_model {args.d_model}, {args.n_layers} layers"
             + (f" \"{args.pattern}\"" if args.pattern else "") + ", "
             f"{args.n_heads} heads, window {args.window}), B=1, fp32, {_machine(args)}, torch {torch.__version__}; "
             f"median of {args.reps} steps (slowest rank)"
             + (f", then the median over {args.rounds} rounds" if args.rounds > 1 else "")
             + "; each cell in its own processes", "",
             f"| T | cp | tokens/s | spread (min/max ÷ median) | {_memory(args)} per rank | rise per rank |",
             "|---:|---:|---:|---|---:|---:|"]
    for (t, world), c in cells.items():
        if "error" in c:
            lines.append(f"| {t} | {world} | failed: {c['error']} | | | |")
            continue
        lo, hi = c["spread"]  # over the steps of one run; over the rounds when there are several
        if len(c.get("per_round", ())) > 1:
            lo, hi = min(c["per_round"]) / c["tokens_per_s"], max(c["per_round"]) / c["tokens_per_s"]
        lines.append(f"| {t} | {world} | {c['tokens_per_s']:,.0f} | {lo:.2f} / {hi:.2f} | {_gb(c['peak_bytes'])} | "
                     f"{_gb(c['rise_bytes'])} |")
    ratios = ratio_rows(cells)
    if ratios:
        lines += ["", "tokens/s against the first cp size's, measured side by side in each round", "",
                  "| T | cp | ratio (median) | range | rounds |", "|---:|---:|---:|---|---:|", *ratios]
    lines += ["", "Per layer, one step: the bytes a rank's collectives received, forward and backward (each the most "
              "over the ranks: the last rank receives the halo, the first its gradient), against the bytes the layer "
              "block (norms, mixer, MLP) saved for the backward (the most over the ranks)", "",
              "| T | cp | layer | received forward | received backward | saved activations | ratio |",
              "|---:|---:|---|---:|---:|---:|---:|"]
    kinds = {"R": ("conv halo", "scan carry"), "A": ("attention halo",), "M": ("retention carry",),
             "G": ("conv halo", "gla carry")}
    for (t, world), c in cells.items():
        if "error" in c or world == 1:
            continue
        layers = c["layers"]
        # a label's bytes are the model's total: shared out among the layers that exchange it (R and G: conv halo)
        sharing = {lbl: sum(lbl in kinds[k] for k in layers) for k in set(layers) for lbl in kinds[k]}
        for kind in dict.fromkeys(layers):
            fwd, bwd = (max(sum(r["exchanged"].get(lbl, [0, 0])[d] / sharing[lbl] for lbl in kinds[kind])
                            for r in c["ranks"]) for d in (0, 1))
            saved = max(statistics.mean(r["saved_per_block"].get(str(i), 0) for i, k in enumerate(layers) if k == kind)
                        for r in c["ranks"])
            lines.append(f"| {t} | {world} | {kind} | {_mb(fwd)} | {_mb(bwd)} | {_mb(saved)} | "
                         f"{(fwd + bwd) / saved:.2e} |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    p.add_argument("--cp", default="1,2", help="context-parallel sizes (ranks per sequence)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads in all, shared out among the ranks")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--pattern", default=None, help="the layers' pattern (default the hybrid preset's, RRAR)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="measure every cell this many times, cp sizes alternated")
    p.add_argument("--out", default=None, help="also write the tables (markdown) here")
    for hidden in ("--seq-len", "--world", "--rank", "--threads-per-rank"):
        p.add_argument(hidden, type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("context_parallel: --device cuda asked for but no CUDA device is visible")
    if args.cell:
        print(json.dumps(measure_cell(args)))
        return
    measured = defaultdict(list)
    for seq_len in (int(t) for t in args.lengths.split(",")):
        for round_ in range(args.rounds):
            for world in (int(w) for w in args.cp.split(",")):
                measured[seq_len, world].append(c := run_cell(args, seq_len, world))
                done = f"{c['tokens_per_s']:,.0f} tok/s, {_gb(c['peak_bytes'])}" if "error" not in c else c["error"]
                print(f"  T={seq_len:6d} cp={world} round {round_ + 1}  {done}", file=sys.stderr, flush=True)
    cells = {key: merge_rounds(rounds) for key, rounds in measured.items()}
    lines = tables(args, cells)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
