"""LongRoPE-style evolutionary search for per-pair rescaling factors λ_i (θ'_i = θ_i / λ_i).

The user supplies `loss_fn(factors) -> float` (e.g. perplexity of a model on a calibration batch at the
target length, with `{"rope_type": "longrope", "long_factor": factors, ...}`); the search minimises it.

Each generation: evaluate the population, keep the best `parents` (elitism), and breed the rest by
uniform crossover of two random parents plus multiplicative mutation λ_i ← λ_i·exp(σ_g·N(0, 1)) on each
pair with probability `mutation_prob`, σ_g annealed geometrically from `mutation_scale` to `final_scale`.
Every candidate is projected onto the constraints LongRoPE uses: `lower ≤ λ_i ≤ upper` (lower = 1: never
extrapolate) and, with `monotonic=True`, non-decreasing over pairs (λ_i ≤ λ_{i+1}; by running maximum).
The initial population is `init` (e.g. `seed_candidates`: PI, NTK, YaRN) plus mutations of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from hybrid.checks import check_int, check_number, check_positive_int

from .schedules import inv_freq


@dataclass
class SearchResult:
    factors: torch.Tensor        # (P,) float64, the best λ found
    loss: float                  # loss_fn(factors)
    history: list = field(default_factory=list)  # best loss after each generation
    evaluations: int = 0         # number of loss_fn calls


def seed_candidates(dim: int, factor: float, original_max_position_embeddings: int, base: float = 10000.0):
    """LongRoPE's starting points as per-pair factors λ_i = θ_i/θ'_i: `{"pi", "ntk", "yarn"}` → `(dim/2,)` float64."""
    theta = inv_freq(dim, base)[0].double()
    out = {}
    for name, scaling in (
        ("pi", {"rope_type": "linear", "factor": factor}),
        ("ntk", {"rope_type": "ntk", "factor": factor}),
        ("yarn", {"rope_type": "yarn", "factor": factor,
                  "original_max_position_embeddings": original_max_position_embeddings}),
    ):
        out[name] = theta / inv_freq(dim, base, scaling)[0].double()
    return out


def _project(f: torch.Tensor, lower: float, upper: float | None, monotonic: bool) -> torch.Tensor:
    """Clamp to [lower, upper] and, if monotonic, make non-decreasing along the last axis. f: `(N, P)`."""
    f = f.clamp(min=lower, max=upper)
    if monotonic:
        f = torch.cummax(f, dim=-1).values
    return f


def _is_one_vector(init) -> bool:
    """``init`` is one vector of numbers (a 1-D tensor or array, a list or tuple of numbers), not several."""
    if isinstance(init, torch.Tensor) or hasattr(init, "ndim"):
        return getattr(init, "ndim", 0) == 1
    return isinstance(init, (list, tuple)) and len(init) > 0 and all(isinstance(v, (int, float)) for v in init)


def longrope_search(loss_fn, n_pairs: int, *, init=None, population: int = 64, generations: int = 40,
                    parents: int | None = None, mutation_prob: float = 0.3, mutation_scale: float = 0.3,
                    final_scale: float = 0.005, lower: float = 1.0, upper: float | None = None,
                    monotonic: bool = True, generator: torch.Generator | None = None) -> SearchResult:
    """Minimise `loss_fn` over per-pair factors `(n_pairs,)`; returns the best as a `SearchResult`.

    init: None (start from all-ones), one `(n_pairs,)` vector (a tensor, a list of numbers, an array), or a
    list/dict of them. `parents`: the elite kept each generation (default 16, at most `population`). `loss_fn`
    gets a float64 `(n_pairs,)` tensor (a copy) and returns a number; identical candidates are evaluated once.
    `generator` (a seeded `torch.Generator`) makes the search reproducible; default seed 0.
    """
    for name, v in (("n_pairs", n_pairs), ("population", population), ("generations", generations)):
        check_positive_int(name, v)
    parents = min(16, population) if parents is None else parents
    check_int("parents", parents, low=1, high=population)
    check_number("mutation_prob", mutation_prob, low=0, high=1)
    for name, v in (("mutation_scale", mutation_scale), ("final_scale", final_scale), ("lower", lower)):
        check_number(name, v, low=0, low_open=True)
    check_number("upper", upper, low=lower, allow_none=True)
    if generator is None:
        generator = torch.Generator().manual_seed(0)

    seeds = [torch.ones(n_pairs, dtype=torch.float64)] if init is None else init
    if isinstance(seeds, dict):
        seeds = list(seeds.values())
    if _is_one_vector(seeds):
        seeds = [seeds]
    try:
        seeds = [torch.as_tensor(s, dtype=torch.float64).flatten() for s in seeds]
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"init: expected a vector of n_pairs = {n_pairs} numbers, or a list or dict of them, got "
                         f"{type(init).__name__}") from None
    if not seeds:
        raise ValueError("init: expected a vector of numbers, or a list or dict of them, got an empty one")
    for i, s in enumerate(seeds):
        if s.numel() != n_pairs or not bool(torch.isfinite(s).all()):
            got = f"{s.numel()} numbers" if s.numel() != n_pairs else "a value that is not finite"
            raise ValueError(f"init[{i}]: expected {n_pairs} finite numbers (n_pairs), got {got}")
    seeds = _project(torch.stack(seeds), lower, upper, monotonic)  # (S, P)

    def mutate(f: torch.Tensor, sigma: float) -> torch.Tensor:  # f: (N, P)
        hit = torch.rand(f.shape, generator=generator, dtype=torch.float64) < mutation_prob
        noise = torch.randn(f.shape, generator=generator, dtype=torch.float64) * sigma
        return _project(f * torch.exp(noise * hit), lower, upper, monotonic)

    n_fill = max(population - seeds.shape[0], 0)
    pick = torch.randint(seeds.shape[0], (n_fill,), generator=generator)
    pop = torch.cat((seeds, mutate(seeds[pick], mutation_scale)))[: max(population, seeds.shape[0])]

    cache: dict = {}

    def evaluate(f: torch.Tensor) -> float:
        key = tuple(f.tolist())
        if key not in cache:
            value = float(loss_fn(f.clone()))
            cache[key] = value if math.isfinite(value) else math.inf
        return cache[key]

    history = []
    for g in range(generations):
        losses = torch.tensor([evaluate(f) for f in pop], dtype=torch.float64)
        order = torch.argsort(losses)
        elite = pop[order[:parents]]  # (parents, P)
        history.append(float(losses[order[0]]))
        if g == generations - 1:
            break
        sigma = mutation_scale * (final_scale / mutation_scale) ** (g / max(generations - 2, 1))
        n_child = population - parents
        a = elite[torch.randint(parents, (n_child,), generator=generator)]
        b = elite[torch.randint(parents, (n_child,), generator=generator)]
        take_a = torch.rand(a.shape, generator=generator) < 0.5
        children = mutate(torch.where(take_a, a, b), sigma)  # (n_child, P)
        pop = torch.cat((elite, children))
    best = elite[0].clone()
    return SearchResult(factors=best, loss=evaluate(best), history=history, evaluations=len(cache))
