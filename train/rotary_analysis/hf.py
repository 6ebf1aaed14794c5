"""Adapter for Hugging Face causal LMs with rotary attention (needs the optional `transformers` extra).

Supported families (rotate_half, i.e. the "half" layout, on the first `rotary_dim` channels of each head):
Llama, Mistral, Mixtral, Qwen2, Qwen3, Gemma, Phi (partial rotary, biased projections, optional qk LayerNorm)
and GPT-NeoX (fused query_key_value, partial rotary). The pre-rotation q and k are the outputs of `q_proj` /
`k_proj` (or of the q/k norms where the family normalises them before rotating; GPT-NeoX: the q and k
thirds of `query_key_value`), captured by forward hooks.

Frequencies: `hybrid.rotary.inv_freq(rotary_dim, rope_theta, rope_scaling)` from the config (θ_i after
scaling; `dynamic` and `longrope` at lengths ≤ original_max_position_embeddings). The rotation used for the
"after rotation" statistics is the orthogonal one: HF's YaRN/LongRoPE `attention_scaling` multiplies cos and
sin and is left out. p_max is the config's `max_position_embeddings`; a layer with a sliding window (`sliding_window`
of Mistral and Mixtral, every layer; of Qwen2 and Qwen3 with `use_sliding_window`, the layers `layer_types` marks
"sliding_attention", or else those from `max_window_layers` on) gets its window as `RotaryLayer.window`, so its
bounds use min(p_max, sliding_window), the tokens it attends.

This module imports `transformers` only inside `load_hf_causal_lm`; the functions that read a model only use
its attributes.
"""
from __future__ import annotations

from pathlib import Path

import torch

from hybrid.rotary import inv_freq

from ..data.sources import hub_offline_reason
from .capture import Captured, RotaryLayer

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "phi", "gpt_neox")


class ModelNotFoundError(FileNotFoundError):
    """A model name is neither a local directory nor loadable from the Hugging Face hub (e.g. offline)."""


def _get(config, *names, default=None):
    for name in names:
        v = getattr(config, name, None)
        if v is not None:
            return v
    return default


def hf_rotary_params(config) -> dict:
    """`{base, scaling, rotary_dim, head_dim, n_heads, n_kv_heads, p_max}` from a transformers config.

    Reads `rope_parameters` (transformers ≥ 5) or `rope_theta` / `rope_scaling` / `partial_rotary_factor` /
    `rotary_pct` / `rotary_emb_base` (4.x).
    """
    n_heads = int(config.num_attention_heads)
    n_kv = int(_get(config, "num_key_value_heads", default=n_heads))
    head_dim = int(_get(config, "head_dim", default=config.hidden_size // n_heads))
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = getattr(config, "rope_scaling", None)
    if not params and isinstance(legacy, dict):
        params = dict(legacy)
    base = params.pop("rope_theta", None) or _get(config, "rope_theta", "rotary_emb_base", default=10000.0)
    partial = params.pop("partial_rotary_factor", None) or _get(config, "partial_rotary_factor", "rotary_pct",
                                                                default=1.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    scaling = None
    if rope_type != "default":
        scaling = {k: v for k, v in params.items() if v is not None}
        p_max = getattr(config, "max_position_embeddings", None)
        if rope_type in ("dynamic", "yarn", "longrope", "llama3") and "original_max_position_embeddings" not in scaling:
            scaling["original_max_position_embeddings"] = int(_get(config, "original_max_position_embeddings",
                                                                   default=p_max))
        if rope_type == "longrope" and "factor" not in scaling and "attention_factor" not in scaling:
            scaling["factor"] = max(1.0, p_max / scaling["original_max_position_embeddings"])
    rotary_dim = int(head_dim * float(partial))
    rotary_dim -= rotary_dim % 2
    p_max = getattr(config, "max_position_embeddings", None)
    if not isinstance(p_max, int) or p_max < 1:
        raise ValueError(f"config.max_position_embeddings: expected a positive int (p_max), got {p_max!r}")
    return dict(base=float(base), scaling=scaling, rotary_dim=rotary_dim, head_dim=head_dim, n_heads=n_heads,
                n_kv_heads=n_kv, p_max=p_max)


WINDOWED_MODEL_TYPES = ("mistral", "mixtral", "qwen2", "qwen3")  # the families whose attention reads sliding_window


def hf_sliding_windows(config, n_layers: int) -> list[int | None]:
    """Each decoder layer's sliding window (None: global), as the family's own attention applies it.

    Mistral and Mixtral window every layer when `sliding_window` is set; Qwen2 and Qwen3 only with
    `use_sliding_window`, in the layers `layer_types` marks "sliding_attention" (transformers ≥ 4.53) or else
    from `max_window_layers` on. HF's mask keeps key n for query m when m − n < sliding_window, as ours does.
    """
    window, model_type = getattr(config, "sliding_window", None), getattr(config, "model_type", None)
    if model_type not in WINDOWED_MODEL_TYPES or not isinstance(window, int) or window < 1:
        return [None] * n_layers
    if model_type in ("mistral", "mixtral"):
        return [window] * n_layers
    if not getattr(config, "use_sliding_window", False):
        return [None] * n_layers
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [window if types[i] == "sliding_attention" else None for i in range(n_layers)]
    start = getattr(config, "max_window_layers", 0) or 0
    return [window if i >= start else None for i in range(n_layers)]


def _as_heads(x: torch.Tensor, heads: int, head_dim: int, heads_first: bool = False) -> torch.Tensor:
    """x `(B, T, heads·D)`, `(B, T, heads, D)` or, with heads_first, `(B, heads, T, D)` → `(B, T, heads, D)`."""
    if heads_first:
        return x.transpose(1, 2)  # (B, heads, T, D) → (B, T, heads, D)
    if x.dim() == 3:
        return x.unflatten(-1, (heads, head_dim))  # (B, T, heads·D) → (B, T, heads, D)
    return x


def _projection_layer(layer_idx, attn, config, p, theta, window) -> RotaryLayer:
    H, G, D = p["n_heads"], p["n_kv_heads"], p["head_dim"]
    if getattr(attn, "qk_layernorm", False):  # Phi: LayerNorm on (B, H, T, D) after the transpose
        sources, heads_first = {"q": attn.q_layernorm, "k": attn.k_layernorm}, True
    elif hasattr(attn, "q_norm") and hasattr(attn, "k_norm"):  # Qwen3-style: norm on (B, T, H, D)
        sources, heads_first = {"q": attn.q_norm, "k": attn.k_norm}, False
    else:
        sources, heads_first = {"q": attn.q_proj, "k": attn.k_proj}, False

    def extract(module, args, kwargs, output, seen):
        return Captured(q=_as_heads(seen["q"], H, D, heads_first), k=_as_heads(seen["k"], G, D, heads_first))

    return RotaryLayer(layer=layer_idx, n_heads=H, n_kv_heads=G, head_dim=D, rotary_dim=p["rotary_dim"],
                       layout="half", theta=theta, module=attn, extract=extract, sources=sources, window=window)


def _neox_layer(layer_idx, attn, p, theta) -> RotaryLayer:
    H, D = p["n_heads"], p["head_dim"]

    def extract(module, args, kwargs, output, seen):
        qkv = seen["qkv"].unflatten(-1, (H, 3 * D))  # (B, T, H, 3D): per head [q | k | v]
        q, k, _ = qkv.chunk(3, dim=-1)  # (B, T, H, D) each
        return Captured(q=q, k=k)

    return RotaryLayer(layer=layer_idx, n_heads=H, n_kv_heads=H, head_dim=D, rotary_dim=p["rotary_dim"],
                       layout="half", theta=theta, module=attn, extract=extract,
                       sources={"qkv": attn.query_key_value})


def hf_rotary_layers(model) -> tuple[list[RotaryLayer], int]:
    """The rotary attention layers of a transformers causal LM (with their sliding windows) and its p_max."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model: expected a causal LM of type {SUPPORTED_MODEL_TYPES}, got model_type {model_type!r}")
    p = hf_rotary_params(config)
    theta = inv_freq(p["rotary_dim"], p["base"], p["scaling"])[0].double()
    decoder = _decoder_layers(model)
    windows = hf_sliding_windows(config, len(decoder))
    layers = []
    for i, layer in enumerate(decoder):
        if model_type == "gpt_neox":
            layers.append(_neox_layer(i, layer.attention, p, theta))
        else:
            layers.append(_projection_layer(i, layer.self_attn, config, p, theta, windows[i]))
    return layers, p["p_max"]


def _decoder_layers(model):
    for path in ("model.layers", "gpt_neox.layers", "model.model.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ValueError(f"model: expected decoder layers at model.layers or gpt_neox.layers, got {type(model).__name__}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_hf_causal_lm(name_or_path: str, *, device="cpu", dtype=torch.float32):
    """(model in eval mode, tokenizer or None) from a local directory or a hub name.

    A missing `transformers` is an ImportError naming the extra; a name that is neither a directory nor
    loadable (offline, or no such model) is a one-line `ModelNotFoundError`.
    """
    try:
        import transformers
    except ImportError:
        raise ImportError("transformers is not installed: pip install -e '.[analysis]' in the hybrid checkout to analyse Hugging "
                          "Face models") from None
    local = Path(name_or_path).expanduser()
    source = str(local) if local.is_dir() else name_or_path
    try:  # a local directory, or a hub name already in the local cache
        model = transformers.AutoModelForCausalLM.from_pretrained(source, local_files_only=True)
        kwargs = {"local_files_only": True}
    except (OSError, ValueError) as e:
        if local.is_dir():
            raise ModelNotFoundError(f"model: could not load the local directory {source!r}: "
                                     f"{_first_line(e)}") from None
        reason = hub_offline_reason(what="model")
        if reason:
            raise ModelNotFoundError(f"model: {name_or_path!r} is not a local directory nor in the Hugging Face "
                                     f"cache, and the hub is unreachable ({reason})") from None
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(source)
        except (OSError, ValueError) as e2:
            raise ModelNotFoundError(f"model: could not load {name_or_path!r} from the Hugging Face hub: "
                                     f"{_first_line(e2)}") from None
        kwargs = {}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    if tokenizer is not None and not getattr(tokenizer, "vocab_size", 0):  # no tokenizer files: an empty stand-in
        tokenizer = None
    return model.to(device=device, dtype=dtype).eval(), tokenizer
