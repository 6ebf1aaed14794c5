"""The op cases: each context-parallel op against its one-rank op on the whole sequence (float64)."""
from __future__ import annotations

import torch

from common import F64, L, case, compare, packings, rel_err, summed, world_of
from hybrid.kernels import causal_conv1d, complex_scan, window_attention
from hybrid.kernels.context_parallel import (causal_conv1d_cp, complex_scan_cp, retention_cp, shard_sequence,
                                             vo_gla_cp, window_attention_cp)
from hybrid.kernels.retention import retention_chunkwise
from hybrid.kernels.vo_gla import vo_gla

B, H, D = 2, 2, 6  # D/2 = 3 rotary pairs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, generator=_gen(seed))


def _decays(rows: int, T: int, data: bool, seed: int):
    """log γ ≤ 0 (γ in about 0.7 … 0.999: the carry matters across a shard) and θ, static or per token."""
    shape = (rows, T, H, D // 2) if data else (H, D // 2)
    u = torch.rand(shape, dtype=F64, generator=_gen(seed))
    return torch.log(0.7 + 0.299 * u), 2.0 * torch.rand(shape, dtype=F64, generator=_gen(seed + 1))


# ------------------------------------------------------------------------------------------ complex scan


def _scan_case(group, *, data: bool, cu: list[int] | None, seed: int) -> dict:
    T = L * world_of(group)
    rows = 1 if cu is not None else B
    n_init = rows if cu is None else len(cu) - 1
    log_decay, theta = _decays(rows, T, data, seed)
    seq = {"x": _randn(rows, T, H, D, seed=seed + 2)}
    whole = {"s0": _randn(n_init, H, D, seed=seed + 3)}
    (seq if data else whole).update(log_decay=log_decay, theta=theta)
    cu_t = None if cu is None else torch.tensor(cu)

    def one(x, log_decay, theta, s0):
        return complex_scan(x, log_decay, theta, s0, cu_seqlens=cu_t)[0]

    def cp(shard, x, log_decay, theta, s0):
        return complex_scan_cp(x, log_decay, theta, s0, shard=shard)[0]

    errors = compare(group, T, one, cp, seq, whole, cu=cu, seed=seed)
    errors.update(_final_states(group, T, cu, seq, whole, "scan"))
    return errors


def _final_states(group, T: int, cu, seq: dict, whole: dict, op: str) -> dict:
    """The state after this shard's last token (per local piece when packed) against one rank's run on the
    prefix that ends there; and the carry is needed (without it the shard's output would differ)."""
    shard = shard_sequence(T, group, cu_seqlens=None if cu is None else torch.tensor(cu))
    end = shard.start + shard.length
    prefix_cu = None if cu is None else torch.tensor([b for b in cu if b < end] + [end])
    prefix = {k: v[:, :end] for k, v in seq.items()}
    local = {k: shard.take(v) for k, v in seq.items()}
    if op == "scan":
        args = lambda d: (d["x"], d.get("log_decay", whole.get("log_decay")), d.get("theta", whole.get("theta")))  # noqa: E731
        _, want = complex_scan(*args(prefix), whole["s0"][: (len(prefix_cu) - 1) if cu else None],
                               output_final_state=True, cu_seqlens=prefix_cu)
        y, got = complex_scan_cp(*args(local), whole["s0"], shard=shard, output_final_state=True)
        alone, _ = complex_scan(*args(local), None, cu_seqlens=shard.cu_seqlens)
    elif op == "gla":
        args = lambda d: tuple(d.get(n, whole.get(n)) for n in ("q", "k", "v", "log_decay", "theta"))  # noqa: E731
        s0 = whole["s0"][: (len(prefix_cu) - 1)] if cu else whole["s0"]
        _, want = vo_gla(*args(prefix), s0, output_final_state=True, cu_seqlens=prefix_cu, tile_size=3)
        y, got = vo_gla_cp(*args(local), whole["s0"], shard=shard, output_final_state=True, tile_size=3)
        alone, _ = vo_gla(*args(local), None, cu_seqlens=shard.cu_seqlens, tile_size=3)
    else:
        lg = whole["log_gamma"]
        s0 = whole["s0"][: (len(prefix_cu) - 1)] if cu else whole["s0"]
        _, want = retention_chunkwise(prefix["q"], prefix["k"], prefix["v"], lg, s0, output_final_state=True,
                                      cu_seqlens=prefix_cu, tile_size=3)
        y, got = retention_cp(local["q"], local["k"], local["v"], lg, whole["s0"], shard=shard,
                              output_final_state=True, tile_size=3)
        alone, _ = retention_chunkwise(local["q"], local["k"], local["v"], lg, None, cu_seqlens=shard.cu_seqlens,
                                       tile_size=3)
    if cu is not None:
        want = want[list(shard.piece_docs)]
    errors = {"final state": rel_err(got, want)}
    if shard.continues:  # the test would see a missing carry
        errors["carry matters (1 if it does)"] = 1.0 - float((y - alone).abs().max() > 1e-3)
    return errors


for _data in (False, True):
    _kind = "data-dependent" if _data else "static"
    case(f"scan {_kind} decay and phase, initial state")(
        lambda g, d=_data: _scan_case(g, data=d, cu=None, seed=10 + d))

for _i, _name in enumerate(("near-edges", "at-edges", "across-all")):
    case(f"scan packed {_name}, data-dependent, per-document initial states")(
        lambda g, n=_name, i=_i: _scan_case(g, data=True, cu=packings(world_of(g))[n], seed=20 + i))
    case(f"scan packed {_name}, static")(
        lambda g, n=_name, i=_i: _scan_case(g, data=False, cu=packings(world_of(g))[n], seed=30 + i))


@case("scan final state gradient on the last rank")
def _scan_final_grad(group):
    T = L * world_of(group)
    x, s0 = _randn(B, T, H, D, seed=40), _randn(B, H, D, seed=41)
    log_decay, theta = _decays(B, T, True, 42)
    gf = _randn(B, H, D, seed=43)
    ref = [t.clone().requires_grad_() for t in (x, log_decay, theta, s0)]
    y, f = complex_scan(*ref, output_final_state=True)
    g = _randn(*y.shape, seed=44)
    want = torch.autograd.grad((y * g).sum() + (f * gf).sum(), ref)
    shard = shard_sequence(T, group)
    cp = [shard.take(t).clone().requires_grad_() for t in (x, log_decay, theta)] + [s0.clone().requires_grad_()]
    y, f = complex_scan_cp(*cp, shard=shard, output_final_state=True)
    last = shard.rank == shard.world - 1
    got = torch.autograd.grad((y * shard.take(g)).sum() + (f * gf).sum() * last, cp, allow_unused=True)
    got = [torch.zeros_like(t) if d is None else d for t, d in zip(cp, got)]  # s0 is read on rank 0 only
    return {"grad x": rel_err(got[0], shard.take(want[0])), "grad log_decay": rel_err(got[1], shard.take(want[1])),
            "grad theta": rel_err(got[2], shard.take(want[2])), "grad s0": rel_err(summed(got[3], group), want[3])}


# ------------------------------------------------------------------------------------------ retention


def _retention_case(group, *, cu: list[int] | None, seed: int) -> dict:
    T = L * world_of(group)
    rows = 1 if cu is not None else B
    n_init = rows if cu is None else len(cu) - 1
    seq = {"q": _randn(rows, T, H, 4, seed=seed), "k": _randn(rows, T, H, 4, seed=seed + 1) / 2,
           "v": _randn(rows, T, H, 5, seed=seed + 2)}
    whole = {"log_gamma": torch.log(torch.tensor([0.9, 0.97], dtype=F64)), "s0": _randn(n_init, H, 4, 5, seed=seed + 3)}
    cu_t = None if cu is None else torch.tensor(cu)

    def one(q, k, v, log_gamma, s0):
        return retention_chunkwise(q, k, v, log_gamma, s0, cu_seqlens=cu_t, tile_size=3)[0]

    def cp(shard, q, k, v, log_gamma, s0):
        return retention_cp(q, k, v, log_gamma, s0, shard=shard, tile_size=3)[0]

    errors = compare(group, T, one, cp, seq, whole, cu=cu, seed=seed)
    errors.update(_final_states(group, T, cu, seq, whole, "retention"))
    return errors


case("retention, initial state")(lambda g: _retention_case(g, cu=None, seed=50))
for _i, _name in enumerate(("near-edges", "at-edges", "across-all")):
    case(f"retention packed {_name}, per-document initial states")(
        lambda g, n=_name, i=_i: _retention_case(g, cu=packings(world_of(g))[n], seed=60 + i))


# ------------------------------------------------------------------------------------------ vo_gla (the G mixer's op)

DK, DV = 3, 4  # Dv/2 = 2 value pairs


def _gla_inputs(rows: int, T: int, *, data_decay: bool, data_phase: bool, seed: int) -> tuple[dict, dict]:
    """q, k, v per token; log γ (γ in about 0.7 … 0.999) and θ ∈ [0, 2) static per head (and pair) or per token.
    Returns ``(per-token inputs, whole-sequence inputs)`` without the initial state."""
    seq = {"q": _randn(rows, T, H, DK, seed=seed), "k": _randn(rows, T, H, DK, seed=seed + 1) / 2,
           "v": _randn(rows, T, H, DV, seed=seed + 2)}
    whole = {}
    decay_shape = (rows, T, H) if data_decay else (H,)
    phase_shape = (rows, T, H, DV // 2) if data_phase else (H, DV // 2)
    (seq if data_decay else whole)["log_decay"] = torch.log(
        0.7 + 0.299 * torch.rand(decay_shape, dtype=F64, generator=_gen(seed + 3)))
    (seq if data_phase else whole)["theta"] = 2.0 * torch.rand(phase_shape, dtype=F64, generator=_gen(seed + 4))
    return seq, whole


def _gla_case(group, *, data_decay: bool, data_phase: bool, cu: list[int] | None, seed: int) -> dict:
    T = L * world_of(group)
    rows = 1 if cu is not None else B
    n_init = rows if cu is None else len(cu) - 1
    seq, whole = _gla_inputs(rows, T, data_decay=data_decay, data_phase=data_phase, seed=seed)
    whole["s0"] = _randn(n_init, H, DK, DV, seed=seed + 5)
    cu_t = None if cu is None else torch.tensor(cu)

    def one(q, k, v, log_decay, theta, s0):
        return vo_gla(q, k, v, log_decay, theta, s0, cu_seqlens=cu_t, tile_size=3)[0]

    def cp(shard, q, k, v, log_decay, theta, s0):
        return vo_gla_cp(q, k, v, log_decay, theta, s0, shard=shard, tile_size=3)[0]

    errors = compare(group, T, one, cp, seq, whole, cu=cu, seed=seed)
    errors.update(_final_states(group, T, cu, seq, whole, "gla"))
    return errors


def _kinds(data_decay: bool, data_phase: bool) -> str:
    return f"{'data-dependent' if data_decay else 'static'} decay, {'data-dependent' if data_phase else 'static'} phase"


for _dd in (False, True):
    for _dp in (False, True):
        case(f"gla {_kinds(_dd, _dp)}, initial state")(
            lambda g, dd=_dd, dp=_dp: _gla_case(g, data_decay=dd, data_phase=dp, cu=None, seed=160 + 2 * dd + dp))
for _i, _name in enumerate(("near-edges", "at-edges", "across-all")):
    case(f"gla packed {_name}, {_kinds(True, True)}, per-document initial states")(
        lambda g, n=_name, i=_i: _gla_case(g, data_decay=True, data_phase=True, cu=packings(world_of(g))[n],
                                           seed=170 + i))
    case(f"gla packed {_name}, {_kinds(False, False)}")(
        lambda g, n=_name, i=_i: _gla_case(g, data_decay=False, data_phase=False, cu=packings(world_of(g))[n],
                                           seed=180 + i))


@case("gla final state gradient on the last rank")
def _gla_final_grad(group):
    T = L * world_of(group)
    seq, _ = _gla_inputs(B, T, data_decay=True, data_phase=True, seed=190)
    names = ("q", "k", "v", "log_decay", "theta")
    s0, gf = _randn(B, H, DK, DV, seed=196), _randn(B, H, DK, DV, seed=197)
    ref = [seq[n].clone().requires_grad_() for n in names] + [s0.clone().requires_grad_()]
    o, f = vo_gla(*ref, output_final_state=True, tile_size=3)
    g = _randn(*o.shape, seed=198)
    want = torch.autograd.grad((o * g).sum() + (f * gf).sum(), ref)
    shard = shard_sequence(T, group)
    cp = [shard.take(seq[n]).clone().requires_grad_() for n in names] + [s0.clone().requires_grad_()]
    o, f = vo_gla_cp(*cp, shard=shard, output_final_state=True, tile_size=3)
    last = shard.rank == shard.world - 1
    got = torch.autograd.grad((o * shard.take(g)).sum() + (f * gf).sum() * last, cp, allow_unused=True)
    got = [torch.zeros_like(t) if d is None else d for t, d in zip(cp, got)]  # s0 is read on rank 0 only
    errors = {f"grad {n}": rel_err(got[i], shard.take(want[i])) for i, n in enumerate(names)}
    errors["grad s0"] = rel_err(summed(got[-1], group), want[-1])
    return errors


# ------------------------------------------------------------------------------------------ causal conv


def _conv_case(group, *, width: int, cu: list[int] | None, seed: int) -> dict:
    T, C = L * world_of(group), 5
    rows = 1 if cu is not None else B
    n_init = rows if cu is None else len(cu) - 1
    seq = {"x": _randn(rows, T, C, seed=seed)}
    whole = {"w": _randn(C, width, seed=seed + 1), "b": _randn(C, seed=seed + 2),
             "s0": _randn(n_init, width - 1, C, seed=seed + 3)}
    cu_t = None if cu is None else torch.tensor(cu)

    def one(x, w, b, s0):
        return causal_conv1d(x, w, b, s0, cu_seqlens=cu_t)[0]

    def cp(shard, x, w, b, s0):
        return causal_conv1d_cp(x, w, b, s0, shard=shard)[0]

    errors = compare(group, T, one, cp, seq, whole, cu=cu, seed=seed)
    shard = shard_sequence(T, group, cu_seqlens=cu_t)
    end = shard.start + shard.length
    prefix_cu = None if cu is None else torch.tensor([b for b in cu if b < end] + [end])
    s0 = whole["s0"][: len(prefix_cu) - 1] if cu else whole["s0"]
    _, want = causal_conv1d(seq["x"][:, :end], whole["w"], whole["b"], s0, output_final_state=True,
                            cu_seqlens=prefix_cu)
    _, got = causal_conv1d_cp(shard.take(seq["x"]), whole["w"], whole["b"], whole["s0"], shard=shard,
                              output_final_state=True)
    errors["final state"] = rel_err(got, want if cu is None else want[list(shard.piece_docs)])
    return errors


for _width in (4, 2 * L - 2):  # a halo inside one shard, and one reaching two shards back
    case(f"conv width {_width}, initial state")(lambda g, w=_width: _conv_case(g, width=w, cu=None, seed=70 + w))
    for _i, _name in enumerate(("near-edges", "at-edges", "across-all")):
        case(f"conv width {_width} packed {_name}, per-document initial states")(
            lambda g, w=_width, n=_name, i=_i: _conv_case(g, width=w, cu=packings(world_of(g))[n], seed=80 + w + i))
# W − 1 past the whole sequence: the initial state reaches further back than position 0 (the halo was cut at it)
case(f"conv width {3 * L + 2}, initial state")(lambda g: _conv_case(g, width=3 * L + 2, cu=None, seed=75))
case(f"conv width {3 * L + 2} packed across-all, per-document initial states")(
    lambda g: _conv_case(g, width=3 * L + 2, cu=packings(world_of(g))["across-all"], seed=76))


# ------------------------------------------------------------------------------------------ attention


def _attention_case(group, *, window, cu: list[int] | None, shared: bool, seed: int) -> dict:
    T, Hq, G, Dh = L * world_of(group), 4, 2, 4
    rows = 1 if cu is not None else B
    seq = {"q": _randn(rows, T, Hq, Dh, seed=seed), "k": _randn(rows, T, G, Dh, seed=seed + 1)}
    if not shared:
        seq["v"] = _randn(rows, T, G, Dh, seed=seed + 2)
    cu_t = None if cu is None else torch.tensor(cu)

    def one(q, k, v=None):
        return window_attention(q, k, k if v is None else v, window, scale=0.6, cu_seqlens=cu_t)

    def cp(shard, q, k, v=None):
        return window_attention_cp(q, k, v, window, shard=shard, scale=0.6)

    return compare(group, T, one, cp, seq, {}, cu=cu, seed=seed)


for _window in (3, L + 3, 2 * L + 3, None):  # inside a shard, one and two shards back, global
    _w = "global" if _window is None else f"window {_window}"
    case(f"attention {_w}, GQA")(lambda g, w=_window: _attention_case(g, window=w, cu=None, shared=False, seed=90))
    case(f"attention {_w}, shared KV")(lambda g, w=_window: _attention_case(g, window=w, cu=None, shared=True,
                                                                            seed=91))
    for _i, _name in enumerate(("near-edges", "at-edges", "across-all")):
        case(f"attention {_w} packed {_name}")(
            lambda g, w=_window, n=_name, i=_i: _attention_case(g, window=w, cu=packings(world_of(g))[n],
                                                                shared=False, seed=92 + i))


@case("scan traffic: count_traffic sees one carry exchange")
def _scan_traffic(group):
    from hybrid.kernels.context_parallel import count_traffic

    world = world_of(group)
    shard = shard_sequence(L * world, group)
    x = _randn(B, L, H, D, seed=150).requires_grad_()
    log_decay, theta = _decays(B, L, True, 151)
    with count_traffic() as traffic:
        y, _ = complex_scan_cp(x, log_decay, theta, shard=shard)
        y.sum().backward()
    n = 2 * B * H * D * 8  # the transition and the zero-start state, float64, per rank
    return {"forward bytes": traffic.forward - (world - 1) * n,
            "backward bytes": traffic.backward - 2 * (world - 1) * n,
            "labelled": traffic.by_label[("scan carry", "forward")] - traffic.forward}
