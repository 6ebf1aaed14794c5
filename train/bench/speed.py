"""Model benchmarks: the numbers a user looks at before choosing a preset.

    python -m hybrid.train.bench.speed                 # both tables on CPU
    python -m hybrid.train.bench.speed --device cuda   # the same on a GPU
    python -m hybrid.train.bench.speed --out docs/model_bench.md

1. Training throughput: forward+backward tokens/s of each preset, every preset sized to the same parameter
   count (non-embedding), at T=1024.
2. Decoding: ms/token and state bytes after a context of 512, 4096 and 16384 tokens, for the windowed hybrid
   against the transformer preset (prefill in chunked mode, then recurrent steps).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch

from hybrid.models import HybridConfig, HybridLM

from .cost import decode_cost

PRESET_NAMES = ("transformer", "retnet", "vo-rnn", "hybrid")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


_SIZE_CACHE: dict[str, int] = {}


def non_embedding_parameters(config: HybridConfig) -> int:
    """Parameters without the token and position tables, counted on the meta device (nothing allocated)."""
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    if key not in _SIZE_CACHE:
        with torch.device("meta"):
            _SIZE_CACHE[key] = _Uninitialised(config).num_parameters(exclude_embeddings=True)
    return _SIZE_CACHE[key]


class _Uninitialised(HybridLM):
    """A HybridLM that skips its weight initialisation: only for counting parameters (fast on meta)."""

    def _init_weights(self) -> None:
        pass


def match_width(config: HybridConfig, target: int, tolerance: float | None = None) -> HybridConfig:
    """``config`` with the d_model (a multiple of 2·n_heads) whose non-embedding size is closest to ``target``.

    The size grows with d_model, so the width is found by bisection. With ``tolerance`` (a fraction, e.g.
    0.05) and no width within it, the SwiGLU width is searched as well (hidden a multiple of 32 between 2
    and 4 × d_model, at the widths around the best): of the sizes within the tolerance, the one whose
    mlp_ratio is nearest the config's; when none is within, the closest size.
    """
    step = 2 * config.n_heads
    size = lambda d: non_embedding_parameters(config.replace(d_model=d * step))  # noqa: E731
    lo, hi = max(1, 4 * config.n_heads // step), 4096 // step  # in units of step
    while lo < hi:  # the smallest width whose size reaches the target (or the largest width)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if size(mid) < target else (lo, mid)
    units = min((u for u in (lo - 1, lo) if u >= 1), key=lambda u: abs(size(u) - target))
    best = config.replace(d_model=units * step)
    if tolerance is None or abs(size(units) - target) <= tolerance * target:
        return best
    scored = []
    for u in range(max(1, units - 2), units + 3):
        d_model = u * step
        for hidden in range(32 * math.ceil(2 * d_model / 32), 4 * d_model + 1, 32):
            candidate = config.replace(d_model=d_model, mlp_ratio=hidden / d_model)
            n = non_embedding_parameters(candidate)
            within = abs(n - target) <= tolerance * target
            scored.append((not within, abs(hidden / d_model - config.mlp_ratio), abs(n - target), candidate))
    return min(scored, key=lambda s: s[:3])[3]


def match_mlp(config: HybridConfig, target: int, multiple: int = 64) -> HybridConfig:
    """``config`` at its own width and head size, with the SwiGLU width (a multiple of ``multiple``, up to 8 ×
    d_model) whose non-embedding size is closest to ``target``. On a GPU the head size must stay what the attention
    kernels take (FlexAttention a power of two, SDPA's fused kernels a multiple of 8), which ``match_width``'s
    d_model may not keep (it gave the hybrid d_model 528 and head_dim 66 on the H100, docs/research/gpu.md)."""
    size = lambda u: non_embedding_parameters(config.replace(mlp_hidden=u * multiple))  # noqa: E731
    lo, hi = 1, 8 * config.d_model // multiple
    while lo < hi:  # the size grows with the MLP width: the smallest width that reaches the target (or the widest)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if size(mid) < target else (lo, mid)
    units = min((u for u in (lo - 1, lo) if u >= 1), key=lambda u: abs(size(u) - target))
    return config.replace(mlp_hidden=units * multiple)


def matched_config(name: str, target: int, n_layers: int, n_heads: int, vocab: int, window: int) -> HybridConfig:
    """The preset with the d_model (a multiple of 2·n_heads) whose non-embedding size is closest to target."""
    config = HybridConfig.preset(name, "tiny", n_layers=n_layers, n_heads=n_heads, vocab_size=vocab,
                                 **({"window": window} if name == "hybrid" else {}))
    return match_width(config, target)


def training_table(device, dtype, d_model, n_layers, n_heads, seq_len, batch, reps) -> list[str]:
    vocab = 264
    with torch.device("meta"):
        target = HybridLM(HybridConfig.preset("transformer", "tiny", d_model=d_model, n_layers=n_layers,
                                              n_heads=n_heads, vocab_size=vocab)).num_parameters(True)
    rows = [
        f"Training forward+backward, B={batch}, T={seq_len}, {n_layers} layers, {n_heads} heads, "
        f"~{target / 1e6:.2f}M non-embedding parameters each, {dtype}",
        "",
        "| preset | pattern | d_model | params (non-emb) | ms / step | tokens/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    ids = torch.randint(0, vocab, (batch, seq_len), device=device)
    for name in PRESET_NAMES:
        config = matched_config(name, target, n_layers, n_heads, vocab, window=min(256, seq_len))
        torch.manual_seed(0)
        model = HybridLM(config.replace(dtype=dtype)).to(device).train()

        def step():
            logits, _ = model(ids)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten()).backward()

        seconds = timed(step, device, reps)
        rows.append(
            f"| {name} | {config.layer_types} | {config.d_model} | {model.num_parameters(True) / 1e6:.2f}M | "
            f"{seconds * 1e3:.0f} | {batch * seq_len / seconds:,.0f} |"
        )
    return rows


def decoding_table(device, dtype, contexts, new_tokens, d_model, n_layers, n_heads, window) -> list[str]:
    vocab = 264
    rows = [
        f"Decoding one sequence, d_model={d_model}, {n_layers} layers, {n_heads} heads, hybrid window={window}, "
        f"{dtype}; ms/token averaged over {new_tokens} recurrent steps after a chunked prefill",
        "",
        "| preset | context | prefill s | ms / token | state bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("hybrid", "transformer"):
        config = HybridConfig.preset(name, "tiny", d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                     vocab_size=vocab, dtype=dtype, **({"window": window} if name == "hybrid" else {}))
        torch.manual_seed(0)
        model = HybridLM(config).to(device).eval()
        for context in contexts:
            cost = decode_cost(model, context=context, new_tokens=new_tokens)
            rows.append(f"| {name} | {context} | {cost['prefill_s']:.2f} | {cost['ms_per_token']:.2f} | "
                        f"{cost['state_bytes']:,} |")
    return rows


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="parameter dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256, help="transformer width that sets the matched size")
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--contexts", default="512,4096,16384")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--skip-decoding", action="store_true")
    p.add_argument("--out", default=None, help="also write the tables (markdown) here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hybrid.train.bench.speed: --device cuda asked for but no CUDA device is visible")
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    lines = [f"Model benchmarks on {describe(device)}", ""]
    if not args.skip_training:
        lines += training_table(device, dtype, args.d_model, args.n_layers, args.n_heads, args.seq_len,
                                args.batch, args.reps) + [""]
        print("\n".join(lines), flush=True)
    if not args.skip_decoding:
        contexts = [int(c) for c in args.contexts.split(",")]
        table = decoding_table(device, dtype, contexts, args.new_tokens, args.d_model, args.n_layers,
                               args.n_heads, args.window)
        print("\n".join(table), flush=True)
        lines += table
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
