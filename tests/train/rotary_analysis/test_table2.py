"""Table 2 of Jonasson's "Rotary Outliers and Rotary Offset Features" on hand-built features, and its %ROF and mean LB reproduced from the frequencies alone."""
import math

import pytest
import torch

from hybrid.train.rotary_analysis import ProjectionStats, RotaryLayer, analyze, table2
from hybrid.train.rotary_analysis.capture import LayerStats

TWO_PI = 2 * math.pi


def polar(r, angle):
    return torch.tensor([r * math.cos(angle), r * math.sin(angle)], dtype=torch.float64)


def _stats_with_means(q_means, k_means, theta, layout="interleaved"):
    """LayerStats whose pre-rotation means are the given pair vectors `(H, P, 2)` / `(G, P, 2)`."""
    H, P, _ = q_means.shape
    G = k_means.shape[0]
    D = 2 * P
    spec = RotaryLayer(layer=0, n_heads=H, n_kv_heads=G, head_dim=D, rotary_dim=D, layout=layout,
                       theta=theta, module=torch.nn.Identity(), extract=None)
    q, k = ProjectionStats(H, D, D, layout), ProjectionStats(G, D, D, layout)
    cos, sin = torch.ones(1, P), torch.zeros(1, P)
    q.update(q_means.reshape(1, 1, H, D), cos, sin)
    k.update(k_means.reshape(1, 1, G, D), cos, sin)
    return LayerStats(spec=spec, q=q, k=k)


def test_table2_on_hand_built_features():
    p_max = 100
    edge = TWO_PI / p_max
    theta = torch.tensor([2.0, 0.5, 0.5 * edge, 0.5 * edge], dtype=torch.float64)  # pairs 2, 3 under the UB
    lb = math.pi + p_max * 0.5 * edge / 2  # = 1.5π for pairs 2 and 3
    # head 0 keys: radii 10, 7, 13, 8; φ: any, any, LB + 0.2 (meets), LB − 0.05 (meets only the relaxed)
    # head 1 (MQA: the same keys): q̄ at angles making pair 2 fail the LB and pair 3 meet it
    k_means = torch.stack([polar(10, 0.0), polar(7, 0.0), polar(13, 0.0), polar(8, 0.0)])[None]  # (1, 4, 2)
    q0 = torch.stack([polar(1, 0.0), polar(1, 0.0), polar(1, -(lb + 0.2)), polar(1, -(lb - 0.05))])
    q1 = torch.stack([polar(1, 0.0), polar(1, 0.0), polar(1, -(lb - 0.5)), polar(1, -(lb + 0.1))])
    stats = _stats_with_means(torch.stack([q0, q1]), k_means, theta)
    result = analyze([stats], p_max)
    assert result.phi.shape == (1, 2, 4)
    torch.testing.assert_close(result.phi[0, :, 2], torch.tensor([lb + 0.2, lb - 0.5], dtype=torch.float64))
    t = table2(result, radii=(6, 9, 12))
    assert t["n_features"] == 8
    assert t["pct_rof"] == pytest.approx(50.0)
    assert t["mean_lb"] == pytest.approx(lb)
    rows = {r["radius"]: r for r in t["rows"]}
    # r = 6: radii 10, 7, 13, 8 in both heads → 8 outliers; under UB: pairs 2, 3 → 4; LB: (0,2), (1,3) → 2;
    # relaxed: also (0,3) → 3
    assert (rows[6]["outliers"], rows[6]["ub_recall"], rows[6]["lb_recall"], rows[6]["lb_relaxed_recall"]) == \
        (8, pytest.approx(0.5), pytest.approx(0.25), pytest.approx(0.375))
    # r = 9: radii 10, 13 → 4 outliers; UB: pair 2 → 2; LB: (0,2) → 1; relaxed: 1
    assert (rows[9]["outliers"], rows[9]["ub_recall"], rows[9]["lb_recall"], rows[9]["lb_relaxed_recall"]) == \
        (4, pytest.approx(0.5), pytest.approx(0.25), pytest.approx(0.25))
    # r = 12: radius 13 → 2 outliers (pair 2 of each head), 1 meets the LB
    assert (rows[12]["outliers"], rows[12]["ub_recall"], rows[12]["lb_recall"]) == (2, 1.0, 0.5)
    # Definition 3.1 agrees with the LB on these low-frequency pairs
    assert torch.equal(result.is_rof[..., 2:], result.meets_lower_bound[..., 2:])
    assert table2(result, radii=(100,))["rows"][0]["ub_recall"] is None


@pytest.mark.parametrize("name, rotary_dim, p_max, scaling", [
    ("Phi-1", 32, 2048, None),
    ("Llama-2-7b", 128, 4096, None),
    ("DeepSeek-V2-Lite", 64, 163840, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
])
def test_seed_pct_rof_and_mean_lb_follow_from_the_frequencies(name, rotary_dim, p_max, scaling):
    """%ROF and the mean LB of the seed's Table 2 depend only on θ (after scaling) and p_max: reproduce them."""
    from hybrid.rotary import inv_freq
    from hybrid.train.rotary_analysis import SEED_TABLE2

    theta = inv_freq(rotary_dim, 10000.0, scaling)[0].double()
    P = rotary_dim // 2
    g = torch.Generator().manual_seed(0)
    stats = _stats_with_means(torch.randn(1, P, 2, generator=g, dtype=torch.float64),
                              torch.randn(1, P, 2, generator=g, dtype=torch.float64), theta)
    t = table2(analyze([stats], p_max))
    _, pct, mean_lb, _ = SEED_TABLE2[name]
    assert round(t["pct_rof"]) == pct
    assert round(t["mean_lb"], 2) == mean_lb


def test_a_windowed_layer_uses_its_window_as_p_max():
    """Two layers with the same features, the first with a sliding window of 10: its bounds and Definition 3.1 use
    p_max = 10 (a pair turning 0.3 of a period in 10 tokens is under its bound), the global one's p_max = 100."""
    from hybrid.train.rotary_analysis import summary_dict
    from hybrid.train.rotary_analysis.report import p_max_text

    theta = torch.tensor([0.3 * TWO_PI / 10], dtype=torch.float64)  # 3 periods in 100 tokens
    q, k = polar(1, 0.0)[None, None], polar(2, 0.0)[None, None]
    windowed, global_ = _stats_with_means(q, k, theta), _stats_with_means(q, k, theta)
    windowed.spec.window = 10
    global_.spec.layer = 3
    result = analyze([windowed, global_], 100)
    assert (result.p_max, result.layer_p_max, result.windows) == (100, [10, 100], [10, None])
    assert result.under_upper_bound[:, 0, 0].tolist() == [True, False]
    torch.testing.assert_close(result.lower_bound[:, 0, 0], math.pi + torch.tensor([10.0, 100.0]).double() * theta / 2)
    # q̄ ∥ k̄: d(p) = 2 cos(pθ) < d(0) at every p that is not a whole period: true within 10 tokens, not 100
    assert result.is_rof[:, 0, 0].tolist() == [True, False]
    summary = summary_dict(result, model="m")
    assert (summary["layer_p_max"], summary["windows"]) == ([10, 100], [10, None])
    assert p_max_text(summary) == "p_max = 100 (10 in layer 0: their sliding window)"


def _doc_bench_cells():
    """(outlier counts, mean, std) of every "mean ± std" recall cell of docs/rotary.md's hybrid-bench Table 2."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "rotary.md").read_text(encoding="utf-8")
    section = doc.split("### Results on the `hybrid-bench` models")[1].split("**Do our models")[0]
    cells = []
    for line in section.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(parts) != 9 or not re.fullmatch(r"\d+ / \d+ / \d+", parts[6]):
            continue
        counts = [int(n) for n in parts[6].split(" / ")]
        for m, s in re.findall(r"(\d\.\d\d) ± (\d\.\d\d)", " ".join(parts[7:])):
            cells.append((counts, float(m), float(s)))
    return cells


def test_the_bench_table_in_the_docs_gives_the_sample_std():
    """Each "mean ± std" cell of the bench Table 2 (docs/rotary.md) must be the mean and sample std (n − 1, as
    the text says and hybrid-bench prints) of some recalls k_s / n_s for the seeds' outlier counts n_s."""
    import itertools

    import numpy as np

    cells = _doc_bench_cells()
    assert len(cells) == 15
    for counts, mean, std in cells:
        counts = [n for n in counts if n]
        recalls = np.array(list(itertools.product(*(range(n + 1) for n in counts)))) / np.array(counts)
        fits = (np.abs(recalls.mean(1) - mean) <= 0.005 + 1e-9) & (np.abs(recalls.std(1, ddof=1) - std) <= 0.005 + 1e-9)
        assert fits.any(), f"no recalls over outliers {counts} have mean {mean} and sample std {std}"
