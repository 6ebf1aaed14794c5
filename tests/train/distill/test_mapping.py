"""The weight mapping of hybrid-distill: an R layer copied from a VO-RoPE attention layer computes its scan.

The math. With rotary on v and o (rope_placement "vo") and uniform attention weights (the query projection 0,
so every logit is 0 and softmax gives 1/(i+1) over the causal prefix), attention's output before ``out_proj`` is

    o_i = Σ_{j≤i} 1/(i+1) · R_{j−i} v_j,          v_j = W_v x_j (the kv head of each query head under GQA)

and the R layer's scan with no decay (γ = 1, log γ = 0) over the copied values is ``s_i = Σ_{j≤i} R_{j−i} v_j``.
So ``s_i = (i+1) · o_i`` exactly, and ``out_proj(s_i / (i+1))`` is the attention layer's output. The identity
holds at the scan: the rest of the R block has no counterpart in attention, the gate ``gelu(W_g x)`` (no setting
of W_g makes it 1 for every x) and the write scale ``sqrt(1 − γ²)``, which is 0 at γ = 1 (floored to 1e-6 in
the layer, so its own scan inputs are the copied values times 1e-6: checked too). The conv is copied as the
identity, so the scan's input is exactly ``W_v x``.

Angles: the attention rotates with cos / sin of float32 angles (the library's convention), the scan turns by
float32 θ in float64 arithmetic; they agree to float32 rounding of the angles (1e-6 relative). With the
attention's angles evaluated in float64 the identity holds to 1e-12.
"""
import pytest
import torch

from hybrid import Attention, VORecurrence
from hybrid.kernels import complex_scan
from hybrid.models import HybridConfig, HybridLM
from hybrid.rotary import convert_projection
from hybrid.train.distill import init_student, recurrence_from_attention
from hybrid.train.distill.mapping import student_config


def float64_angles(attn: Attention) -> None:
    """The attention's rotary cos / sin from float64 angles (the layer itself uses float32 angles)."""
    freqs = attn.rotary.inv_freq.double()

    def cos_sin(seq_len, offset=0, device=None):
        angles = torch.arange(offset, offset + seq_len, dtype=torch.float64)[:, None] * freqs[None, :]
        return torch.cos(angles), torch.sin(angles)

    attn.rotary.cos_sin = cos_sin


def vo_models(layout: str, shared_kv: bool = False, rotary_dim: int | None = None):
    """A one-layer VO-RoPE teacher (GQA: 4 query heads on 2 kv heads, head_dim 6, H·D = 24 ≠ d_model = 10;
    partial rotary on its first ``rotary_dim`` channels if given) with a zero query projection, and the one-layer
    R student copied from it (its config from ``student_config``), in float64."""
    teacher_config = HybridConfig(vocab_size=64, d_model=10, n_layers=1, n_heads=4, n_kv_heads=1 if shared_kv else 2,
                                  head_dim=6, pattern="A", rope_placement="qkvo" if shared_kv else "vo",
                                  rope_layout=layout, shared_kv=shared_kv, rotary_dim=rotary_dim, dtype="float64")
    torch.manual_seed(0)
    teacher = HybridLM(teacher_config)
    attn = teacher.blocks[0].mixer
    with torch.no_grad():
        attn.in_proj.weight[: 4 * 6].zero_()  # q = 0: every logit 0, softmax uniform over the causal prefix
    student = HybridLM(student_config(teacher_config, "R", {}, "teacher"))
    assert student.config.recurrence.rotary_dim == rotary_dim
    init_student(student, teacher, [0])
    return teacher, student


@pytest.mark.parametrize("layout, shared_kv, rotary_dim", [("interleaved", False, None), ("half", False, None),
                                                         ("interleaved", True, None), ("interleaved", False, 4),
                                                         ("half", False, 2)])
def test_copied_r_layer_scans_to_the_uniform_vo_attention(layout, shared_kv, rotary_dim):
    teacher, student = vo_models(layout, shared_kv, rotary_dim)
    attn, rec = teacher.blocks[0].mixer, student.blocks[0].mixer
    B, T, H, D = 2, 13, 4, 6
    x = torch.randn(B, T, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(1, T + 1, dtype=torch.float64)[None, :, None]  # i + 1

    with torch.no_grad():
        u, _ = rec.conv(rec.value_proj(x))  # the copied conv is the identity
        torch.testing.assert_close(u, rec.value_proj(x), rtol=0, atol=0)
        scan, _ = complex_scan(u.unflatten(-1, (H, D)), torch.zeros(H, D // 2, dtype=torch.float64),
                               rec.theta.double(), backend="reference")  # γ = 1
        from_r = rec.out_proj(scan.flatten(2) / positions)  # out_proj(s_i / (i + 1))
        # the layer's own scan inputs at γ = 1 (ν = −∞): its decay and angles scan u to the same sums; its write
        # sqrt(1 − γ²) is exactly 0 there (a held state)
        with torch.no_grad():
            rec.decay_nu.fill_(-float("inf"))
        v, log_decay, theta = rec.scan_inputs(x, u)
        assert (log_decay == 0).all() and (v == 0).all()
        own, _ = complex_scan(u.unflatten(-1, (H, D)), log_decay, theta, backend="reference")
        torch.testing.assert_close(own, scan, rtol=1e-12, atol=0)

        y32, _ = attn(x)  # float32 angles, as the library computes them
        float64_angles(attn)
        y64, _ = attn(x)
    torch.testing.assert_close(from_r, y32, rtol=1e-6, atol=1e-6 * y32.abs().max().item())
    torch.testing.assert_close(from_r, y64, rtol=1e-12, atol=1e-12 * y64.abs().max().item())
    w_o = attn.out_proj.weight  # copied; in the half layout its columns permuted per head into scan pairs
    if layout == "half":
        w_o = convert_projection(w_o, H, rotary_dim=rotary_dim, src="half", dst="interleaved", dim=1)
    torch.testing.assert_close(rec.out_proj.weight, w_o, rtol=0, atol=0)


def test_gqa_each_query_head_takes_the_values_of_its_kv_head():
    attn = Attention(8, 6, n_kv_heads=2, head_dim=4, placement="qk")
    rec = VORecurrence(8, 6, 4)
    recurrence_from_attention(attn, rec)
    w_v = attn.in_proj.weight[(6 + 2) * 4:]  # (G·D, d): kv head g = rows 4g … 4g + 3
    for h in range(6):
        torch.testing.assert_close(rec.value_proj.weight[4 * h:4 * h + 4], w_v[4 * (h // 3):4 * (h // 3) + 4],
                                   rtol=0, atol=0)
    torch.testing.assert_close(rec.out_proj.weight, attn.out_proj.weight, rtol=0, atol=0)


def test_init_student_copies_everything_else_from_the_teacher():
    config = HybridConfig.preset("transformer", d_model=16, n_layers=3, n_heads=2, vocab_size=64)
    teacher = HybridLM(config)
    student = HybridLM(config.replace(pattern="RAR", window=4))
    init_student(student, teacher, [0, 2])
    own, theirs = student.state_dict(), teacher.state_dict()
    for name, value in theirs.items():
        if name.startswith(("blocks.0.mixer.", "blocks.2.mixer.")):
            continue
        torch.testing.assert_close(own[name], value, rtol=0, atol=0, msg=name)


def test_decay_from_the_attentions_mean_distance():
    from hybrid.train.distill.mapping import attention_mean_distance, decay_from_attention

    teacher, student = vo_models("interleaved")
    attn, rec = teacher.blocks[0].mixer, student.blocks[0].mixer
    T = 12
    x = torch.randn(3, T, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected = sum(i / 2 for i in range(T // 2, T)) / (T - T // 2)  # uniform over j ≤ i: mean distance i/2
    torch.testing.assert_close(attention_mean_distance(attn, x), torch.full((4,), expected, dtype=torch.float64))
    gamma = decay_from_attention(attn, rec, x)
    torch.testing.assert_close(gamma, torch.full((4,), expected / (1 + expected), dtype=torch.float64))
    torch.testing.assert_close(rec.log_decay(), torch.log(gamma)[:, None].expand(4, 3))


def test_a_partial_rotary_teacher_gives_its_r_layers_its_rotary_dim_only_where_it_applies():
    """R = 4 of 16 channels: the replacing R layers rotate the same 4 (their phase static or learned); not with a
    phase that turns by the data or CARoPE (R does not apply there: such a student was refused for an option the
    user never set), nor when the teacher has R layers of its own, which the shared recurrence config would change."""
    teacher = HybridConfig.preset("transformer", d_model=32, n_layers=2, n_heads=2, vocab_size=64,
                                  **{"attention.rotary_dim": 4})
    assert student_config(teacher, "RA", {}, "t").recurrence.rotary_dim == 4
    assert student_config(teacher, "RA", {"rnn_phase": "learned"}, "t").recurrence.rotary_dim == 4
    assert student_config(teacher, "RA", {"rnn_phase": "data"}, "t").recurrence.rotary_dim is None
    carope = teacher.replace(carope=True)
    assert student_config(carope, "RA", {}, "t").recurrence.rotary_dim is None
    hybrid = teacher.replace(pattern="AR")
    assert student_config(hybrid, "RR", {}, "t").recurrence.rotary_dim is None
