"""A Llama / Mistral / Qwen2 transformers directory → a transformer-preset run directory.

    import_checkpoint("Qwen2-0.5B/", "runs/qwen")       # then hybrid.train.load_run("runs/qwen")

Reads ``config.json`` and the safetensors weights (one file or an index of shards) without building the
transformers model; the conversion is ``hybrid.models.hf.convert``. A ``tokenizer.json`` beside the weights is
copied into the run directory and recorded (its eos token from ``tokenizer_config.json`` when that names one);
without one the run records the byte tokenizer and the import says so.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from hybrid.models import HybridLM

from ..checkpoint import capture_rng_state, save_checkpoint
from ..tokenizer import ByteTokenizer, FileTokenizer


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for shard in shards:
            state.update(load_file(str(hf_dir / shard)))
        return state
    raise FileNotFoundError(f"hf_dir: expected model.safetensors or model.safetensors.index.json in {hf_dir}, got neither")


def _tokenizer(hf_dir: Path, out: Path):
    src = hf_dir / "tokenizer.json"
    if not src.is_file():
        return ByteTokenizer(), f"no tokenizer.json in {hf_dir}: the run records the byte tokenizer"
    dst = out / "tokenizer.json"
    shutil.copyfile(src, dst)
    eos = None
    config = hf_dir / "tokenizer_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
    try:
        return FileTokenizer(dst, eos_token=eos), None
    except ValueError:
        return FileTokenizer(dst), None


def import_checkpoint(hf_dir, out_dir, *, layout: str = "half", dtype: str = "float32") -> tuple[Path, list[str]]:
    """Write ``out_dir/checkpoint/`` (step 0) from the checkpoint in ``hf_dir``; returns (checkpoint path, notes)."""
    from transformers import AutoConfig

    from hybrid.models.hf.convert import config_from_llama, state_dict_from_llama

    hf_dir, out = Path(hf_dir), Path(out_dir)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"hf_dir: expected a transformers directory with config.json, got {hf_dir}")
    hf_config = AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)
    config = config_from_llama(hf_config, layout=layout, dtype=dtype)
    state = state_dict_from_llama(read_hf_weights(hf_dir), config)
    HybridLM(config).load_state_dict(state)  # strict: every tensor present, every shape right
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, note = _tokenizer(hf_dir, out)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"tokenizer: expected at most vocab_size={config.vocab_size} tokens, got {tokenizer.vocab_size}")
    extra = {"tokenizer": tokenizer.to_dict(), "imported_from": {"path": str(hf_dir.resolve()),
                                                                 "model_type": hf_config.model_type}}
    path = save_checkpoint(out, model_state=state, config=config.to_dict(), optimizer_state=None,
                           scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0, extra=extra)
    return path, [note] if note else []
