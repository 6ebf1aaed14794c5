"""Decoding many sequences at once (issue 45), measured: ``python -m hybrid.train.bench.decoding PART``.

    ragged        batch 16, prompt lengths drawn from 16 … 2048: decode tokens/s, rows grouped by prompt length
                  (one batch per length, the Hugging Face wrapper's "streams" before) against one ragged batch
    continuous    N requests of mixed prompt and output lengths through the Decoder at max_batch 1, 8, 32:
                  tokens/s and mean latency (every request submitted at the start)
    speculative   a draft and a target run (trained checkpoints): acceptance rate and tokens/s at k = 2, 4, 8
                  against the target alone (greedy, one prompt at a time)
    compiled      ``generate(..., compile=True)`` against eager decode steps: decode tokens/s after one prefill,
                  the compile's seconds apart (the first compiled call)

``ragged``, ``continuous`` and ``compiled`` time untrained models of the ``small`` size (the cost does not depend on
the weights: every request runs to its max_new_tokens, no stop token): the hybrid, the windowed Transformer (window
512) and the global Transformer. Contenders alternate round by round; each table gives medians with the min–max over
rounds.
"""
from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from hybrid.models import HybridConfig, HybridLM, HybridState
from hybrid.models.decoding.decoder import Decoder, Request
from hybrid.models.decoding.speculative import speculative_decode
from hybrid.models.generation import generate

MODELS = {
    "hybrid": dict(preset="hybrid"),
    "windowed Transformer": dict(preset="transformer", window=512),
    "global Transformer": dict(preset="transformer"),
}
PROMPTS = [  # the speculative part's prompts: starts of Python code (the demo corpus is Python's stdlib)
    "class Point:\n    def __init__(self", "import os\nimport sys\n\n\ndef main(", "    def __repr__(self):\n",
    "for i in range(len(", "def read_config(path):\n    \"\"\"", "        except KeyError:\n            raise",
    "if __name__ == \"__main__\":\n", "    @property\n    def name(self):\n        return self.",
]


def model_of(name: str, size: str = "small") -> HybridLM:
    spec = dict(MODELS[name])
    torch.manual_seed(0)
    return HybridLM(HybridConfig.preset(spec.pop("preset"), size, **spec)).eval()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}–{max(values):,.1f})"


# ------------------------------------------------------------------------------------------ ragged


@torch.no_grad()
def bench_ragged(args) -> list[str]:
    """Decode ``args.tokens`` tokens for 16 prompts of random lengths from their prefilled states, as one batch per
    distinct prompt length (before) or one ragged batch (after); the prefill (one packed forward) is common."""
    rng = random.Random(args.seed)
    lengths = [rng.randint(16, args.max_length) for _ in range(args.batch)]
    lines = [f"prompt lengths {sorted(lengths)} (seed {args.seed}), {args.tokens} new tokens per row", "",
             "| model | prefill (s) | streams: decode tok/s (before) | one batch: decode tok/s (after) | after ÷ before |",
             "|---|---|---|---|---|"]
    for name in args.models.split(","):
        model = model_of(name, args.size)
        V = model.config.vocab_size
        g = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(0, V, (n,), generator=g) for n in lengths]
        tokens = torch.randint(0, V, (args.batch, args.tokens), generator=g)  # the tokens fed, alike for both
        start = time.perf_counter()
        _, states = model(torch.cat(prompts)[None], cu_seqlens=torch.tensor([0, *torch.tensor(lengths).cumsum(0)]))
        prefill_s = time.perf_counter() - start
        groups = {}
        for row, n in enumerate(lengths):
            groups.setdefault(n, []).append(row)

        def streams():  # one batch (a HybridState at one position) per distinct prompt length
            group_states = {n: HybridState.cat([states[r].clone() for r in rows]) for n, rows in groups.items()}
            start = time.perf_counter()
            for t in range(args.tokens):
                for n, rows in groups.items():
                    _, group_states[n] = model(tokens[rows, t:t + 1], state=group_states[n])
            return time.perf_counter() - start

        def one_batch():  # the rows at their own positions, one forward per token
            state = HybridState.cat([s.clone() for s in states])
            start = time.perf_counter()
            for t in range(args.tokens):
                _, state = model(tokens[:, t:t + 1], state=state)
            return time.perf_counter() - start

        times = {"before": [], "after": []}
        for r in range(args.rounds):
            order = [("before", streams), ("after", one_batch)]
            for key, fn in (order if r % 2 == 0 else order[::-1]):
                times[key].append(fn())
        rate = {k: [args.batch * args.tokens / s for s in v] for k, v in times.items()}
        ratios = sorted(b / a for a, b in zip(times["after"], times["before"]))
        lines.append(f"| {name} | {prefill_s:.1f} | {spread(rate['before'])} | {spread(rate['after'])} | "
                     f"{statistics.median(ratios):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}) |")
    return lines


# ------------------------------------------------------------------------------------------ continuous


def mixed_requests(n: int, seed: int, max_prompt: int, max_new: int, vocab: int) -> list[Request]:
    """``n`` greedy requests, prompt lengths uniform in 16 … max_prompt, output lengths uniform in 16 … max_new."""
    rng = random.Random(seed)
    return [Request(prompt=[rng.randrange(vocab) for _ in range(rng.randint(16, max_prompt))],
                    max_new_tokens=rng.randint(16, max_new), temperature=0) for _ in range(n)]


@torch.no_grad()
def bench_continuous(args) -> list[str]:
    batches = [int(b) for b in args.max_batch.split(",")]
    lines = [f"{args.requests} requests, prompts of 16 … {args.max_prompt} tokens, 16 … {args.max_new} new tokens each "
             f"(seed {args.seed}), all submitted at the start", "",
             "| model | max_batch | tokens/s | mean latency (s) | mean time in flight (s) | wall (s) |", "|---|---|---|---|---|---|"]
    for name in args.models.split(","):
        model = model_of(name, args.size)
        requests = mixed_requests(args.requests, args.seed, args.max_prompt, args.max_new, model.config.vocab_size)
        results = {b: {"tps": [], "latency": [], "flight": [], "wall": []} for b in batches}
        for r in range(args.rounds):
            for b in (batches if r % 2 == 0 else batches[::-1]):
                start = time.perf_counter()
                done = list(Decoder(model, b).run(requests))
                wall = time.perf_counter() - start
                new = sum(c.tokens.numel() for c in done)
                results[b]["tps"].append(new / wall)
                results[b]["latency"].append(statistics.mean(c.finished - start for c in done))
                results[b]["flight"].append(statistics.mean(c.finished - c.started for c in done))
                results[b]["wall"].append(wall)
        for b in batches:
            res = results[b]
            lines.append(f"| {name} | {b} | {spread(res['tps'])} | {spread(res['latency'])} | {spread(res['flight'])} | "
                         f"{spread(res['wall'])} |")
    return lines


# ------------------------------------------------------------------------------------------ speculative


@torch.no_grad()
def bench_speculative(args) -> list[str]:
    from hybrid.models.decoding.speculative import draft_from_layers
    from hybrid.train.lm.inference import load_run

    target = load_run(args.target)
    if args.draft.startswith("layers:"):  # the target's first N layers (weights shared)
        draft_model, draft_name, draft_step = draft_from_layers(target.model, int(args.draft[7:])), args.draft, target.step
    else:
        draft = load_run(args.draft)
        draft_model, draft_name, draft_step = draft.model, args.draft, draft.step
    tok = target.tokenizer
    prompts = [torch.tensor(tok.document_start + tok.encode(p)) for p in PROMPTS[:args.prompts]]
    ks = [int(k) for k in args.lookahead.split(",")]
    contenders = ["target alone", *[f"k = {k}" for k in ks]]
    seconds = {c: [] for c in contenders}
    accepted = {k: [0, 0, 0] for k in ks}  # proposals, accepted, target forwards
    produced = {c: 0 for c in contenders}
    for r in range(args.rounds):
        for c in (contenders if r % 2 == 0 else contenders[::-1]):
            total = 0.0
            for p in prompts:
                start = time.perf_counter()
                if c == "target alone":
                    out = generate(target.model, p[None], args.tokens, temperature=0)[0, len(p):]
                else:
                    k = int(c.split()[-1])
                    (out,), stats = speculative_decode(target.model, draft_model, [p], args.tokens, k, temperature=0)
                    if r == 0:
                        accepted[k][0] += stats.proposed
                        accepted[k][1] += stats.accepted
                        accepted[k][2] += stats.rounds
                total += time.perf_counter() - start
                if r == 0:
                    produced[c] += out.numel()
            seconds[c].append(total)
    alone = seconds["target alone"]
    lines = [f"target {args.target} ({target.model.num_parameters():,} parameters, step {target.step}), draft "
             f"{draft_name} ({draft_model.num_parameters():,} parameters, step {draft_step}); {len(prompts)} prompts, "
             f"{args.tokens} greedy tokens each, one prompt at a time", "",
             "| decoding | acceptance rate | tokens per target forward | tokens/s | speed-up over the target alone |",
             "|---|---|---|---|---|"]
    for c in contenders:
        rate = [produced[c] / s for s in seconds[c]]
        ratios = sorted(a / s for a, s in zip(alone, seconds[c]))
        if c == "target alone":
            acc, per = "—", "1.00"
        else:
            proposed, ok, forwards = accepted[int(c.split()[-1])]
            acc, per = f"{ok / proposed:.3f}", f"{produced[c] / forwards:.2f}"
        lines.append(f"| {c} | {acc} | {per} | {spread(rate)} | {statistics.median(ratios):.2f}× "
                     f"({ratios[0]:.2f}–{ratios[-1]:.2f}) |")
    return lines


# ------------------------------------------------------------------------------------------ compiled


@torch.no_grad()
def bench_compiled(args) -> list[str]:
    """Greedy decode steps of a batch after one prefill, eager and under ``torch.compile`` (``decode_step``): each
    round times ``args.tokens`` steps from a copy of the prefilled state; the first compiled call (which compiles)
    is timed apart."""
    from hybrid.models.decoding import decode_step

    how = f"backend {args.backend}" + (f", mode {args.mode}" if args.mode else "")
    lines = [f"batch {args.batch}, a prompt of {args.prompt} tokens, {args.tokens} greedy decode steps per round; "
             f"torch.compile {how}", "",
             "| model | eager: decode tok/s | compiled: decode tok/s | compiled ÷ eager | first compiled call (s) |",
             "|---|---|---|---|---|"]
    for name in args.models.split(","):
        model = model_of(name, args.size)
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt),
                            generator=torch.Generator().manual_seed(args.seed))
        logits, prefilled = model(ids)
        first = logits[:, -1].argmax(-1)
        options = {"backend": args.backend, **({"mode": args.mode} if args.mode else {})}
        steps = {"eager": model, "compiled": decode_step(model, options)}

        def decode(step, n: int) -> float:
            token, state = first[:, None], prefilled.clone()
            start = time.perf_counter()
            for _ in range(n):
                logits, state = step(token, state=state)  # (B, 1, V)
                token = logits[:, -1:].argmax(-1)
            return time.perf_counter() - start

        compile_s = decode(steps["compiled"], 2)  # traces and compiles (the batch and the cache length symbolic)
        times = {"eager": [], "compiled": []}
        for r in range(args.rounds):
            for key in (times if r % 2 == 0 else list(times)[::-1]):
                times[key].append(decode(steps[key], args.tokens))
        rate = {k: [args.batch * args.tokens / s for s in v] for k, v in times.items()}
        ratios = sorted(e / c for e, c in zip(times["eager"], times["compiled"]))
        lines.append(f"| {name} | {spread(rate['eager'])} | {spread(rate['compiled'])} | "
                     f"{statistics.median(ratios):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}) | {compile_s:.1f} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.decoding", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="part", required=True)
    for part in ("ragged", "continuous", "compiled"):
        s = sub.add_parser(part)
        s.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
        s.add_argument("--size", default="small")
        s.add_argument("--rounds", type=int, default=3)
        s.add_argument("--seed", type=int, default=0)
    ragged = sub.choices["ragged"]
    ragged.add_argument("--batch", type=int, default=16)
    ragged.add_argument("--max-length", type=int, default=2048)
    ragged.add_argument("--tokens", type=int, default=32)
    cont = sub.choices["continuous"]
    cont.add_argument("--requests", type=int, default=256)
    cont.add_argument("--max-batch", default="1,8,32")
    cont.add_argument("--max-prompt", type=int, default=512)
    cont.add_argument("--max-new", type=int, default=128)
    comp = sub.choices["compiled"]
    comp.add_argument("--batch", type=int, default=1)
    comp.add_argument("--prompt", type=int, default=256)
    comp.add_argument("--tokens", type=int, default=32)
    comp.add_argument("--backend", default="inductor", help="torch.compile's backend (default: inductor)")
    comp.add_argument("--mode", default=None,
                      help="torch.compile's mode, e.g. reduce-overhead (CUDA graphs) or max-autotune (default: none)")
    spec = sub.add_parser("speculative")
    spec.add_argument("--target", required=True, help="the target's run directory")
    spec.add_argument("--draft", required=True,
                      help="the draft's run directory, or layers:N for the target's first N layers (self-speculative)")
    spec.add_argument("--lookahead", default="2,4,8")
    spec.add_argument("--prompts", type=int, default=len(PROMPTS))
    spec.add_argument("--tokens", type=int, default=128)
    spec.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's); on a shared, loaded machine 1 keeps other processes from "
                        "stalling every op")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{args.part}: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}")
    lines = {"ragged": bench_ragged, "continuous": bench_continuous, "speculative": bench_speculative,
             "compiled": bench_compiled}[args.part](args)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
