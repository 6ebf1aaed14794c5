"""Every schedule against the HF algorithm, written out here in float64 (python math, lists)."""
import math

import pytest
import torch

from hybrid.rotary import inv_freq


def plain(d, b):
    return [b ** (-2.0 * i / d) for i in range(d // 2)]


def ref_yarn(d, b, s, L0, beta_fast=32.0, beta_slow=1.0, truncate=True):
    def index_of(turns):
        return d * math.log(L0 / (turns * 2 * math.pi)) / (2 * math.log(b))

    lo, hi = index_of(beta_fast), index_of(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    out = []
    for i in range(d // 2):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        extrapolation = 1 - ramp
        theta = 1.0 / b ** (2.0 * i / d)
        out.append(theta / s * (1 - extrapolation) + theta * extrapolation)
    return out


def ref_llama3(d, b, s, L0, lo, hi):
    out = []
    for theta in plain(d, b):
        w = 2 * math.pi / theta
        if w < L0 / hi:
            out.append(theta)
        elif w > L0 / lo:
            out.append(theta / s)
        else:
            sm = (L0 / w - lo) / (hi - lo)
            out.append((1 - sm) * theta / s + sm * theta)
    return out


def check(got, expected, attn=None, expected_attn=None):
    theta, factor = got
    assert theta.dtype == torch.float32 and theta.shape == (len(expected),)
    # float64 formula rounded once to float32: within half an ulp
    torch.testing.assert_close(theta.double(), torch.tensor(expected, dtype=torch.float64), rtol=6.1e-8, atol=0)
    if expected_attn is not None:
        assert factor == pytest.approx(expected_attn, rel=1e-12)


DIMS = [6, 18, 26, 64]


@pytest.mark.parametrize("d", DIMS)
def test_default(d):
    check(inv_freq(d, 500.0), plain(d, 500.0), expected_attn=1.0)
    check(inv_freq(d, 10000.0, {"rope_type": "default"}), plain(d, 10000.0), expected_attn=1.0)


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("s", [1.0, 2.5, 8])
def test_linear_and_ntk(d, s):
    check(inv_freq(d, 10000.0, {"rope_type": "linear", "factor": s}), [t / s for t in plain(d, 1e4)], expected_attn=1.0)
    b2 = 10000.0 * s ** (d / (d - 2))
    check(inv_freq(d, 10000.0, {"type": "ntk", "factor": s}), plain(d, b2), expected_attn=1.0)


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("seq_len", [None, 1, 100, 128, 129, 1000])
@pytest.mark.parametrize("s", [1.0, 4.0])
def test_dynamic(d, seq_len, s):
    L0 = 128
    L = seq_len if seq_len is not None and seq_len > L0 else L0
    b2 = 500.0 * ((s * L / L0) - (s - 1)) ** (d / (d - 2))
    got = inv_freq(d, 500.0, {"rope_type": "dynamic", "factor": s, "original_max_position_embeddings": L0}, seq_len)
    check(got, plain(d, b2), expected_attn=1.0)
    if seq_len is None or seq_len <= L0:  # (even s = 1 grows the base above L0: b·(L/L0)^(d/(d−2)))
        check(got, plain(d, 500.0))


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("s, L0", [(1.0, 2048), (4.0, 2048), (16.0, 4096), (3.0, 50)])
def test_yarn(d, s, L0):
    sc = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}
    check(inv_freq(d, 10000.0, sc), ref_yarn(d, 10000.0, s, L0), expected_attn=0.1 * math.log(s) + 1.0)
    sc.update(beta_fast=16.0, beta_slow=2.0, attention_factor=0.7)
    check(inv_freq(d, 10000.0, sc), ref_yarn(d, 10000.0, s, L0, 16.0, 2.0), expected_attn=0.7)
    del sc["attention_factor"]
    sc.update(truncate=False)
    check(inv_freq(d, 10000.0, sc), ref_yarn(d, 10000.0, s, L0, 16.0, 2.0, truncate=False))


def test_yarn_ramp_edge_low_equals_high():
    d, b, s = 8, 10000.0, 4.0
    # L0 = 4: both correction indices clamp to 0, so low == high == 0 and high becomes 0.001
    sc = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": 4}
    expected = ref_yarn(d, b, s, 4)
    assert expected[0] == 1.0 and all(abs(e - t / s) < 1e-18 for e, t in zip(expected[1:], plain(d, b)[1:]))
    check(inv_freq(d, b, sc), expected)
    # untruncated, beta_fast == beta_slow: equal fractional bounds
    sc = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": 4096, "beta_fast": 4.0,
          "beta_slow": 4.0, "truncate": False}
    check(inv_freq(d, b, sc), ref_yarn(d, b, s, 4096, 4.0, 4.0, truncate=False))
    # very long L0: low lands above d/2 (no interpolation in the ramp's range)
    sc = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": 10**9}
    check(inv_freq(d, b, sc), ref_yarn(d, b, s, 10**9))


def test_yarn_mscale():
    sc = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
          "mscale_all_dim": 0.5}
    expected = (0.1 * 0.707 * math.log(40.0) + 1) / (0.1 * 0.5 * math.log(40.0) + 1)
    check(inv_freq(24, 10000.0, sc), ref_yarn(24, 10000.0, 40.0, 4096), expected_attn=expected)
    sc["mscale_all_dim"] = 0  # HF: only when both are non-zero
    assert inv_freq(24, 10000.0, sc)[1] == pytest.approx(0.1 * math.log(40.0) + 1)


@pytest.mark.parametrize("d", [6, 18, 26])
def test_longrope(d):
    gen = torch.Generator().manual_seed(5)
    P, L0 = d // 2, 256
    short = (1 + torch.rand(P, generator=gen, dtype=torch.float64)).tolist()
    long = (1 + 10 * torch.rand(P, generator=gen, dtype=torch.float64)).tolist()
    sc = {"rope_type": "longrope", "short_factor": short, "long_factor": long, "factor": 16.0,
          "original_max_position_embeddings": L0}
    attn = math.sqrt(1 + math.log(16.0) / math.log(L0))
    for seq_len in (None, 1, 255, 256):
        check(inv_freq(d, 10000.0, sc, seq_len), [t / f for t, f in zip(plain(d, 1e4), short)], expected_attn=attn)
    for seq_len in (257, 10**6):
        check(inv_freq(d, 10000.0, sc, seq_len), [t / f for t, f in zip(plain(d, 1e4), long)], expected_attn=attn)
    assert inv_freq(d, 10000.0, {**sc, "factor": 1.0})[1] == 1.0
    assert inv_freq(d, 10000.0, {**sc, "attention_factor": 1.3})[1] == 1.3
    no_factor = {k: v for k, v in sc.items() if k != "factor"}
    assert inv_freq(d, 10000.0, {**no_factor, "attention_factor": 1.2})[1] == 1.2


@pytest.mark.parametrize("d", [18, 64, 128])
@pytest.mark.parametrize("s, L0, lo, hi", [(8.0, 8192, 1.0, 4.0), (1.0, 8192, 1.0, 4.0), (32.0, 100, 2.0, 3.0)])
def test_llama3(d, s, L0, lo, hi):
    sc = {"rope_type": "llama3", "factor": s, "original_max_position_embeddings": L0, "low_freq_factor": lo,
          "high_freq_factor": hi}
    got = inv_freq(d, 500000.0, sc)
    check(got, ref_llama3(d, 500000.0, s, L0, lo, hi), expected_attn=1.0)
    if s == 1.0:
        check(got, plain(d, 500000.0))


def test_factor_one_is_plain_rope():
    d, b = 18, 10000.0
    for sc in (
        {"rope_type": "linear", "factor": 1.0},
        {"rope_type": "ntk", "factor": 1},
        {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 64},
    ):
        theta, attn = inv_freq(d, b, sc, seq_len=1000)
        torch.testing.assert_close(theta.double(), torch.tensor(plain(d, b), dtype=torch.float64), rtol=6.1e-8, atol=0)
        assert attn == 1.0


Y = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LR = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "factor": 4.0,
      "original_max_position_embeddings": 64}
L3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0}


@pytest.mark.parametrize(
    "args, match",
    [
        ((7,), "dim"),
        ((0,), "dim"),
        ((8.0,), "dim"),
        ((8, 1.0), "base"),
        ((8, float("inf")), "base"),
        ((8, 1e4, "yarn"), "scaling"),
        ((8, 1e4, {"rope_type": "cubic", "factor": 2.0}), "rope_type"),
        ((8, 1e4, {"factor": 2.0}), "rope_type"),
        ((8, 1e4, {"rope_type": "linear", "type": "yarn", "factor": 2.0}), "rope_type"),
        ((8, 1e4, {"rope_type": "linear", "factor": 2.0, "beta_fast": 3.0}), "beta_fast"),
        ((8, 1e4, {"rope_type": "linear", "factor": 2.0, "rope_theta": 3.0}), "rope_theta.*base="),
        ((8, 1e4, {**Y, "mscale_typo": 1.0}), "mscale_typo"),
        ((8, 1e4, {"rope_type": "linear"}), "'factor'"),
        ((8, 1e4, {"rope_type": "linear", "factor": 0.5}), "'factor'"),
        ((8, 1e4, {"rope_type": "linear", "factor": True}), "'factor'"),
        ((8, 1e4, {"rope_type": "linear", "factor": "2"}), "'factor'"),
        ((8, 1e4, {"rope_type": "linear", "factor": float("nan")}), "'factor'"),
        ((8, 1e4, {"rope_type": "dynamic", "factor": 2.0}), "original_max_position_embeddings"),
        ((8, 1e4, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64.5}),
         "original_max_position_embeddings"),
        ((8, 1e4, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 0}),
         "original_max_position_embeddings"),
        ((2, 1e4, {"rope_type": "ntk", "factor": 2.0}), "dim"),
        ((8, 1e4, {**Y, "factor": 0.9}), "'factor'"),
        ((8, 1e4, {**Y, "beta_fast": 0.5}), "beta_fast"),
        ((8, 1e4, {**Y, "beta_slow": 0.0}), "beta_slow"),
        ((8, 1e4, {**Y, "attention_factor": 0.0}), "attention_factor"),
        ((8, 1e4, {**Y, "truncate": 1}), "truncate"),
        ((8, 1e4, {**Y, "mscale": "big"}), "mscale"),
        ((8, 1e4, {**LR, "short_factor": [1.0] * 3}), "short_factor"),
        ((8, 1e4, {**LR, "long_factor": [1.0] * 5}), "long_factor"),
        ((8, 1e4, {**LR, "long_factor": [1.0, 2.0, -1.0, 3.0]}), r"long_factor.*got -1\.0 at index 2"),
        ((8, 1e4, {**LR, "long_factor": [1.0, 2.0, 3.0, float("inf")]}), r"long_factor.*got inf at index 3"),
        ((8, 1e4, {**LR, "long_factor": "abcd"}), "long_factor"),
        ((8, 1e4, {k: v for k, v in LR.items() if k != "factor"}), "'factor'"),
        ((8, 1e4, {k: v for k, v in LR.items() if k != "short_factor"}), "short_factor"),
        ((8, 1e4, {**L3, "high_freq_factor": 1.0}), "high_freq_factor"),
        ((8, 1e4, {**L3, "low_freq_factor": -1.0}), "low_freq_factor"),
        ((8, 1e4, {k: v for k, v in L3.items() if k != "low_freq_factor"}), "low_freq_factor"),
        ((8, 1e4, None, -1), "seq_len"),
        ((8, 1e4, None, 2.5), "seq_len"),
    ],
)
def test_errors_name_the_key(args, match):
    with pytest.raises(ValueError, match=match):
        inv_freq(*args)


def test_null_values_mean_unset():
    sc = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": None,
          "attention_factor": None, "mscale": None}
    check(inv_freq(10, 1e4, sc), ref_yarn(10, 1e4, 4.0, 64), expected_attn=0.1 * math.log(4.0) + 1)
    with pytest.raises(ValueError, match="'factor'.*required"):
        inv_freq(10, 1e4, {**sc, "factor": None})
