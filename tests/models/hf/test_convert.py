"""Llama / Mistral / Qwen2 → HybridLM (hybrid.models.hf.convert): logits equal transformers' own.

Tiny random transformers models built from configs (offline): GQA, llama3, yarn, dynamic NTK and LongRoPE rope scaling
(past their original lengths, with the lengths left out as configs leave them out), tied and untied
embeddings, Qwen2's q/k/v biases, Llama's attention_bias, Mistral's sliding window shorter than the input, in
both rotary layouts; in float64 (up to the float32 rotary angles of both) and float32.
"""
import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM)

from hybrid.models import HybridLM  # noqa: E402
from hybrid.models.hf.convert import config_from_llama, state_dict_from_llama  # noqa: E402

V, T = 97, 23
BASE = dict(vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
YARN = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 8.0, "original_max_position_embeddings": 8}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}  # L0: max_position_embeddings, < T
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.1, 1.3, 2.0],
            "long_factor": [1.0, 1.5, 3.0, 6.0], "original_max_position_embeddings": 8}  # factor: 16 / 8, as Phi-3's
CASES = {
    "llama-gqa-llama3-tied": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters=LLAMA3, tie_word_embeddings=True)),
    "llama-gqa-yarn-untied": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters=YARN, tie_word_embeddings=False)),
    "llama-attention-bias": (LlamaConfig, LlamaForCausalLM, dict(attention_bias=True, num_key_value_heads=6)),
    "qwen2-qkv-bias": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
    "mistral-window-5": (MistralConfig, MistralForCausalLM, dict(sliding_window=5)),
    "llama-dynamic": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters=DYNAMIC, max_position_embeddings=16)),
    # transformers' dynamic NTK reads max_position_embeddings, never the dict's original_max_position_embeddings
    "llama-dynamic-original-8": (LlamaConfig, LlamaForCausalLM,
                                 dict(rope_parameters={**DYNAMIC, "original_max_position_embeddings": 8},
                                      max_position_embeddings=16)),
    "llama-longrope-no-factor": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters=LONGROPE,
                                                                     max_position_embeddings=16)),
}


def build(name, dtype=torch.float32):
    cfg_cls, model_cls, extra = CASES[name]
    torch.manual_seed(0)
    hf_config = cfg_cls(**{**BASE, **extra})
    model = model_cls(hf_config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("bias"):
                p.normal_()  # transformers starts biases at 0, which would hide a misplaced one
            if key.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return hf_config, model.to(dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("name", list(CASES))
def test_imported_logits_equal_transformers(name, layout):
    hf_config, hf = build(name, torch.float64)
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
    config = config_from_llama(hf_config, layout=layout, dtype="float64")
    assert config.window == (5 if name.startswith("mistral") else None) and config.rope_layout == layout
    ours = HybridLM(config).eval()
    ours.load_state_dict(state_dict_from_llama(hf.state_dict(), config))
    with torch.no_grad():
        out = ours(ids)[0]
    # float64 everywhere but the rotary angles, which both libraries round to float32 (transformers multiplies
    # positions by inv_freq in float32, we in float64 then round): differences of float32 angle rounding only
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6 * ref.abs().max().item())
    assert (ours.lm_head.weight is ours.embed.weight) == hf_config.tie_word_embeddings


@pytest.mark.parametrize("name", ["llama-gqa-yarn-untied", "qwen2-qkv-bias"])
def test_float32_logits_and_greedy_tokens_equal_transformers(name):
    hf_config, hf = build(name)
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    config = config_from_llama(hf_config)
    ours = HybridLM(config).eval()
    ours.load_state_dict(state_dict_from_llama(hf.state_dict(), config))
    with torch.no_grad():
        ref = hf(ids).logits
        out = ours(ids)[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=4e-6 * ref.abs().max().item())
    theirs = hf.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert ours.generate(ids, 6, temperature=0).tolist() == theirs.tolist()


def test_unsupported_checkpoints_are_refused_by_name():
    with pytest.raises(ValueError, match="hidden_act: expected 'silu'"):
        config_from_llama(LlamaConfig(**BASE, hidden_act="gelu"))
    with pytest.raises(ValueError, match="mlp_bias: expected False"):
        config_from_llama(LlamaConfig(**BASE, mlp_bias=True))
    with pytest.raises(ValueError, match="model_type: expected one of"):
        config_from_llama(type("C", (), {"model_type": "gpt2"})())
    with pytest.raises(ValueError, match=r"layout: expected one of \['interleaved', 'half'\]"):
        config_from_llama(LlamaConfig(**BASE), layout="other")
    hf_config, hf = build("qwen2-qkv-bias")
    state = hf.state_dict()
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="checkpoint: expected a tensor named 'layers.1.mlp.up_proj.weight'"):
        state_dict_from_llama(state, config_from_llama(hf_config))
