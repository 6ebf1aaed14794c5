"""Hook capture of pre-rotation q and k in our HybridLM against a direct recomputation; layouts; outputs."""
import json

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.rotary import apply_rotary, convert_layout, convert_projection, cos_sin_from_angles, rotary_angles
from hybrid.train.rotary_analysis import (
    CAROPE_NOTE, analyze, capture_statistics, circular_std, hybrid_forward, hybrid_rotary_layers, pairs, write_outputs,
)

VOCAB = 61


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    base = dict(vocab_size=VOCAB, d_model=36, n_layers=2, n_heads=6, pattern="A", rope_placement="qk")
    base.update(kw)
    return HybridLM(HybridConfig(**base)).double().eval()


def _batches(seed=1, n=3, B=2, T=13):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (B, T), generator=g) for _ in range(n)]


def _direct_qk(model, batches):
    """Per attention layer: (q (N, H, D), k (N, G, D), q angles, k angles), recomputed block by block."""
    out = {}
    for ids in batches:
        h = model.embed(ids)
        for i, block in enumerate(model.blocks):
            attn = block.mixer
            x = block.mixer_norm(h)
            H, G, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
            qkv = x @ attn.in_proj.weight.T + (0 if attn.in_proj.bias is None else attn.in_proj.bias)
            q = qkv[..., : H * D].unflatten(-1, (H, D))
            k = qkv[..., H * D : (H + G) * D].unflatten(-1, (G, D))
            T = ids.shape[1]
            if attn.carope is None:
                ang = rotary_angles(torch.arange(T), attn.rotary.inv_freq)  # (T, P)
                qa = ang[None, :, None].expand(ids.shape[0], T, H, -1)  # (B, T, H, P)
                ka = ang[None, :, None].expand(ids.shape[0], T, G, -1)  # (B, T, G, P)
            else:
                inc = attn.carope.increments(x)  # (B, T, G, P)
                ka = torch.cumsum(inc, dim=1)
                qa = ka.repeat_interleave(H // G, dim=2)
            rec = out.setdefault(i, [[], [], [], []])
            for lst, t in zip(rec, (q, k, qa, ka)):
                lst.append(t.flatten(0, 1))
            h, _ = block(h, None)
    return {i: [torch.cat(t) for t in rec] for i, rec in out.items()}


@pytest.mark.parametrize("kw", [
    dict(),
    dict(n_kv_heads=2, rope_layout="half", rotary_dim=4),
    dict(rope_placement="qkvo", carope=True, n_kv_heads=3),
])
def test_capture_matches_direct_recomputation(kw):
    model = _model(**kw)
    batches = _batches()
    layers, notes = hybrid_rotary_layers(model)
    assert [s.layer for s in layers] == [0, 1]
    stats = capture_statistics(hybrid_forward(model), layers, batches, progress=False)
    direct = _direct_qk(model, batches)
    for s in stats:
        q, k, qa, ka = direct[s.spec.layer]
        layout, R = s.spec.layout, s.spec.rotary_dim
        for got, x, ang in ((s.q, q, qa), (s.k, k, ka)):
            assert got.count == x.shape[0] == 3 * 2 * 13
            torch.testing.assert_close(got.mean(), x.mean(0), rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(got.channel_summary()["max_abs"], x.abs().amax(0), rtol=0, atol=0)
            cos, sin = cos_sin_from_angles(ang[:, None], torch.float64)  # (N, 1, H, P)
            rotated = apply_rotary(x[:, None], cos, sin, layout=layout, rotary_dim=R)[:, 0]
            torch.testing.assert_close(got.channel_summary()["max_abs_rotated"], rotated.abs().amax(0),
                                       rtol=1e-12, atol=1e-14)
            u = pairs(x, layout, R)
            unit = u / u.norm(dim=-1, keepdim=True)
            torch.testing.assert_close(got.angle_std(), circular_std(unit.sum(0), torch.full(unit.shape[1:-1],
                                       float(x.shape[0]), dtype=torch.float64)), rtol=1e-10, atol=1e-12)
        if model.config.carope:
            assert CAROPE_NOTE in notes and s.spec.theta is None
            # the effective θ is the mean per-token increment (the angles' first differences, from 0)
            seq = ka.view(3 * 2, 13, *ka.shape[1:])  # (sequences, T, G, P)
            steps = torch.cat([seq[:, :1], seq.diff(dim=1)], dim=1)
            torch.testing.assert_close(s.theta, steps.flatten(0, 1).mean(0), rtol=1e-10, atol=1e-14)
        else:
            torch.testing.assert_close(s.theta[0], model.blocks[0].mixer.rotary.inv_freq.double())


def test_retention_layers_are_analysed_on_request():
    model = _model(pattern="MA")
    with_ret, notes = hybrid_rotary_layers(model, include_retention=True)
    assert [s.layer for s in with_ret] == [0, 1] and any("retention" in n for n in notes)
    assert [s.layer for s in hybrid_rotary_layers(model)[0]] == [1]
    stats = capture_statistics(hybrid_forward(model), with_ret[:1], _batches(n=1), progress=False)
    ret = model.blocks[0].mixer
    ids = _batches(n=1)[0]
    x = model.blocks[0].mixer_norm(model.embed(ids))
    k = (x @ ret.k_proj.weight.T).unflatten(-1, (ret.n_heads, ret.head_dim)) * ret.head_dim ** -0.5
    torch.testing.assert_close(stats[0].k.mean(), k.flatten(0, 1).mean(0), rtol=1e-12, atol=1e-14)


def test_a_bfloat16_models_layers_are_analysed_with_the_frequencies_they_rotate_by():
    """A model cast to bfloat16 rounds its inv_freq buffers; every layer still rotates by the float32 θ of its
    config, and so does the analysis (a retention layer's θ was the rounded buffer's: 0.4 % off)."""
    from hybrid.rotary import inv_freq

    model = _model(pattern="MA").to(torch.bfloat16)
    layers, _ = hybrid_rotary_layers(model, include_retention=True)
    for layer in layers:
        rotary = model.blocks[layer.layer].mixer.rotary
        assert rotary.inv_freq.dtype == torch.bfloat16  # the rounded copy the analysis must not read
        want = inv_freq(rotary.rotary_dim, rotary.base, rotary.scaling)[0]
        assert torch.equal(layer.theta.double(), want.double()), layer.layer
        assert torch.equal(rotary._theta_on("base", torch.device("cpu")), want)  # what the layer rotates by


def test_models_without_rotated_qk_are_refused():
    with pytest.raises(ValueError, match=r"model: expected attention layers rotating q and k .*got none$"):
        hybrid_rotary_layers(_model(rope_placement="vo"))  # no retention layer: no hint about them
    with pytest.raises(ValueError, match=r"got none; retention layers need include_retention=True"):
        hybrid_rotary_layers(_model(pattern="M"))


@pytest.mark.parametrize("placement", ["qk", "qkv", "qkvo"])
def test_half_and_interleaved_layouts_agree_on_converted_weights(placement):
    """A model and its layout-converted twin give the same features (pairs listed in the same order). The output
    projection's columns follow v's rows whenever v is rotated, o rotated or not (qkv; docs/rotary.md)."""
    kw = dict(rope_placement=placement, n_kv_heads=3, rotary_dim=4)
    inter = _model(rope_layout="interleaved", **kw)
    half = _model(seed=5, rope_layout="half", **kw)
    state = {k: v.clone() for k, v in inter.state_dict().items()}
    for i, block in enumerate(inter.blocks):
        attn = block.mixer
        H, G, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        w = state[f"blocks.{i}.mixer.in_proj.weight"]
        q, k, v = w.split([H * D, G * D, G * D])
        conv = dict(rotary_dim=attn.rotary_dim, src="interleaved", dst="half")
        q, k = convert_projection(q, H, **conv), convert_projection(k, G, **conv)
        if attn.placement.v:
            v = convert_projection(v, G, **conv)
            state[f"blocks.{i}.mixer.out_proj.weight"] = convert_projection(
                state[f"blocks.{i}.mixer.out_proj.weight"], H, dim=1, **conv)
        state[f"blocks.{i}.mixer.in_proj.weight"] = torch.cat([q, k, v])
    half.load_state_dict(state)
    ids = _batches()[0]
    torch.testing.assert_close(half(ids)[0], inter(ids)[0], rtol=1e-10, atol=1e-10)
    results = []
    for model in (inter, half):
        stats = capture_statistics(hybrid_forward(model), hybrid_rotary_layers(model)[0], _batches(), progress=False)
        results.append(analyze(stats, p_max=40))
    a, b = results
    for name in ("q_mean", "k_mean", "phi", "theta", "angle_std_k", "angle_std_q", "lower_bound"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-10, atol=1e-12)
    for name in ("is_rof", "under_upper_bound", "meets_lower_bound", "meets_relaxed_lower_bound"):
        assert torch.equal(getattr(b, name), getattr(a, name))
    D = inter.blocks[0].mixer.head_dim
    for which in ("q", "k"):
        for key, v in a.channels[which].items():
            torch.testing.assert_close(b.channels[which][key], convert_layout(v, rotary_dim=4), rtol=1e-10,
                                       atol=1e-12)
            assert v.shape[-1] == D


def test_write_outputs_schema(tmp_path):
    model = _model(n_kv_heads=2)
    layers, notes = hybrid_rotary_layers(model)
    result = analyze(capture_statistics(hybrid_forward(model), layers, _batches(), progress=False), p_max=40)
    write_outputs(result, tmp_path, model="tiny", radii=(0.05, 0.2), notes=notes, figures=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["p_max"], summary["head_dim"], summary["rotary_dim"], summary["n_kv_heads"]) == (40, 6, 6, 2)
    assert len(summary["features"]) == summary["table2"]["n_features"] == 2 * 6 * 3
    f = summary["features"][7]
    assert (f["layer"], f["head"], f["pair"]) == (0, 2, 1)
    keys = {"layer", "head", "pair", "theta", "q_mean", "k_mean", "radius_q", "radius_k", "phi", "is_rof",
            "under_upper_bound", "lower_bound", "angle_std"}
    assert keys <= set(f)
    assert f["k_mean"] == [float(v) for v in result.k_mean[0, 2, 1]]
    assert f["radius_k"] == pytest.approx(float(result.k_mean[0, 2, 1].norm()))
    assert 0 < f["phi"] <= 2 * torch.pi
    assert [r["radius"] for r in summary["table2"]["rows"]] == [0.05, 0.2]
    report = (tmp_path / "report.md").read_text()
    assert "Phi-1 (seed) | 12288 | 31% | 3.93" in report and "**tiny** (ours)" in report
