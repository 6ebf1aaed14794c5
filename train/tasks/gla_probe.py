"""What a trained G layer (``hybrid.gla``) does on parity: its carrier pair's angles and decays, and what its read-out
at the last token is made of, at the training length and at a longer one.

Parity's automaton in G: one head holds its state exactly (γ_t = 1 on both bits) and turns a value pair by π (or
by π/2, counting mod 4) on every ``1``, so the write of ``<bos>`` (the anchor) reaches the last token's read-out with the sign of the parity.
Two things can still fail at a length the model never saw:

- the decay: the head's γ_t is one number for all its pairs, and a gate that stays open on one bit fades the anchor
  (``kept`` = exp Σ_t log γ_t after ``<bos>``);
- the other pairs: with the head held, their sums of writes grow with the length, and the per-head output norm
  (``output_norm``) divides the carrier by the whole head, so the carrier's share falls although it is exact.

``gla_parity_probe`` reads both off a run's checkpoint, in float64 from the layer's own inputs.

On passkey the same split asks whether the key is still what the query reads: ``gla_passkey_probe`` divides each G
head's read-out at the query marker into the writes of the key (its marker and digits) and of everything else.
A head that holds the key exactly (γ_t = 1 on the filler) also keeps every filler write, so the filler's part
grows with the length while the key's stays.
"""
from __future__ import annotations

import copy
import math

import torch

from hybrid.gla import VOGatedLinearAttention

from .base import rng_of
from .train import TEST_SEED

__all__ = ["GLA_PROBE_COLUMNS", "PASSKEY_PROBE_COLUMNS", "gla_parity_probe", "gla_passkey_probe", "gla_probe_run",
           "last_token_parts"]

TURN_ABOVE = 0.4  # a pair counts the ones when its mean angle on ``1`` is above this many π (π: parity itself;
# π/2, a quarter turn: the count mod 4, from which parity reads as well)


def _g_layers(model: torch.nn.Module) -> list[VOGatedLinearAttention]:
    layers = [m for m in model.modules() if isinstance(m, VOGatedLinearAttention)]
    if not layers:
        raise ValueError("model: expected a model with a G layer (VOGatedLinearAttention), got none")
    return layers


@torch.no_grad()
def _all_layer_inputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list, list[torch.Tensor], torch.Tensor]:
    """Every G layer of ``model``, its input ``(B, T, d_model)`` along ``ids`` in parallel mode, and the logits."""
    layers = _g_layers(model)
    seen: dict[int, torch.Tensor] = {}
    hooks = [g.register_forward_pre_hook(lambda m, args, kwargs, i=i: seen.__setitem__(i, args[0]), with_kwargs=True)
             for i, g in enumerate(layers)]
    try:
        model.eval()
        logits, _ = model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return layers, [seen[i] for i in range(len(layers))], logits


def _layer_inputs(model: torch.nn.Module, ids: torch.Tensor, layer: int) -> tuple[VOGatedLinearAttention, torch.Tensor]:
    """G layer ``layer`` of ``model`` and its input ``(B, T, d_model)`` along ``ids`` in parallel mode."""
    layers, inputs, _ = _all_layer_inputs(model, ids)
    return layers[layer], inputs[layer]


@torch.no_grad()
def last_token_parts(g: VOGatedLinearAttention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The G layer's transitions along x ``(B, T, d_model)`` and its read-out at the last token split by write, in
    float64: ``log_decay`` ``(B, T, H)``, ``theta`` ``(B, T, H, P)`` and ``parts`` ``(B, T, H, Dv)``, where
    ``parts[:, j]`` is write j's share of ``o_T`` (their sum), ``e^{b_T − b_j} (q_T·k_j) R_{Φ_j − Φ_T} v_j``."""
    g = copy.deepcopy(g).double()
    x = x.double()
    q, k, _ = g._keys(x, None)  # (B, T, H, Dk) each
    v = g.v_proj(x).unflatten(-1, (g.n_heads, g.value_dim))  # (B, T, H, Dv)
    B, T = x.shape[:2]
    log_decay = g.log_decay(x).expand(B, T, g.n_heads)
    theta = g.angles(x).expand(B, T, g.n_heads, g.value_dim // 2)
    b, phi = log_decay.cumsum(1), theta.cumsum(1)
    weight = (b[:, -1:] - b).exp() * torch.einsum("bhd,bjhd->bjh", q[:, -1], k)  # (B, T, H)
    turn = phi[:, -1:] - phi  # (B, T, H, P): the angle write j has turned by at T
    pairs = v.unflatten(-1, (-1, 2))  # (B, T, H, Dv) -> (B, T, H, P, 2)
    c, s = torch.cos(turn), torch.sin(turn)
    turned = torch.stack((pairs[..., 0] * c + pairs[..., 1] * s, pairs[..., 1] * c - pairs[..., 0] * s), -1)
    return {"log_decay": log_decay, "theta": theta, "parts": weight[..., None] * turned.flatten(-2)}


def _on_bits(model, task, length: int, n: int, layer: int):
    ids = task.test_batch(str(length), n, rng_of(TEST_SEED)).ids  # (n, length + 1), <bos> first
    g, x = _layer_inputs(model, ids.to(next(model.parameters()).device), layer)
    return ids.cpu(), last_token_parts(g, x.cpu())


def gla_parity_probe(model: torch.nn.Module, task, length: int, n: int = 64, *, layer: int = 0) -> dict:
    """G layer ``layer`` on ``n`` parity test sequences (``TEST_SEED``) at the longest training length and at
    ``length`` bits.

    The carrier is the counting pair (mean θ on ``1`` above ``TURN_ABOVE``·π) whose anchor (``<bos>``'s write) is
    largest in the read-out at the training length. Returns ``counting_pairs``, ``pair`` (head, pair), ``theta_one`` /
    ``theta_zero`` (its mean θ per bit, units of π), ``held_one`` / ``held_zero`` (the share of each bit with
    γ_t = 1 exactly in its head), ``gamma_one`` / ``gamma_zero`` (the median γ_t per bit), ``kept`` (the median of
    exp Σ log γ_t after ``<bos>`` at ``length``); and at the training length and at ``length`` (suffixes
    ``_train``, ``_long``; medians over the sequences): ``anchor`` and ``writes`` (|anchor| and |the other writes'
    sum| on the carrier pair of o_T) and ``others`` (|o_T| over the head's other pairs)."""
    one, zero = task.tokens["1"], task.tokens["0"]
    result = {"length": length, "sequences": n}
    for name, at in (("train", task.longest_train_length), ("long", length)):
        ids, parts = _on_bits(model, task, at, n, layer)
        bits = ids[:, :, None]
        if name == "train":
            theta_one = (parts["theta"] * (bits == one)[..., None]).sum((0, 1)) / (bits == one).sum((0, 1))[..., None]
            flips = theta_one > TURN_ABOVE * math.pi  # (H, P)
            result["counting_pairs"] = int(flips.sum())
            if not bool(flips.any()):
                return result
            anchor = parts["parts"][:, 0].unflatten(-1, (-1, 2)).norm(dim=-1).median(0).values  # (H, P)
            h, p = divmod(int(anchor.masked_fill(~flips, -1.0).argmax()), flips.shape[1])
            result["pair"] = [h, p]
        carrier = parts["parts"][..., h, :].unflatten(-1, (-1, 2))  # (n, T, P, 2)
        others = torch.cat([carrier[:, :, :p], carrier[:, :, p + 1:]], 2).sum(1).flatten(1)  # (n, 2·(P − 1))
        result[f"anchor_{name}"] = float(carrier[:, 0, p].norm(dim=-1).median())
        result[f"writes_{name}"] = float(carrier[:, 1:, p].sum(1).norm(dim=-1).median())
        result[f"others_{name}"] = float(others.norm(dim=-1).median())
        if name == "long":
            theta, log_decay = parts["theta"][:, 1:, h, p], parts["log_decay"][:, 1:, h]  # (n, length) each
            on_one, on_zero = ids[:, 1:] == one, ids[:, 1:] == zero
            result.update({
                "theta_one": float(theta[on_one].mean()) / math.pi, "theta_zero": float(theta[on_zero].mean()) / math.pi,
                "held_one": float((log_decay[on_one] == 0).double().mean()),
                "held_zero": float((log_decay[on_zero] == 0).double().mean()),
                "gamma_one": float(log_decay[on_one].exp().median()),
                "gamma_zero": float(log_decay[on_zero].exp().median()),
                "kept": float(log_decay.sum(1).exp().median()),
            })
    return result


@torch.no_grad()
def gla_passkey_probe(model: torch.nn.Module, task, length: int, depth: float = 0.5, n: int = 8) -> list[dict]:
    """Every G head's read-out at the query marker of ``n`` passkey sequences of ``length`` with the key at
    ``depth`` (fresh validation filler and keys, seed ``TEST_SEED``), split into the writes of the key (its marker
    and digits) and of everything else before the query. One dict per layer and head: ``exact`` (the share of
    the sequences whose key the model returns whole), ``key`` and ``other`` (medians of |the part|), ``share``
    (key / (key + other)) and ``held`` (the share of filler tokens on which the head's γ_t is exactly 1)."""
    rng = rng_of(TEST_SEED)
    where = task.key_position(length, depth)
    batch = task.build(task.haystacks(length, n, rng, "valid"), rng.integers(0, 10, size=(n, task.k)), where)
    query = task.query_position(length)
    layers, inputs, logits = _all_layer_inputs(model, batch.ids.to(next(model.parameters()).device))
    exact = float((logits.argmax(-1).cpu() == batch.labels)[:, -task.k:].all(1).double().mean())
    is_key = torch.zeros(query + 1, dtype=torch.bool)
    is_key[where:where + task.k + 1] = True  # the marker and the digits
    rows = []
    for i, (g, x) in enumerate(zip(layers, inputs)):
        parts = last_token_parts(g, x[:, :query + 1].cpu())  # the read-out at the query marker
        key, other = parts["parts"][:, is_key].sum(1), parts["parts"][:, ~is_key].sum(1)  # (n, H, Dv) each
        held = (parts["log_decay"][:, ~is_key] == 0).double().mean((0, 1))  # (H,)
        for h in range(key.shape[1]):
            k_, o_ = float(key[:, h].norm(dim=-1).median()), float(other[:, h].norm(dim=-1).median())
            rows.append({"length": length, "depth": depth, "exact": exact, "layer": i, "head": h, "key": k_,
                         "other": o_, "share": k_ / max(k_ + o_, 1e-300), "held": float(held[h])})
    return rows


PASSKEY_PROBE_COLUMNS = ["run", "length", "exact", "layer, head", "key", "other", "key share", "held on filler"]


GLA_PROBE_COLUMNS = ["run", "acc", "pair", "θ on 1 / 0 (π)", "held on 1 / 0", "γ on 1 / 0", "kept",
                     "anchor / writes / others (train)", "anchor / writes / others (long)"]


def gla_probe_run(run_dir, length: int, n: int = 256) -> list:
    """One row of ``GLA_PROBE_COLUMNS`` for a parity run directory whose model has a G layer: its accuracy at
    ``length`` on its test sequences and `gla_parity_probe`'s carrier."""
    from .train import accuracy, load_task_run

    model, task = load_task_run(run_dir)
    if task.name != "parity":
        raise ValueError(f"run: expected a parity run directory, got a {task.name} run at {run_dir}")
    acc = accuracy(model, task.test_batch(str(length), n, rng_of(TEST_SEED)), "last", torch.device("cpu"))[0]
    p = gla_parity_probe(model, task, length, min(n, 64))
    if "pair" not in p:
        return [str(run_dir), f"{acc:.3f}", "no counting pair"] + ["–"] * (len(GLA_PROBE_COLUMNS) - 3)
    parts = lambda s: f"{p['anchor_' + s]:.2f} / {p['writes_' + s]:.2f} / {p['others_' + s]:.2f}"  # noqa: E731
    return [str(run_dir), f"{acc:.3f}", f"{p['pair'][0]}, {p['pair'][1]}",
            f"{p['theta_one']:.3f} / {p['theta_zero']:.3f}", f"{p['held_one']:.2f} / {p['held_zero']:.2f}",
            f"{p['gamma_one']:.4f} / {p['gamma_zero']:.4f}", f"{p['kept']:.3f}", parts("train"), parts("long")]


def gla_passkey_rows(run_dir, lengths, depth: float = 0.5, n: int = 8) -> list[list]:
    """Rows of ``PASSKEY_PROBE_COLUMNS`` for a passkey run directory whose model has a G layer, one per length,
    layer and head (`gla_passkey_probe`)."""
    from .train import load_task_run

    model, task = load_task_run(run_dir)
    if task.name != "passkey":
        raise ValueError(f"run: expected a passkey run directory, got a {task.name} run at {run_dir}")
    return [[str(run_dir), str(r["length"]), f"{r['exact']:.2f}", f"{r['layer']}, {r['head']}", f"{r['key']:.2f}",
             f"{r['other']:.2f}", f"{r['share']:.3f}", f"{r['held']:.3f}"]
            for length in lengths for r in gla_passkey_probe(model, task, length, depth, n)]
