"""What a passkey run's recurrence holds at the query: how much of the key it wrote, how much of that is left, and
how much of its state the filler fills.

Per recurrence layer, along ``n`` passkey sequences of ``length`` with the key at ``depth`` (``Passkey.build``), the
scan ``s_t = γ_t e^{−iθ_t} s_{t−1} + v_t`` of each rotary pair is split by linearity into the part written by the
key (the marker and its k digits) and the part written by everything else before the query:

    s_q = s_q^key + s_q^other,   s_q^key = Σ_{j ∈ key} (Π_{t=j+1}^{q} γ_t e^{−iθ_t}) v_j

- ``key_share``: ``|s_q^key| / (|s_q^key| + |s_q^other|)`` per pair (1: the state at the query is the key; 0: the
  key is gone or drowned); ``best`` is the pair with the largest median share, ``mean`` the mean over pairs;
- ``kept``: ``Π γ_t`` from the last key digit to the query, for the best pair (the share of the key's write that
  survives the decay, whatever else is written);
- ``turned``: ``Σ θ_t`` over the same span, for the best pair, in radians: the angle the key's write has turned by
  at the query (θ·distance for static angles; 0 for a pair without rotary, ``recurrence.rotary_dim``). A readout
  trained at shorter distances has seen only the smaller angles;
- ``write_ratio``: mean ``|v_t|`` on the key's tokens over mean ``|v_t|`` on the filler (does the layer write the
  key more than the filler?);
- ``held``: the share of filler tokens × pairs with ``γ_t = 1`` exactly (the hard gate shut: nothing written,
  nothing forgotten).

A key is recoverable from a layer's state only if some pair keeps a large share of it. The scan is recomputed in
float64 from the model's own scan inputs (``record`` captures them from ``VORecurrence.scan_inputs``).
"""
from __future__ import annotations

import torch

from ..base import rng_of
from ..recurrence_probe import _spy_scan_inputs
from ..train import TEST_SEED

__all__ = ["split_scan", "passkey_probe", "PROBE_COLUMNS", "probe_run"]


def split_scan(v: torch.Tensor, log_decay: torch.Tensor, theta: torch.Tensor, mask: torch.Tensor,
               until: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The state at position ``until`` (inclusive) split into the part written where ``mask`` is true and the rest.

    v ``(B, T, H, 2P)`` (pairs interleaved), log γ and θ ``(B, T, H, P)``, mask ``(B, T)`` bool. Returns the two
    complex128 parts, each ``(B, H, P)``.
    """
    pairs = v.double().unflatten(-1, (-1, 2))  # (B, T, H, P, 2)
    writes = torch.complex(pairs[..., 0], pairs[..., 1])  # (B, T, H, P)
    a = torch.exp(torch.complex(log_decay.double(), -theta.double()))  # γ_t e^{−iθ_t}, (B, T, H, P)
    m = mask[:, :, None, None].to(writes.dtype)
    masked, rest = torch.zeros_like(writes[:, 0]), torch.zeros_like(writes[:, 0])
    for t in range(until + 1):
        masked = a[:, t] * masked + m[:, t] * writes[:, t]
        rest = a[:, t] * rest + (1 - m[:, t]) * writes[:, t]
    return masked, rest


@torch.no_grad()
def passkey_probe(model: torch.nn.Module, task, length: int, n: int = 32, depth: float = 0.5) -> list[dict]:
    """One dict per recurrence layer (module docstring): ``key_share_best``, ``key_share_mean``, ``best_pair``
    ``(head, pair)``, ``kept``, ``turned``, ``write_ratio``, ``held``, and the key's ``distance`` to the query in
    tokens."""
    rng = rng_of(TEST_SEED)
    keys = rng.integers(0, 10, size=(n, task.k))
    position = task.key_position(length, depth)
    batch = task.build(task.haystacks(length, n, rng, "valid"), keys, position)
    ids = batch.ids.to(next(model.parameters()).device)
    seen: list = []
    with _spy_scan_inputs(model, seen, with_writes=True) as mixers:
        if not mixers:
            raise ValueError("model: expected a model with a VO-RoPE recurrence layer, got none")
        model.eval()
        model(ids)
    query = task.query_position(length)
    key = torch.zeros(n, length, dtype=torch.bool)
    key[:, position:position + task.k + 1] = True  # the marker and its digits
    filler = torch.ones(n, length, dtype=torch.bool)
    filler[:, position:position + task.k + 1] = False
    filler[:, query:] = False
    out = []
    for v, log_decay, theta in seen:
        shape = (n, length, *log_decay.shape[-2:])
        log_decay, theta = log_decay.double().expand(shape).cpu(), theta.double().expand(shape).cpu()
        v = v.double().cpu()
        part_key, part_rest = split_scan(v, log_decay, theta, key, query)
        share = part_key.abs() / (part_key.abs() + part_rest.abs()).clamp_min(1e-300)  # (n, H, P)
        median = share.median(dim=0).values  # (H, P)
        h, p = divmod(int(median.argmax()), median.shape[1])
        last_digit = position + task.k
        kept = log_decay[:, last_digit + 1:query + 1, h, p].sum(1).exp().median().item()
        turned = theta[:, last_digit + 1:query + 1, h, p].sum(1).median().item()  # Σ θ_t: the key's rotation
        magnitude = v.unflatten(-1, (-1, 2)).norm(dim=-1)  # |v_t| per pair, (n, T, H, P)
        write_ratio = (magnitude[key].mean() / magnitude[filler].mean().clamp_min(1e-300)).item()
        held = (log_decay[filler] == 0).double().mean().item()
        out.append({"key_share_best": median[h, p].item(), "key_share_mean": median.mean().item(),
                    "best_pair": (h, p), "kept": kept, "turned": turned, "write_ratio": write_ratio, "held": held,
                    "distance": task.key_distance(length, depth)})
    return out


PROBE_COLUMNS = ["run", "length", "layer", "distance", "key share (best pair)", "key share (mean)", "kept",
                 "turned (rad)", "write ratio", "held"]


def probe_run(run_dir, lengths, n: int = 32, depth: float = 0.5) -> list[list[str]]:
    """Rows of ``PROBE_COLUMNS`` for a passkey run directory: one per test length and recurrence layer."""
    from ..train import load_task_run

    model, task = load_task_run(run_dir)
    if task.name not in ("passkey", "passkey-text"):
        raise ValueError(f"run: expected a passkey run directory, got a {task.name} run at {run_dir}")
    rows = []
    for length in lengths:
        for i, r in enumerate(passkey_probe(model.cpu(), task, length, n, depth)):
            rows.append([str(run_dir), str(length), str(i), str(r["distance"]), f"{r['key_share_best']:.3f}",
                         f"{r['key_share_mean']:.3f}", f"{r['kept']:.3g}", f"{r['turned']:.3g}", f"{r['write_ratio']:.2f}",
                         f"{r['held']:.3f}"])
    return rows
