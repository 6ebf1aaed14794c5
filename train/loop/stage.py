"""A stage: what differs between runs, as the hooks the one loop calls (``hybrid.train.loop.loop``).

A run trains one stage (a language model; a synthetic task) or several in a row (distillation: each new R layer
aligned with the attention it replaces, then the student end to end). A stage says

- which parameters train, and with what: ``model`` (its weights are the checkpoint's), ``train_model`` (what the
  forward pass calls: ``model`` wrapped in DDP / FSDP2, or compiled), ``trainable``, ``optimizer``, ``scheduler``;
- what a step computes: ``micro_batches(step)`` (this rank's micro-batches of optimizer step ``step``) and
  ``loss(batch)`` (the loss to backpropagate and its named parts: the LM loss, distillation's MSE or KL, a task's
  labelled loss), each under the precision the stage chose;
- how validation scores: ``evaluate()`` (the same figures on every rank), and the line that shows them;
- how long it is: ``steps`` (it may grow while the run trains), ``done`` (steps of it trained so far).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .parts import ModelPart, OptimizerPart

__all__ = ["Stage"]


class Stage:
    """The loop's hooks for one stage; subclasses set the attributes and implement ``micro_batches``, ``loss`` and
    ``evaluate``."""

    name: str = "train"
    tag: dict = {}  # added to every record of the stage, e.g. {"stage": "align"}
    model: nn.Module
    train_model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    trainable: list[torch.Tensor]
    steps: int
    done: int = 0
    tokens_per_step: int = 0  # training tokens of the step just taken, every rank together (for tokens/s)

    def micro_batches(self, step: int) -> list[Any]:
        """This rank's micro-batches of optimizer step ``step`` (1-based)."""
        raise NotImplementedError

    def loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, parts)`` of one micro-batch: the scalar to backpropagate and named figures to log with it."""
        raise NotImplementedError

    def after_step(self, step: int, loss: torch.Tensor) -> None:
        """Called once optimizer step ``step`` is taken, before it is logged (``loss``: its mean loss on this rank)."""

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation figures, the same on every rank."""
        raise NotImplementedError

    def eval_line(self, step: int, figures: dict) -> str:
        """How an evaluation is shown: ``step    250  val_loss 2.1000  val_bpb 1.4000``."""
        shown = "  ".join(f"{k} {v:.4f}" for k, v in figures.items() if k in ("val_loss", "val_bpb"))
        return f"step {step:>6}  {shown}"

    def parts(self) -> dict:
        """The stage's checkpoint parts (``hybrid.train.loop.parts``): its model, optimizer and schedule."""
        return {"model": ModelPart(self.model), "optimizer": OptimizerPart(self.model, self.optimizer),
                "scheduler": self.scheduler}
