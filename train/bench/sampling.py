"""The continuous-batching decoder's draw, measured: ``python -m hybrid.train.bench.sampling``.

Each step of ``Decoder`` draws every live row's token with the row's own options and random generator. Rows that
share their options draw together (``Decoder._draw``: one batched distribution, one race, each row's exponentials
from its own generator); before 2026-11-28 each row drew alone (``sample_next`` on its row: the reference here).
For each vocabulary and batch size the table gives the microseconds a step (median, min–max over rounds, the two
alternating), their ratio, and the aten ops each dispatches: on a GPU, each op is about one kernel launch, and a
decode step is bound by its launches. The two give the same tokens, which the run checks.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.models import HybridConfig, HybridLM
from hybrid.models.decoding.decoder import Decoder, Request, _Slot
from hybrid.models.sampling import sample_next


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def each_row_alone(logits: torch.Tensor, slots: list, vocab_limit=None) -> torch.Tensor:
    """The reference: every row's ``sample_next`` on its own row, with its own options and generator."""
    token = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    for row, slot in enumerate(slots):
        r = slot.request
        token[row] = sample_next(logits[row:row + 1], r.temperature, r.top_k, r.top_p, slot.generator, vocab_limit)[0]
    return token


def measure(vocab: int, batch: int, rounds: int, steps: int, options: dict, seed: int) -> dict:
    """µs a step and ops of both ways of drawing ``batch`` rows over ``vocab`` ids (``steps`` draws a round)."""
    g = torch.Generator().manual_seed(seed)
    logits = 4 * torch.randn(batch, vocab, generator=g)  # (B, V): peaked enough that top-p keeps a few hundred ids

    def slots():
        return [_Slot(row, Request([0], 1, **options), torch.Generator().manual_seed(seed + row), 0.0)
                for row in range(batch)]
    # the draw reads nothing of the model but its vocabulary: a one-layer model of this one's
    decoder = Decoder(HybridLM(HybridConfig.preset("transformer", "tiny", n_layers=1, vocab_size=vocab)), batch)
    ways = {"together": lambda s: decoder._draw(logits, s), "alone": lambda s: each_row_alone(logits, s)}
    same = [torch.stack([way(s) for _ in range(steps)]) for way, s in ((ways["together"], slots()),
                                                                       (ways["alone"], slots()))]
    if not torch.equal(*same):
        raise AssertionError(f"vocab {vocab}, batch {batch}: the batched draw differs from each row's own draw")
    ops = {}
    for name, way in ways.items():
        with _CountOps() as count:
            way(slots())
        ops[name] = count.ops
    micros = {name: [] for name in ways}
    for r in range(rounds):
        for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            s = slots()
            start = time.perf_counter()
            for _ in range(steps):
                ways[name](s)
            micros[name].append((time.perf_counter() - start) / steps * 1e6)
    return dict(micros=micros, ops=ops, ratios=sorted(a / b for a, b in zip(micros["alone"], micros["together"])))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.sampling", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", default="259,32768", help="comma-separated vocabulary sizes (259: the byte tokenizer's)")
    p.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes (live rows)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="draws a round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    print(f"sampling: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}; {options}, {args.rounds} rounds of {args.steps} draws\n")
    print("| vocabulary | rows | each alone: µs a step | together: µs a step | alone / together | aten ops (alone → "
          "together) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for vocab in (int(v) for v in args.vocab.split(",")):
        for batch in (int(b) for b in args.batch.split(",")):
            m = measure(vocab, batch, args.rounds, args.steps, options, args.seed)
            r, ops = m["ratios"], m["ops"]
            print(f"| {vocab:,} | {batch} | {spread(m['micros']['alone'])} | {spread(m['micros']['together'])} | "
                  f"{statistics.median(r):.2f}× ({r[0]:.2f}–{r[-1]:.2f}) | {ops['alone']} → {ops['together']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
