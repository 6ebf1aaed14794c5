"""Llama-family checkpoints (Llama, Mistral, Qwen2) as ``HybridLM`` transformer presets, weight for weight.

    config = config_from_llama(hf_config)                      # a HybridConfig: pattern "A", rotary on q, k
    state = state_dict_from_llama(hf_state_dict, config)       # HybridLM.load_state_dict(state)

The two models compute the same function (logits equal to float32 rounding):

| transformers                                   | HybridLM                                             |
| ---------------------------------------------- | ---------------------------------------------------- |
| ``embed_tokens``, ``norm``, ``lm_head``        | ``embed``, ``norm``, ``lm_head`` (tied or not)       |
| ``input_layernorm``, ``post_attention_layernorm`` | ``mixer_norm``, ``mlp_norm`` (RMSNorm, same eps)  |
| ``q_proj``, ``k_proj``, ``v_proj`` (+ biases)  | ``mixer.in_proj`` = rows [q; k; v] (+ biases)        |
| ``o_proj`` (+ bias)                            | ``mixer.out_proj`` (bias 0 when q/k/v alone have one, Qwen2) |
| ``gate_proj``, ``up_proj``, ``down_proj``      | ``mlp.w_gate``, ``mlp.w_up``, ``mlp.w_down`` (``mlp_hidden`` = intermediate_size) |
| ``rope_theta``, ``rope_scaling`` / ``rope_parameters`` | ``rotary.base``, ``rotary.scaling`` (the same HF dict) |
| ``num_key_value_heads``, ``head_dim``          | ``attention.n_kv_heads``, ``head_dim`` (GQA: head h reads kv head h // (H/G)) |
| Mistral ``sliding_window``                     | ``attention.window`` (token i attends to i − w < j ≤ i) |

Rotary layout: transformers pairs channel k with k + D/2 (``rotary.layout="half"``), which ``HybridLM`` runs as
is; ``layout="interleaved"`` permutes the q and k rows of every head instead (``hybrid.rotary.convert_projection``),
the same function in this library's default layout (e.g. to start hybrids from the weights).
"""
from __future__ import annotations

import torch

from hybrid import AttentionConfig, RotaryConfig
from hybrid.models import HybridConfig
from hybrid.rotary import check_layout, convert_projection

from .compat import ROPE_PARAMETERS

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def _rope(hf_config) -> tuple[float, dict | None]:
    """(base, scaling dict or None) from either spelling: transformers 5's ``rope_parameters`` (theta inside),
    or the older ``rope_theta`` + ``rope_scaling``."""
    params = getattr(hf_config, "rope_parameters", None) if ROPE_PARAMETERS else None
    if params is None:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params = dict(params)
    base = float(params.pop("rope_theta", 10000.0))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"rope_parameters: expected no partial rotary, got {params['partial_rotary_factor']}")
    params.pop("partial_rotary_factor", None)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return base, None
    return base, _pretraining_length(hf_config, kind, params)


def _pretraining_length(hf_config, kind: str, params: dict) -> dict:
    """The scaling dict with the lengths transformers reads from the model config filled in as it does
    (``standardize_rope_params`` and the schedules of ``transformers.modeling_rope_utils``): dynamic NTK's L0 is
    ``max_position_embeddings``, whatever the dict says; llama3, yarn and longrope take a top-level
    ``original_max_position_embeddings`` over the dict's, else the dict's, else ``max_position_embeddings``; a yarn or
    longrope ``factor`` left out is ``max_position_embeddings / original_max_position_embeddings``."""
    max_len = getattr(hf_config, "max_position_embeddings", None)
    if kind == "dynamic" and max_len is not None:
        params["original_max_position_embeddings"] = max_len
    if kind in ("llama3", "yarn", "longrope"):
        top_level = getattr(hf_config, "original_max_position_embeddings", None)
        if top_level is not None:
            params["original_max_position_embeddings"] = top_level
        elif max_len is not None:
            params.setdefault("original_max_position_embeddings", max_len)
    if kind in ("yarn", "longrope") and params.get("factor") is None and max_len is not None:
        if params.get("original_max_position_embeddings"):
            params["factor"] = max_len / params["original_max_position_embeddings"]
    return params


def config_from_llama(hf_config, *, layout: str = "half", dtype: str = "float32") -> HybridConfig:
    """The ``HybridConfig`` of a Llama / Mistral / Qwen2 ``PretrainedConfig``; unsupported options raise."""
    kind = getattr(hf_config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type: expected one of {SUPPORTED_MODEL_TYPES}, got {kind!r}")
    check_layout("layout", layout)
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act: expected 'silu' (SwiGLU), got {act!r}")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias: expected False (HybridLM's SwiGLU has no biases), got True")
    window = getattr(hf_config, "sliding_window", None) if kind == "mistral" else None
    layer_types = getattr(hf_config, "layer_types", None) or []
    if kind == "qwen2" and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"layer_types: expected full attention in every layer (one window for all), got {layer_types}")
    base, scaling = _rope(hf_config)
    H = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // H
    attention = AttentionConfig(
        n_kv_heads=getattr(hf_config, "num_key_value_heads", None) or H, window=window, placement="qk",
        bias=bool(getattr(hf_config, "attention_bias", False)) or kind == "qwen2",
    )
    return HybridConfig(
        vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers,
        n_heads=H, head_dim=head_dim, pattern="A", mlp_hidden=hf_config.intermediate_size,
        norm_eps=float(hf_config.rms_norm_eps), tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        dtype=dtype, meta={"preset": "transformer", "imported_from": kind},
        rotary=RotaryConfig(base=base, scaling=scaling, layout=layout), attention=attention,
    )


def state_dict_from_llama(hf_state: dict[str, torch.Tensor], config: HybridConfig) -> dict[str, torch.Tensor]:
    """``HybridLM`` weights (``config`` from ``config_from_llama``) from a ``*ForCausalLM`` state dict."""
    dtype = config.torch_dtype
    hf_state = {k.removeprefix("model."): v for k, v in hf_state.items()}  # "model.layers.0…" → "layers.0…"

    def take(key: str) -> torch.Tensor:
        if key not in hf_state:
            raise ValueError(f"checkpoint: expected a tensor named {key!r} (or 'model.{key}'), got none")
        return hf_state[key].to(dtype)

    H, G, D = config.n_heads, config.attention.n_kv_heads or config.n_heads, config.resolved_head_dim

    def qk(t: torch.Tensor, heads: int) -> torch.Tensor:  # rows of one q or k projection, in config's layout
        if config.rotary.layout == "half":
            return t
        return convert_projection(t, heads, src="half", dst="interleaved", dim=0)

    out = {"embed.weight": take("embed_tokens.weight"), "norm.weight": take("norm.weight")}
    out["lm_head.weight"] = out["embed.weight"] if config.tie_embeddings else take("lm_head.weight")
    for i in range(config.n_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        out[dst + "mixer_norm.weight"] = take(src + "input_layernorm.weight")
        out[dst + "mlp_norm.weight"] = take(src + "post_attention_layernorm.weight")
        a = src + "self_attn."
        out[dst + "mixer.in_proj.weight"] = torch.cat(
            [qk(take(a + "q_proj.weight"), H), qk(take(a + "k_proj.weight"), G), take(a + "v_proj.weight")]
        )  # ((H + 2G)·D, d_model)
        out[dst + "mixer.out_proj.weight"] = take(a + "o_proj.weight")
        if config.attention.bias:
            biases = [a + f"{p}_proj.bias" for p in "qkv"]
            zeros = torch.zeros(D * (H + 2 * G), dtype=dtype)
            q_b, k_b, v_b = (take(b) if b in hf_state else None for b in biases)
            if q_b is None:
                q_b, k_b, v_b = zeros[: H * D], zeros[: G * D], zeros[: G * D]
            out[dst + "mixer.in_proj.bias"] = torch.cat([qk(q_b, H), qk(k_b, G), v_b])  # ((H + 2G)·D,)
            o_b = a + "o_proj.bias"
            out[dst + "mixer.out_proj.bias"] = take(o_b) if o_b in hf_state else torch.zeros(config.d_model, dtype=dtype)
        m = src + "mlp."
        out[dst + "mlp.w_gate.weight"] = take(m + "gate_proj.weight")
        out[dst + "mlp.w_up.weight"] = take(m + "up_proj.weight")
        out[dst + "mlp.w_down.weight"] = take(m + "down_proj.weight")
    return out
