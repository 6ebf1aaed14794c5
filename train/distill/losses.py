"""The two stages' losses.

- Stage 1 (``alignment_losses``): for each replaced layer ``l``, the mean squared error between the R mixer's
  output and the teacher's attention output, both on the teacher's input to that mixer (the normed residual
  stream of the frozen teacher): ``mean((R_l(x_l) − A_l(x_l))²)``. The layers' losses are summed; each R layer's
  parameters reach only its own term, so they train in parallel, independently, under one optimizer.
- Stage 2 (``distill_loss``): ``τ² · KL(softmax(z_t/τ) ‖ softmax(z_s/τ))``, averaged over tokens (Hinton et al.'s
  τ² keeps the gradient's scale independent of τ), plus ``ce_weight ·`` the cross-entropy of the student on the
  data. Computed in float32 over the whole vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["distill_loss", "token_kl", "capture_mixer_io", "alignment_losses"]


def token_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``KL(softmax(t/τ) ‖ softmax(s/τ))`` per token: logits ``(..., V)`` -> ``(...)`` float32 (float64 stays)."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_s = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1)


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor | None = None, *,
                 temperature: float = 1.0, ce_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """(loss, {"kl", "ce"}) for logits ``(B, T, V)`` and targets ``(B, T)`` (see the module). ``kl`` is at
    temperature τ without the τ² factor; ``ce`` is None when ``ce_weight`` is 0."""
    V = student_logits.shape[-1]
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    s = student_logits.reshape(-1, V).to(dtype)
    t = teacher_logits.reshape(-1, V).to(dtype)
    kl = F.kl_div(F.log_softmax(s / temperature, dim=-1), F.log_softmax(t / temperature, dim=-1),
                  reduction="batchmean", log_target=True)  # Σ p_t (log p_t − log p_s) / tokens
    loss = temperature ** 2 * kl
    ce = None
    if ce_weight:
        ce = F.cross_entropy(s, targets.reshape(-1))
        loss = loss + ce_weight * ce
    return loss, {"kl": kl.detach(), "ce": None if ce is None else ce.detach()}


def capture_mixer_io(model: nn.Module, layers: list[int], ids: torch.Tensor, cu_seqlens: torch.Tensor | None):
    """Run ``model`` (no gradients) on ``ids`` and return ``{l: (x_l, y_l)}``: the input and the output of the mixer
    of each block in ``layers`` (``x_l`` is the normed residual stream the mixer reads)."""
    captured, handles = {}, []
    for i in layers:
        def hook(module, args, kwargs, output, i=i):
            captured[i] = (args[0].detach(), output[0].detach())
        handles.append(model.blocks[i].mixer.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(ids, cu_seqlens=cu_seqlens, output_final_state=False)
    finally:
        for h in handles:
            h.remove()
    return captured


def alignment_losses(mixers: dict[int, nn.Module], captured: dict, cu_seqlens: torch.Tensor | None) -> dict:
    """``{l: mean((mixers[l](x_l) − y_l)²)}`` (float32) for the captured ``(x_l, y_l)`` of each layer."""
    out = {}
    for i, mixer in mixers.items():
        x, y = captured[i]
        pred, _ = mixer(x, None, cu_seqlens=cu_seqlens, output_final_state=False)
        dtype = torch.promote_types(pred.dtype, torch.float32)
        out[i] = F.mse_loss(pred.to(dtype), y.to(dtype))
    return out
