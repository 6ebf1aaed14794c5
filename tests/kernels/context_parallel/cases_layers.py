"""The mixer and model cases: each mixer's and each preset's context-parallel forward against one rank's
(float64): outputs, the input's gradient and every parameter's gradient."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common import F64, L, case, compare_module, packings, rel_err, summed, world_of
from hybrid import Attention, MultiScaleRetention, RotaryConfig, VOGatedLinearAttention, VORecurrence
from hybrid.kernels.context_parallel import global_token_mean, shard_sequence
from hybrid.models import HybridConfig, HybridLM

D_MODEL, HEADS = 16, 2


def _x(T: int, rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, T, D_MODEL, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _mixer_case(group, make, *, cu_name: str | None, seed: int) -> dict:
    T = L * world_of(group)
    cu = None if cu_name is None else packings(world_of(group))[cu_name]
    x = _x(T, 1 if cu else 2, seed)

    def built():
        torch.manual_seed(seed)
        return make().double()

    def one(m, x, cu_t):
        return m(x, cu_seqlens=cu_t, output_final_state=False)[0]

    def sharded(m, x, shard):
        return m(x, shard=shard, output_final_state=False)[0]

    return compare_module(group, built, x, one, sharded, cu=cu, seed=seed)


RECURRENCES = {
    "static": dict(),
    "learned phase, partial rotary_dim": dict(phase="learned", rotary_dim=2),
    "carope": dict(phase="carope"),
    "data phase, selective, readout_norm": dict(phase="data", selective=True, readout_norm=True),
    "real-sign, hardsigmoid hold": dict(phase="data", phase_map="real-sign", selective=True,
                                        selective_gate="hardsigmoid", hold_below=0.3),
    f"conv width {2 * L - 2} (halo two shards back)": dict(conv_width=2 * L - 2),
}
ATTENTIONS = {
    "qk global": dict(placement="qk"),
    "qkvo window 3": dict(window=3),
    f"qkvo window {L + 3} (longer than a shard)": dict(window=L + 3),
    "k only (absolute positions)": dict(placement="k", window=2 * L + 3),
    "GQA, shared KV": dict(n_kv_heads=1, shared_kv=True, window=L + 3),
    "carope global": dict(carope=True),
    "carope window 5, GQA": dict(carope=True, window=5, n_kv_heads=1),
}

GLAS = {
    "selective decay, static phase": dict(),
    "static decay, learned phase, partial rotary_dim": dict(decay="static", phase="learned", rotary_dim=2),
    "selective decay, data phase, no conv": dict(phase="data", conv_width=0),
    "static decay, data phase rounded": dict(decay="static", phase="data", phase_round=8),
    f"key_dim 3, value_dim 6, conv width {2 * L - 2} (halo two shards back)": dict(key_dim=3, value_dim=6,
                                                                                   conv_width=2 * L - 2),
}


def _recurrence(options):
    return lambda: VORecurrence(D_MODEL, HEADS, rotary=RotaryConfig(base=100.0), r_min=0.8, **options)


def _attention(options):
    options = dict(options)
    rotary = RotaryConfig(base=100.0, carope=options.pop("carope", False))
    return lambda: Attention(D_MODEL, 4, 4, rotary=rotary, **options)


def _gla(options):
    def make():
        layer = VOGatedLinearAttention(D_MODEL, HEADS, rotary=RotaryConfig(base=100.0), tile_size=3, **options)
        with torch.no_grad():  # the data-dependent decay and phase start static (zero weights): make them vary
            for name, p in layer.named_parameters():
                if name in ("decay_weight", "data_phase.weight"):
                    p.normal_(0.0, 0.5)
        return layer
    return make


for _name, _opts in RECURRENCES.items():
    for _cu in (None, "near-edges", "across-all"):
        case(f"R {_name}" + ("" if _cu is None else f", packed {_cu}"))(
            lambda g, o=_opts, c=_cu: _mixer_case(g, _recurrence(o), cu_name=c, seed=100))
for _name, _opts in ATTENTIONS.items():
    for _cu in (None, "near-edges", "across-all"):
        case(f"A {_name}" + ("" if _cu is None else f", packed {_cu}"))(
            lambda g, o=_opts, c=_cu: _mixer_case(g, _attention(o), cu_name=c, seed=110))
for _name, _opts in GLAS.items():
    for _cu in (None, "near-edges", "across-all"):
        case(f"G {_name}" + ("" if _cu is None else f", packed {_cu}"))(
            lambda g, o=_opts, c=_cu: _mixer_case(g, _gla(o), cu_name=c, seed=125))
for _cu in (None, "near-edges", "at-edges", "across-all"):
    case("M" + ("" if _cu is None else f", packed {_cu}"))(
        lambda g, c=_cu: _mixer_case(g, lambda: MultiScaleRetention(D_MODEL, HEADS, tile_size=3,
                                                                    rotary=RotaryConfig(base=100.0)),
                                     cu_name=c, seed=120))


# ------------------------------------------------------------------------------------------ models


def _config(preset: str, **overrides) -> HybridConfig:
    values = dict(vocab_size=40, d_model=D_MODEL, n_layers=3, n_heads=HEADS, dtype="float64", rope_base=100.0)
    values.update(overrides)
    return HybridConfig.preset(preset, "tiny", **values)


def _model_case(group, config: HybridConfig, *, cu_name: str | None, seed: int) -> dict:
    """Logits, the loss (the global token mean) and every parameter's gradient of the loss."""
    world = world_of(group)
    T = L * world
    cu = None if cu_name is None else packings(world)[cu_name]
    cu_t = None if cu is None else torch.tensor(cu)
    rows = 1 if cu else 2
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (rows, T + 1), generator=gen)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    torch.manual_seed(seed)
    one = HybridLM(config)
    cp = HybridLM(config)
    cp.load_state_dict(one.state_dict())
    logits, _ = one(inputs, cu_seqlens=cu_t, output_final_state=False)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    shard = shard_sequence(T, group, cu_seqlens=cu_t)
    local, _ = cp(shard.take(inputs), shard=shard, output_final_state=False)
    loss_sum = F.cross_entropy(local.flatten(0, 1), shard.take(targets).flatten(), reduction="sum")
    share, mean = global_token_mean(loss_sum, shard.take(targets).numel(), shard)
    share.backward()
    errors = {"logits": rel_err(local, shard.take(logits)), "loss": rel_err(mean, loss.detach())}
    worst = 0.0
    for (name, p), q in zip(one.named_parameters(), cp.parameters()):
        worst = max(worst, rel_err(summed(q.grad, group), p.grad))
    errors["grad params (worst)"] = worst
    return errors


MODELS = {
    "transformer": _config("transformer"),
    "retnet": _config("retnet"),
    "vo-rnn": _config("vo-rnn"),
    "vo-gla": _config("vo-gla"),
    "vo-gla, static decay, data phase, pattern GRA": _config(
        "vo-gla", pattern="GRA", window=5, **{"gla.decay": "static", "gla.phase": "data"}),
    "hybrid, window 5": _config("hybrid", window=5),
    f"hybrid, window {L + 4}, learned absolute positions, recompute linear": _config(
        "hybrid", window=L + 4, abs_pos="learned", abs_pos_max_len=64, recompute="linear"),
    "hybrid, carope, selective data phase, sinusoidal positions, recompute all": _config(
        "hybrid", window=6, carope=True, abs_pos="sinusoidal", recompute="all",
        **{"recurrence.selective": True, "recurrence.phase": "data"}),
    "RMA, GQA, shared KV": _config("hybrid", pattern="RMA", window=L + 2, n_heads=4,
                                   **{"attention.n_kv_heads": 2, "attention.shared_kv": True}),
}
for _name, _cfg in MODELS.items():
    case(f"model {_name}")(lambda g, c=_cfg: _model_case(g, c, cu_name=None, seed=130))
for _cu in ("near-edges", "across-all"):
    case(f"model hybrid, window {L + 4}, packed {_cu}")(
        lambda g, c=_cu: _model_case(g, _config("hybrid", window=L + 4), cu_name=c, seed=140))
    case(f"model transformer, packed {_cu}")(
        lambda g, c=_cu: _model_case(g, _config("transformer"), cu_name=c, seed=141))
    case(f"model vo-gla, packed {_cu}")(
        lambda g, c=_cu: _model_case(g, _config("vo-gla"), cu_name=c, seed=142))
