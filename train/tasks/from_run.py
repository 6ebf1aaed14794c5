"""``hybrid-synthetic --task passkey-text --init-from RUN_DIR``: fine-tune a trained language model on the LM
passkey test, as Samba does (500 steps of passkey retrieval on the pretrained model, arXiv 2406.07522 §3.4).

The model is the source run's: its ``HybridConfig`` with ``--set`` overrides on top (they must keep every weight's
shape, e.g. ``window``), started from its weights; the budget's width, depth, heads and presets do not apply.
Only ``passkey-text`` takes a source run: its tokens are the byte tokenizer's ids (0–258) plus two markers at 259
and 260, rows that a byte-level LM's rounded vocabulary (320) holds untrained. A source whose tokenizer is not
bytes (e.g. a ``hybrid-import``-ed Llama) or whose vocabulary is smaller than the task's is refused, in one line
naming ``init_from``.
"""
from __future__ import annotations

import torch

from hybrid.models import HybridConfig, HybridLM

from ..loop.checkpoint import CheckpointError, load_checkpoint
from ..loop.saved_model import checkpoint_config

TASKS = ("passkey-text",)  # the tasks whose tokens are a byte-level language model's


def _checkpoint(run_dir):
    try:
        return load_checkpoint(run_dir)
    except FileNotFoundError as e:
        raise ValueError(f"init_from: expected a run directory (with checkpoint/), got {run_dir} ({e})") from None
    except CheckpointError as e:
        raise ValueError(f"init_from: expected a readable run directory, got {run_dir} ({e})") from None


def source_config(run_dir, task, overrides: dict) -> HybridConfig:
    """The fine-tune's model config: ``run_dir``'s, then ``overrides``. A ValueError naming ``init_from`` when
    ``task`` does not take a source run, the source's tokens are not bytes, or its vocabulary cannot hold the
    task's tokens."""
    if task.name not in TASKS:
        raise ValueError(f"init_from: expected a task whose tokens are a byte-level LM's ({', '.join(TASKS)}), "
                         f"got {task.name}")
    ckpt = _checkpoint(run_dir)
    extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
    kind = (extra.get("tokenizer") or {}).get("kind") if isinstance(extra.get("tokenizer"), dict) else None
    if kind != "bytes":
        raise ValueError(f"init_from: expected a run trained on the byte tokenizer (the task's tokens are bytes), "
                         f"got {run_dir} with tokenizer {kind or 'none recorded'}")
    config = checkpoint_config(ckpt)
    if config.vocab_size < task.vocab_size:
        raise ValueError(f"init_from: expected a vocabulary of at least {task.vocab_size} (bytes and the two "
                         f"markers), got {config.vocab_size} in {run_dir}")
    config = config.replace(**overrides)
    with torch.device("meta"):  # the shapes only, nothing allocated
        wanted = {k: tuple(v.shape) for k, v in HybridLM(config).state_dict().items()}
    given = {k: tuple(v.shape) for k, v in ckpt.model_state.items()}
    if wanted != given:
        differ = sorted(k for k in wanted.keys() | given.keys() if wanted.get(k) != given.get(k))
        raise ValueError(f"init_from: the weights of {run_dir} do not fit its model with {overrides or 'no --set'} "
                         f"({len(differ)} differ, e.g. {differ[0]}: {given.get(differ[0])} in the run, "
                         f"{wanted.get(differ[0])} wanted); --set may change only what keeps the weights' shapes")
    return config


def load_source_weights(model: torch.nn.Module, run_dir) -> None:
    """Every weight of ``run_dir``'s checkpoint into ``model`` (strict: names and shapes must all match)."""
    try:
        model.load_state_dict(_checkpoint(run_dir).model_state)
    except RuntimeError as e:
        raise ValueError(f"init_from: the weights of {run_dir} do not fit the model (a --set that changes a "
                         f"weight's shape?): {' '.join(str(e).split())[:300]}") from None
