"""A Llama / Mistral / Qwen2 transformers directory → a transformer-preset run directory.

    import_checkpoint("Qwen2-0.5B/", "runs/qwen")       # then hybrid.train.load_run("runs/qwen")

Reads ``config.json`` and the safetensors weights (one file or an index of shards) without building the
transformers model; the conversion is ``hybrid.models.hf.convert``. A ``tokenizer.json`` beside the weights is
copied into the run directory and recorded (its eos token from ``tokenizer_config.json`` when that names one);
without one the run records the byte tokenizer and the import says so. The run directory is written whole or
not at all, and an existing one is replaced only with ``overwrite`` (``hybrid.train.output.outdir``).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from hybrid.models import HybridLM

from ..loop.checkpoint import capture_rng_state, save_checkpoint
from ..output.outdir import check_output_dir, staged_output_dir
from ..data.tokenizer import ByteTokenizer, FileTokenizer


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:  # truncated, not safetensors at all, unreadable
        raise ValueError(f"hf_dir: expected a complete safetensors file, got {path} ({' '.join(str(e).split())})") from None


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return _load_safetensors(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"hf_dir: expected a safetensors index with a weight_map, got {index} "
                             f"({type(e).__name__}: {e})") from None
        state = {}
        for shard in shards:
            state.update(_load_safetensors(hf_dir / shard))
        return state
    raise FileNotFoundError(f"hf_dir: expected model.safetensors or model.safetensors.index.json in {hf_dir}, got neither")


def _token_text(value) -> str | None:
    """A tokenizer_config.json token entry (a string, or a dict with its "content") as its string."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _document_start(src: Path, settings: dict) -> list[str]:
    """The tokens the source tokenizer puts in front of a text (transformers' default, add_special_tokens):
    what its tokenizer.json's post-processor adds before the text, unless tokenizer_config.json's
    ``add_bos_token`` says otherwise (False: none; True: its ``bos_token``, when the post-processor adds none)."""
    from tokenizers import Tokenizer as RawTokenizer

    raw = RawTokenizer.from_file(str(src))
    text = raw.encode("a", add_special_tokens=False).ids
    framed = raw.encode("a", add_special_tokens=True).ids
    starts = [i for i in range(len(framed) - len(text) + 1) if framed[i : i + len(text)] == text]
    tokens = [raw.id_to_token(i) for i in framed[: starts[0]]] if starts and text else []
    add_bos, bos = settings.get("add_bos_token"), _token_text(settings.get("bos_token"))
    if add_bos is False:
        return []
    if add_bos is True and not tokens and bos is not None and raw.token_to_id(bos) is not None:
        return [bos]
    return tokens


def _read_tokenizer(hf_dir: Path):
    """(the tokenizer of ``hf_dir``: its tokenizer.json, or None when it has none), with the eos token and
    the document start its tokenizer_config.json and tokenizer.json give."""
    src = hf_dir / "tokenizer.json"
    if not src.is_file():
        return None
    settings = {}
    config = hf_dir / "tokenizer_config.json"
    if config.is_file():
        try:
            settings = json.loads(config.read_text())
        except ValueError:
            settings = {}  # an unreadable tokenizer_config.json: find the eos token in tokenizer.json instead
        settings = settings if isinstance(settings, dict) else {}
    start = _document_start(src, settings)
    try:
        return FileTokenizer(src, eos_token=_token_text(settings.get("eos_token")), document_start=start)
    except ValueError:
        return FileTokenizer(src, document_start=start)


def _hf_config(hf_dir: Path, layout: str, dtype: str):
    """(transformers config, our HybridConfig), any problem with config.json a ValueError naming it."""
    from transformers import AutoConfig

    from hybrid.models.hf.convert import config_from_llama

    path = hf_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"hf_dir: expected a transformers directory with config.json, got {hf_dir}")
    try:
        hf_config = AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)
    except Exception as e:  # malformed JSON, a field of the wrong type, an unknown model_type: all in the file
        raise ValueError(f"hf_dir: expected a config.json that transformers reads, got {path} "
                         f"({type(e).__name__}: {' '.join(str(e).split())})") from None
    try:
        return hf_config, config_from_llama(hf_config, layout=layout, dtype=dtype)
    except (TypeError, KeyError, AttributeError) as e:  # a value of the wrong type that AutoConfig let through
        raise ValueError(f"hf_dir: expected a config.json describing a model we can import, got {path} "
                         f"({type(e).__name__}: {e})") from None


def import_checkpoint(hf_dir, out_dir, *, layout: str = "half", dtype: str = "float32",
                      overwrite: bool = False) -> tuple[Path, list[str]]:
    """Write ``out_dir/checkpoint/`` (step 0) from the checkpoint in ``hf_dir``; returns (checkpoint path, notes).

    An ``out_dir`` that exists and is not empty is refused unless ``overwrite``; it is then replaced whole
    (``hybrid.train.output.outdir``): no file of the old directory stays, and a failed import changes nothing.
    """
    from hybrid.models.hf.convert import state_dict_from_llama

    hf_dir, out = Path(hf_dir), Path(out_dir)
    check_output_dir(out, overwrite=overwrite, inputs=[("hf_dir", hf_dir)])  # before the slow part
    hf_config, config = _hf_config(hf_dir, layout, dtype)
    try:
        state = state_dict_from_llama(read_hf_weights(hf_dir), config)
        with torch.device("meta"):  # the shapes only: no second copy of the weights, no random init to draw
            shapes = HybridLM(config)
        shapes.load_state_dict(state, assign=True)  # strict: every tensor present, every shape right
    except (KeyError, RuntimeError) as e:
        raise ValueError(f"hf_dir: expected weights that fit its config.json, got those of {hf_dir} "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
    tokenizer = _read_tokenizer(hf_dir)
    notes = []
    if tokenizer is None:
        tokenizer = ByteTokenizer()
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(
                f"tokenizer: expected a tokenizer.json in {hf_dir} (the model's vocab_size={config.vocab_size}), got "
                f"none, so the byte tokenizer was assumed, and its {tokenizer.vocab_size} tokens do not fit; put the "
                f"model's tokenizer.json into {hf_dir} (transformers' AutoTokenizer.from_pretrained(...)"
                f".save_pretrained writes one) and import again")
        notes.append(f"no tokenizer.json in {hf_dir}: the run records the byte tokenizer")
    elif tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"tokenizer: expected at most vocab_size={config.vocab_size} tokens (the model's), got "
                         f"{tokenizer.vocab_size} in {tokenizer.path}")
    else:
        start = tokenizer.document_start_tokens
        notes.append(f"prompts start with {' '.join(start)} (as {hf_dir.name}'s tokenizer puts in front of a text)"
                     if start else f"prompts start with no token (as {hf_dir.name}'s tokenizer puts none in front)")
    record = tokenizer.to_dict()
    if isinstance(tokenizer, FileTokenizer):  # the run's own copy, at the path it will have once in place
        record["path"] = str(out.resolve() / "tokenizer.json")
    extra = {"tokenizer": record, "imported_from": {"path": str(hf_dir.resolve()), "model_type": hf_config.model_type}}
    with staged_output_dir(out, overwrite=overwrite, inputs=[("hf_dir", hf_dir)], command="hybrid-import") as stage:
        if isinstance(tokenizer, FileTokenizer):
            shutil.copyfile(tokenizer.path, stage / "tokenizer.json")
        save_checkpoint(stage, model_state=state, config=config.to_dict(), optimizer_state=None,
                        scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0, extra=extra)
    return out / "checkpoint", notes
