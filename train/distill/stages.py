"""Distillation's two stages on the one loop (``hybrid.train.loop.stage``), and the validation they share.

- ``AlignStage``: every new R layer fed the teacher's input to the attention it replaces, trained on the MSE to that
  attention's output (``alignment_losses``); only the R mixers train. What the loop wraps (DDP, FSDP2) is
  ``Alignment``, the module whose forward computes those losses, so the ranks' gradients meet as in any training;
  validation calls it too (FSDP2 gathers the mixers' shards in the forward of the module it sharded).
- ``StudentStage``: the student trained on ``distill_loss`` (KL to the teacher's logits, plus cross-entropy), all of
  it (``train="all"``) or only the replaced layers' mixers (``"new"``).

Validation reads global batches of ``batch_size × grad_accum × ranks`` sequences, packed as training packs them,
each rank its rows (``Validation``); every figure is summed over the ranks, so each rank gets the same. A rank whose
share of a short last batch is empty runs a one-token forward that counts for nothing, so that every rank runs as
many forward passes as the others (FSDP2's gathers are collectives).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.kernels.host_copies import to_device

from ..data.packing import pack_documents, packed_on_device
from ..loop.stage import Stage
from .losses import alignment_losses, capture_mixer_io, distill_loss, token_kl

__all__ = ["Alignment", "AlignStage", "StudentStage", "Validation"]


class Validation:
    """The validation batches of a distillation, this rank's share, on the device: ``(x, y, cu_seqlens)``, or None
    for a rank whose share of a short last batch is empty (it still takes part in the sums)."""

    def __init__(self, data, *, seq_len: int, global_batch: int, packing: str, eos_id: int, env, device):
        self.data, self.seq_len, self.global_batch = data, seq_len, global_batch
        self.packing, self.eos_id, self.env, self.device = packing, eos_id, env, device

    def batches(self, max_batches: int | None):
        rows = self.global_batch // self.env.world_size
        lo, hi = self.env.rank * rows, (self.env.rank + 1) * rows
        for x, y in self.data.valid_batches(self.seq_len, self.global_batch, max_batches=max_batches):
            if self.env.distributed:
                x, y = x[lo:hi], y[lo:hi]
                if not len(x):
                    yield None
                    continue
            cu = None
            if self.packing == "documents":
                x, y, cu = pack_documents(x, y, self.eos_id)
            yield batch_to_device(x, y, cu, self.device, compiled=False)  # validation runs the eager model

    def idle(self):
        """The one-token batch a rank with an empty share runs in step with the others (its figures dropped)."""
        one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        return one, one, None

    def sums(self, max_batches: int | None, score, n: int) -> list[float]:
        """``score(x, y, cu_seqlens)``'s ``n`` figures summed over this rank's validation batches, then over the
        ranks (float64; as they are on one process)."""
        totals = [0.0] * n
        for batch in self.batches(max_batches):
            if batch is None:
                score(*self.idle())
            else:
                totals = [t + v for t, v in zip(totals, score(*batch))]
        if not self.env.distributed:
            return totals
        return self.env.all_reduce(torch.tensor(totals, dtype=torch.float64, device=self.device)).tolist()


def summed_loss(logits, y) -> float:
    """The cross-entropy of ``logits`` ``(B, T, V)`` at the targets ``y``, summed over the tokens, in float64."""
    return F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="sum").item()


def batch_to_device(x, y, cu, device, *, compiled: bool):
    """A batch on ``device``; packed offsets as the LM trainer hands them over (``packed_on_device``: eager, with
    their host values, so that the model reads nothing back from the device)."""
    x, y = to_device(x, device), to_device(y, device)
    return x, y, None if cu is None else packed_on_device(cu, device, compiled)


class Alignment(nn.Module):
    """Stage 1's losses as a module: ``forward(captured, cu_seqlens)`` -> ``{layer: MSE}`` of the R mixers it holds."""

    def __init__(self, mixers: dict[int, nn.Module]):
        super().__init__()
        self.layers = list(mixers)
        self.mixers = nn.ModuleDict({str(i): m for i, m in mixers.items()})

    def forward(self, captured: dict, cu_seqlens) -> dict:
        return alignment_losses({i: self.mixers[str(i)] for i in self.layers}, captured, cu_seqlens)


class _DistillStage(Stage):
    """What both stages share: the teacher, the batches, the validation. ``compiled``: the stage's module is compiled
    whole (``torch.compile``), so its packed offsets go as the tensor alone (``packed_on_device``)."""

    def __init__(self, *, teacher, batches, validation: Validation, steps: int, eval_batches, autocast, device,
                 seq_len: int, compiled: bool = False):
        self.teacher, self.data_batches, self.validation, self.steps = teacher, batches, validation, steps
        self.eval_batches, self.autocast, self.device, self.compiled = eval_batches, autocast, device, compiled
        self.tokens_per_step = batches.global_batch * seq_len

    def micro_batches(self, step: int) -> list:
        return [batch_to_device(*b, self.device, compiled=self.compiled) for b in self.data_batches.next_step()]

    def train_on(self, model: nn.Module, train_model: nn.Module, optimizer, scheduler) -> None:
        """``model``'s parameters that require a gradient train, called through ``train_model``."""
        self.model, self.train_model, self.optimizer, self.scheduler = model, train_model, optimizer, scheduler
        self.trainable = [p for p in model.parameters() if p.requires_grad]


class AlignStage(_DistillStage):
    name, tag = "align", {"stage": "align"}

    def __init__(self, *, model: nn.Module, layers: list[int], **kwargs):
        super().__init__(**kwargs)
        self.model, self.layers = model, layers
        self.mixers = {i: model.blocks[i].mixer for i in layers}
        self.alignment = Alignment(self.mixers)  # what trains (and is wrapped); validation calls it too

    def loss(self, batch):
        x, _, cu = batch
        with self.autocast():
            captured = capture_mixer_io(self.teacher.model, self.layers, x, cu)
            losses = self.train_model(captured, cu)
        return sum(losses.values()), {f"mse_layer{i}": v.detach() for i, v in losses.items()}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Per layer: the validation MSE of its R mixer (the mean over the validation batches of each batch's MSE)
        and that MSE over the teacher output's mean square."""
        if self.validation.env.distributed:
            return self._evaluate_ranks()
        sums = {i: [0.0, 0.0] for i in self.layers}
        n = 0
        for x, _, cu in self.validation.batches(self.eval_batches):
            captured, losses = self._losses(x, cu)
            for i, v in losses.items():
                sums[i][0] += v.item()
                sums[i][1] += captured[i][1].float().pow(2).mean().item()
            n += 1
        return self._figures(sums, n)

    def _evaluate_ranks(self) -> dict:
        """``evaluate`` under torchrun: per global batch and layer, the ranks' squared-error and squared-output sums
        and element counts, summed over the ranks in one all-reduce, then as on one process."""
        rows = []  # per global batch: [sse_l, power_l, elements_l for each layer]
        for batch in self.validation.batches(self.eval_batches):
            row = [0.0] * (3 * len(self.layers))
            if batch is None:
                self._losses(*self.validation.idle()[::2])
            else:
                captured, losses = self._losses(batch[0], batch[2])
                for j, i in enumerate(self.layers):
                    y = captured[i][1]
                    row[3 * j:3 * j + 3] = [losses[i].item() * y.numel(), y.float().pow(2).sum().item(), y.numel()]
            rows.append(row)
        shape = (len(rows), len(self.layers), 3)
        table = self.validation.env.all_reduce(torch.tensor(rows, dtype=torch.float64, device=self.device).reshape(shape))
        sums = {i: [0.0, 0.0] for i in self.layers}
        for per_layer in table.tolist():
            for i, (sse, power, count) in zip(self.layers, per_layer):
                sums[i][0] += sse / max(count, 1)
                sums[i][1] += power / max(count, 1)
        return self._figures(sums, len(rows))

    def _losses(self, x, cu):
        with self.autocast():
            captured = capture_mixer_io(self.teacher.model, self.layers, x, cu)
            return captured, self.alignment(captured, cu)

    @staticmethod
    def _figures(sums: dict, n: int) -> dict:
        out = {}
        for i, (mse, power) in sums.items():
            out[f"val_mse_layer{i}"] = mse / max(n, 1)
            out[f"val_rel_mse_layer{i}"] = mse / max(power, 1e-30)
        return out

    def eval_line(self, step: int, figures: dict) -> str:
        shown = "  ".join(f"{k} {v:.4g}" for k, v in figures.items() if k.startswith("val_rel"))
        return f"step {step:>6}  align    {shown}"


class StudentStage(_DistillStage):
    name, tag = "distill", {"stage": "distill"}

    def __init__(self, *, temperature: float, ce_weight: float, **kwargs):
        super().__init__(**kwargs)
        self.temperature, self.ce_weight = temperature, ce_weight

    def loss(self, batch):
        x, y, cu = batch
        with self.autocast():
            with torch.no_grad():
                teacher_logits, _ = self.teacher.model(x, cu_seqlens=cu, output_final_state=False)
            logits, _ = self.train_model(x, cu_seqlens=cu, output_final_state=False)
        loss, parts = distill_loss(logits, teacher_logits, y, temperature=self.temperature, ce_weight=self.ce_weight)
        return loss, {k: v for k, v in parts.items() if v is not None}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """The student's validation loss, bits per byte and KL to the teacher (per token, τ = 1)."""
        def score(x, y, cu):
            with self.autocast():
                teacher_logits, _ = self.teacher.model(x, cu_seqlens=cu, output_final_state=False)
                logits, _ = self.model(x, cu_seqlens=cu, output_final_state=False)
            return [summed_loss(logits, y), token_kl(logits, teacher_logits).double().sum().item(), y.numel()]

        was = self.model.training
        self.model.eval()
        try:
            ce, kl, count = self.validation.sums(self.eval_batches, score, 3)
        finally:
            self.model.train(was)
        mean = ce / max(count, 1)
        return {"val_loss": mean, "val_bpb": self.validation.data.bpb(mean), "val_kl": kl / max(count, 1),
                "val_tokens": int(count)}

    @torch.no_grad()
    def teacher_figures(self) -> dict:
        """The teacher's validation loss and bits per byte, on the same batches."""
        def score(x, y, cu):
            with self.autocast():
                logits, _ = self.teacher.model(x, cu_seqlens=cu, output_final_state=False)
            return [summed_loss(logits, y), y.numel()]

        total, count = self.validation.sums(self.eval_batches, score, 2)
        mean = total / max(count, 1)
        return {"teacher_val_loss": mean, "teacher_val_bpb": self.validation.data.bpb(mean)}

    def eval_line(self, step: int, figures: dict) -> str:
        shown = "  ".join(f"{k} {v:.4g}" for k, v in figures.items() if k.startswith(("val_bpb", "val_kl")))
        return f"step {step:>6}  distill  {shown}"
