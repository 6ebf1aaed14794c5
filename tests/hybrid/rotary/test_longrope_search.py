import time

import pytest
import torch

from hybrid.rotary import inv_freq, longrope_search, seed_candidates


def test_finds_known_monotone_optimum():
    P = 13
    gen = torch.Generator().manual_seed(61)
    target = torch.cumsum(torch.rand(P, generator=gen, dtype=torch.float64) * 0.4, 0).exp()  # ≥ 1, increasing
    calls = []

    def loss(f):
        calls.append(1)
        assert f.shape == (P,) and f.dtype == torch.float64
        return float(((f.log() - target.log()) ** 2).mean())

    t0 = time.perf_counter()
    res = longrope_search(loss, P, upper=20.0, generator=torch.Generator().manual_seed(0))
    assert time.perf_counter() - t0 < 5.0
    assert ((res.factors / target - 1).abs() < 0.02).all()
    assert res.loss == pytest.approx(loss(res.factors))
    assert res.history == sorted(res.history, reverse=True)  # elitism: never worse
    assert res.evaluations == len(calls) - 1
    again = longrope_search(loss, P, upper=20.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.factors, res.factors)  # seeded: reproducible


def test_constraints_hold():
    P = 8
    # optimum outside the constraints (decreasing, some below 1): the search stays feasible
    target = torch.linspace(3.0, 0.5, P, dtype=torch.float64)
    res = longrope_search(lambda f: float(((f - target) ** 2).sum()), P, upper=2.5, generations=15)
    f = res.factors
    assert bool((f >= 1.0).all()) and bool((f <= 2.5).all()) and bool((f[1:] >= f[:-1]).all())
    free = longrope_search(lambda f: float(((f - target) ** 2).sum()), P, lower=0.25, monotonic=False,
                           generations=60)
    assert ((free.factors - target).abs() < 0.05).all()


def test_seed_candidates_are_the_schedules_ratios():
    c = seed_candidates(16, 8.0, 64, base=10000.0)
    theta = inv_freq(16)[0].double()
    torch.testing.assert_close(c["pi"], torch.full((8,), 8.0, dtype=torch.float64))
    ntk = torch.tensor([(10000.0 * 8 ** (16 / 14)) ** (-2 * i / 16) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(c["ntk"], theta / ntk.float().double())
    assert c["yarn"][0] == 1.0 and c["yarn"][-1] == 8.0
    res = longrope_search(lambda f: float((f - 3).abs().sum()), 8, init=c, generations=3)
    assert res.factors.shape == (8,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_pairs=0), "n_pairs"),
        (dict(population=0), "population"),
        (dict(parents=100), "parents"),
        (dict(mutation_prob=1.5), "mutation_prob"),
        (dict(mutation_scale=-1.0), "mutation_scale"),
        (dict(lower=0.0), "lower"),
        (dict(upper=0.5), "upper"),
        (dict(init=[torch.ones(3)]), r"init\[0\]: expected 4 finite numbers \(n_pairs\), got 3 numbers"),
        (dict(init=[torch.ones(4), [1.0, float("nan"), 1.0, 1.0]]), r"init\[1\]: .* got a value that is not finite"),
        (dict(init=[]), "init: expected a vector of numbers, or a list or dict of them, got an empty one"),
        (dict(population=8, parents=9), "parents: expected an int >= 1 and <= 8, got 9"),
    ],
)
def test_errors(kwargs, match):
    args = dict(n_pairs=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        longrope_search(lambda f: 0.0, **args)


@pytest.mark.parametrize("one", [[1.0, 2.0, 3.0, 4.0], (1, 2, 3, 4), torch.arange(1.0, 5.0)])
def test_one_vector_given_as_a_list_tuple_or_array_is_one_candidate(one):
    """A checkpoint's long_factor is a plain list: it is one starting vector, not four scalar seeds."""
    seen = []
    longrope_search(lambda f: seen.append(f.tolist()) or 0.0, 4, init=one, population=8, generations=1)
    assert seen[0] == [1.0, 2.0, 3.0, 4.0]
    import numpy as np

    longrope_search(lambda f: 0.0, 4, init=np.asarray(one, dtype=float), population=8, generations=1)


def test_a_small_population_keeps_at_most_its_size_as_parents():
    res = longrope_search(lambda f: float(f.sum()), 4, population=8, generations=2)  # default parents: 16 > 8
    assert res.factors.shape == (4,)
