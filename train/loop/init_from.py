"""``--init-from RUN_DIR``: start a new run from another run's weights (not its optimizer, data position or step).

The new run's model is the source run's ``HybridConfig`` with ``TrainConfig.model`` overrides on top; its
tokenizer is the source run's unless one is given. Any run directory works, including one written by
``hybrid-import`` (a Llama / Mistral / Qwen2 checkpoint).

By default every weight must fit (overrides that keep the shapes, e.g. ``window``). With ``init_partial`` the
overrides may change the model: each weight whose name and shape match is copied and the others keep their
fresh initialisation, e.g. a hybrid (``pattern="RRA"``) started from a transformer: embeddings, norms, MLPs and
the attention layers at the A positions come from the source, the R mixers are new.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.models import HybridConfig

from .checkpoint import load_checkpoint
from .saved_model import checkpoint_config


@dataclass
class InitWeights:
    config: HybridConfig
    model_state: dict[str, torch.Tensor]
    tokenizer: str | None  # for TrainConfig.tokenizer: None (bytes) or the path of a tokenizer.json


def copy_matching(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str], list[str]]:
    """Copy into ``model`` each tensor of ``state`` whose name and shape match one of its own; returns the names
    copied, the model's names left as initialised, and the source's names with no place (sorted)."""
    own = model.state_dict()
    copied = sorted(k for k, v in state.items() if k in own and own[k].shape == v.shape)
    with torch.no_grad():
        for k in copied:
            own[k].copy_(state[k])
    return copied, sorted(set(own) - set(copied)), sorted(set(state) - set(copied))


def modules_of(names: list[str], limit: int = 6) -> str:
    """``blocks.0.mixer.q_proj.weight``, ... -> ``"blocks.0.mixer.q_proj, …"``: the modules, in order, at most
    ``limit`` of them named; "none" for none."""
    modules = list(dict.fromkeys(n.rsplit(".", 1)[0] for n in names))
    more = f", … {len(modules) - limit} more" if len(modules) > limit else ""
    return (", ".join(modules[:limit]) + more) if modules else "none"


def load_init(run_dir) -> InitWeights:
    """The model config, weights and tokenizer spec of the checkpoint in ``run_dir``."""
    ckpt = load_checkpoint(run_dir)
    config = checkpoint_config(ckpt)
    record = (ckpt.extra or {}).get("tokenizer", {}) if isinstance(ckpt.extra, dict) else {}
    tokenizer = record.get("path") if record.get("kind") == "tokenizers" else None
    return InitWeights(config=config, model_state=ckpt.model_state, tokenizer=tokenizer)


def init_weights(model: torch.nn.Module, init: InitWeights, *, source: str, partial: bool = False) -> list[str]:
    """Load ``init``'s weights (from the run ``source``) into ``model``: every one of them, or with ``partial``
    those whose name and shape match (the rest keep their initialisation). Returns the notes to show; a
    ValueError when nothing fits (``partial``) or not everything does (not ``partial``)."""
    if not partial:
        try:
            model.load_state_dict(init.model_state)
        except RuntimeError as e:
            raise ValueError(f"init_from: the weights of {source} do not fit the model config "
                             f"({' '.join(str(e).split())[:300]}); --init-partial copies the weights that fit"
                             ) from None
        return []
    copied, fresh, unused = copy_matching(model, init.model_state)
    if not copied:
        raise ValueError(f"init_partial: no weight of {source} fits the model config (names or shapes differ)")
    return [f"--init-from {source}: copied {len(copied)} weights, initialised {len(fresh)} ({modules_of(fresh)}), "
            f"ignored {len(unused)} ({modules_of(unused)})"]
