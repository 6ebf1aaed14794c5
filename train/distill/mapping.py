"""The student's config and its initial weights: each R layer from the attention layer it replaces.

VO-RoPE attention with exponential decay is the R mixer's scan (``docs/design.md``): with rotary on v and o,

    attention    o_i = W_o Σ_{j≤i} a_ij R_{j−i} W_v x_j                      a_ij = softmax weights
    R layer      s_i = Σ_{j≤i} γ^{i−j} R_{j−i} v_j,   v_j = sqrt(1−γ²) conv(W_v' x)_j,
                 y_i = W_o' (gate_i ⊙ s_i)

so the R layer's value projection ``W_v'`` takes the attention's ``W_v`` and its output projection ``W_o'`` the
attention's ``W_o``; ``a_ij`` becomes ``γ^{i−j}`` (times the write scale ``sqrt(1−γ²)``) and the query / key
projections have no place. In detail (``recurrence_from_attention``):

- ``value_proj`` ``(H·D, d_model)``: head ``h``'s rows are the V rows of the kv head it reads, ``h // (H/G)``
  (GQA / MQA: a kv head's rows are repeated for each query head it serves; shared-KV: the shared projection).
- ``out_proj`` ``(d_model, H·D)``: the attention's ``out_proj``, as is.
- The R layer is built from the same ``HybridConfig`` as the attention (``n_heads``, ``head_dim``), so its width
  ``d_rnn = H·D`` is the attention's, also when ``H·D ≠ d_model`` (an explicit ``head_dim``).
- Rotary layout: the scan pairs channels ``(2k, 2k+1)`` of a head with frequency ``inv_freq(D)_k``. A teacher
  in the ``half`` layout (imported from transformers) pairs ``k`` with ``k + D/2``: its V rows and O columns are
  permuted per head into the interleaved order (``hybrid.rotary.convert_projection``), the same function.
  Partial rotary (``rotary_dim`` R < D): the first R/2 pairs turn at ``inv_freq(R)``, the rest not at all, in
  the attention and, through ``student_config``, in the R layer (``recurrence.rotary_dim``).
- ``conv`` starts as the identity (last tap 1, others and the bias 0), so ``u = W_v' x`` is the copied V.
- The decay: ``decay_from_attention`` sets each head's γ so that the weights ``γ^k`` have the attention head's
  mean distance (``DistillConfig.decay_init="attention"``); else the LRU ring of the fresh layer.
- Not copied: the gate ``gate_proj`` keeps its fresh initialisation; V / O biases (Qwen2) are dropped, the R
  layer has none; Q and K are dropped. Stage 1 learns the rest.
"""
from __future__ import annotations

import torch

from hybrid import Attention, RecurrenceConfig, VORecurrence
from hybrid.models import HybridConfig, HybridLM
from hybrid.models import mixers as mixer_table
from hybrid.models.config_names import FLAT_ALIASES, options_fields
from hybrid.rotary import convert_projection

from ..loop.init_from import copy_matching

__all__ = ["recurrence_from_attention", "init_student", "layer_types_for_pattern", "student_config",
           "attention_mean_distance", "decay_from_attention", "RNN_FIELDS"]

# the --set fields a student may change: the R layers' own options, by their dotted names (recurrence.rotary_dim,
# recurrence.hold_below, …) or their old flat names (rnn_selective, …), and training memory (recompute); never a
# shape the teacher's weights fix (the vocabulary, width, depth, heads, MLP)
RNN_FIELDS = (*(f"recurrence.{f}" for f in options_fields(RecurrenceConfig)),
              *(name for name, (section, _) in FLAT_ALIASES.items() if section == "recurrence"), "recompute")


def layer_types_for_pattern(pattern: str, n_layers: int) -> str:
    """The layer letters of ``pattern`` over ``n_layers`` layers, by HybridConfig's rule (``layer_types``): the
    pattern repeated and cut at ``n_layers``; a pattern longer than ``n_layers`` is refused (letters unused)."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"--pattern: expected mixer letters (R, A), got {pattern!r}")
    letters = set(mixer_table.MIXERS)
    if len(pattern) > n_layers:
        raise ValueError(f"--pattern: expected at most the teacher's n_layers={n_layers} letters (the pattern is "
                         f"repeated and cut at {n_layers} layers, as HybridConfig.layer_types does), got "
                         f"{pattern!r} ({len(pattern)} letters)")
    if set(pattern) - letters:  # a teacher's own M or G layers are repeated by their letter (the plan checks it)
        raise ValueError(f"--pattern: expected the letters R (a replaced attention layer) and A (a kept one), or "
                         f"the teacher's own at its other layers ({', '.join(sorted(letters - {'A', 'R'}))}), got "
                         f"{pattern!r}")
    reps = -(-n_layers // len(pattern))
    return (pattern * reps)[:n_layers]


@torch.no_grad()
def recurrence_from_attention(attn: Attention, rec: VORecurrence) -> None:
    """Set ``rec``'s value projection, output projection and conv from ``attn`` (see the module)."""
    H, G, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    if (rec.n_heads, rec.head_dim, rec.d_model) != (H, D, attn.d_model):
        raise ValueError(f"rec: expected n_heads={H}, head_dim={D}, d_model={attn.d_model} (the attention's), got "
                         f"{rec.n_heads}, {rec.head_dim}, {rec.d_model}")
    w = attn.in_proj.weight  # ((H + 2G)·D, d) or ((H + G)·D, d) with shared-KV
    start = (H if attn.shared_kv else H + G) * D
    w_v = w[start:start + G * D]  # (G·D, d): the V rows (the shared projection with shared-KV)
    w_v = w_v.unflatten(0, (G, D)).repeat_interleave(H // G, dim=0).flatten(0, 1)  # (H·D, d): head h reads h // (H/G)
    w_o = attn.out_proj.weight  # (d, H·D)
    if attn.rope_layout == "half":  # pair k with k + D/2 -> pairs (2k, 2k+1), the scan's order
        w_v = convert_projection(w_v, H, rotary_dim=attn.rotary_dim, src="half", dst="interleaved", dim=0)
        w_o = convert_projection(w_o, H, rotary_dim=attn.rotary_dim, src="half", dst="interleaved", dim=1)
    rec.value_proj.weight.copy_(w_v)
    rec.out_proj.weight.copy_(w_o)
    rec.conv.weight.zero_()
    rec.conv.weight[:, -1] = 1.0  # y_t = u_t: the identity
    if rec.conv.bias is not None:
        rec.conv.bias.zero_()


def init_student(student: HybridLM, teacher: HybridLM, replaced: list[int]) -> dict:
    """Copy into ``student`` everything that maps from ``teacher``: every tensor whose name and shape match
    (embeddings, norms, MLPs, the kept attention layers, the LM head), then each replaced layer's R mixer from the
    teacher's attention at that position. Returns what was done, for the run's notes."""
    for i in replaced:
        attn, rec = teacher.blocks[i].mixer, student.blocks[i].mixer
        if not isinstance(attn, Attention) or not isinstance(rec, VORecurrence):
            raise ValueError(f"layer {i}: expected an attention layer in the teacher and an R layer in the student, "
                             f"got {type(attn).__name__} and {type(rec).__name__}")
    state = {k: v for k, v in teacher.state_dict().items()
             if not any(k.startswith(f"blocks.{i}.mixer.") for i in replaced)}
    copied, fresh, _ = copy_matching(student, state)
    for i in replaced:
        recurrence_from_attention(teacher.blocks[i].mixer, student.blocks[i].mixer)
    return {"copied": len(copied), "mapped_layers": list(replaced),
            "fresh": sorted(n for n in fresh if not any(n.startswith(f"blocks.{i}.mixer.") for i in replaced))}


def student_config(teacher: HybridConfig, layer_types: str, overrides: dict, teacher_path: str) -> HybridConfig:
    """The teacher's config with the student's layers (an explicit letter per layer, or a pattern that
    ``layer_types_for_pattern`` accepted) and the ``--window`` / ``--set`` overrides. A teacher with partial
    rotary (``attention.rotary_dim`` R) gives its R layers the same R (``recurrence.rotary_dim``), so that the
    pairs its attention leaves unrotated stay unrotated in the scan: unless the overrides name it, the R layers'
    phase is one that turns by the data or CARoPE (where R does not apply), or the teacher has R layers of its own
    (one recurrence config serves every R layer, and the teacher's are kept as they are)."""
    meta = {**teacher.meta, "distilled_from": teacher_path}
    student = teacher.replace(pattern=layer_types, meta=meta, **overrides)
    partial = teacher.attention.rotary_dim
    if (partial is None or "recurrence.rotary_dim" in overrides or "R" not in layer_types
            or "R" in teacher.layer_types
            or student.recurrence.resolved_phase(student.rotary) not in ("static", "learned")):
        return student
    return student.replace(**{"recurrence.rotary_dim": partial})


@torch.no_grad()
def attention_mean_distance(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """Per query head, the mean distance ``Σ_j a_ij (i − j)`` of ``attn``'s weights on ``x`` ``(B, T, d_model)`` (the
    normed input of the layer, one window per row), over the rows ``i ≥ T/2`` (whose full prefix is at least T/2
    long, so short prefixes do not pull the figure down): ``(H,)`` float64."""
    B, T, _ = x.shape
    H, G = attn.n_heads, attn.n_kv_heads
    q, k, v = attn.project(x)
    cs_q, cs_kv, _ = attn.cos_sin(x, attn.init_state(B, x.device))
    q, k, _ = attn.rotate_qkv(q, k, v, cs_q, cs_kv)
    k = k.repeat_interleave(H // G, dim=2)  # (B, T, H, D)
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * attn.scale  # (B, H, T, T)
    dist = torch.arange(T, device=x.device)[:, None] - torch.arange(T, device=x.device)[None, :]  # i − j
    visible = (dist >= 0) if attn.window is None else (dist >= 0) & (dist < attn.window)
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    rows = slice(T // 2, T)
    return (weights[:, :, rows] * dist[rows].double()).sum(-1).mean(dim=(0, 2))  # (H,)


@torch.no_grad()
def decay_from_attention(attn: Attention, rec: VORecurrence, x: torch.Tensor,
                         r_max: float | None = None) -> torch.Tensor:
    """Set every pair of ``rec``'s head ``h`` to the static decay whose weights ``γ^k`` have the mean distance of
    the attention's head ``h`` on ``x``: ``γ/(1−γ) = d̄``, ``γ = d̄/(1+d̄)``, kept in [0.5, r_max].
    Returns γ ``(H,)``."""
    mean = attention_mean_distance(attn, x)
    gamma = (mean / (1 + mean)).clamp(0.5, rec.r_max if r_max is None else r_max)
    nu = torch.log(-torch.log(gamma))  # log γ = −exp(ν)
    rec.decay_nu.copy_(nu[:, None].expand_as(rec.decay_nu).to(rec.decay_nu.dtype))
    return gamma
