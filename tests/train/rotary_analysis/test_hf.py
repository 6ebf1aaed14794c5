"""The Hugging Face adapter on tiny random models built from configs (offline): hook capture against a direct
recomputation of q and k, the frequencies against HF's own, and a clear error for a model that cannot load."""
import importlib

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e '.[analysis]' in the hybrid checkout): the Hugging Face "
                           "adapter tests need it")

from hybrid.train.rotary_analysis import analyze, capture_statistics  # noqa: E402
from hybrid.train.rotary_analysis.hf import (  # noqa: E402
    ModelNotFoundError, hf_rotary_layers, hf_rotary_params, hf_sliding_windows, load_hf_causal_lm,
)

VOCAB = 53
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=40)


def _build(kind):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(num_key_value_heads=2, **COMMON)
        return transformers.LlamaForCausalLM(cfg)
    if kind == "phi":  # partial rotary (half of head_dim 16), biased projections
        cfg = transformers.PhiConfig(partial_rotary_factor=0.5, **COMMON)
        return transformers.PhiForCausalLM(cfg)
    if kind == "qwen2":  # biased q/k projections, MQA
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=1, **COMMON))
    if kind == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=2, **COMMON))
    if kind == "gpt_neox":  # fused query_key_value, rotary_pct 0.25
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**COMMON))
    raise AssertionError(kind)


def _layers_of(model):
    return model.gpt_neox.layers if hasattr(model, "gpt_neox") else model.model.layers


def _direct(model, ids):
    """Per layer: pre-rotation q (N, H, D), k (N, G, D) and the rotated q, k, recomputed from hidden states."""
    out = model(ids, output_hidden_states=True, use_cache=False)
    backbone = model.gpt_neox if hasattr(model, "gpt_neox") else model.model
    modeling = importlib.import_module(type(model).__module__)
    positions = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
    p = hf_rotary_params(model.config)
    H, G, D, R = p["n_heads"], p["n_kv_heads"], p["head_dim"], p["rotary_dim"]
    result = []
    for i, layer in enumerate(_layers_of(model)):
        x = layer.input_layernorm(out.hidden_states[i])
        if hasattr(layer, "attention"):  # GPT-NeoX
            w, b = layer.attention.query_key_value.weight, layer.attention.query_key_value.bias
            qkv = (x @ w.T + b).unflatten(-1, (H, 3 * D))
            q, k = qkv[..., :D], qkv[..., D : 2 * D]
        else:
            a = layer.self_attn
            q = (x @ a.q_proj.weight.T + (0 if a.q_proj.bias is None else a.q_proj.bias)).unflatten(-1, (H, D))
            k = (x @ a.k_proj.weight.T + (0 if a.k_proj.bias is None else a.k_proj.bias)).unflatten(-1, (G, D))
        cos, sin = backbone.rotary_emb(x, positions)  # HF's own rotation, (B, T, R)
        qr, kr = modeling.apply_rotary_pos_emb(q[..., :R].transpose(1, 2), k[..., :R].transpose(1, 2), cos, sin)
        qr = torch.cat([qr.transpose(1, 2), q[..., R:]], -1)
        kr = torch.cat([kr.transpose(1, 2), k[..., R:]], -1)
        result.append([t.flatten(0, 1).double() for t in (q, k, qr, kr)])
    return result


@pytest.mark.parametrize("kind", ["llama", "phi", "qwen2", "mistral", "gpt_neox"])
def test_hook_capture_matches_direct_recomputation(kind):
    model = _build(kind).eval()
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, VOCAB, (2, 11), generator=g) for _ in range(2)]
    layers, p_max = hf_rotary_layers(model)
    assert p_max == 40 and len(layers) == 2
    p = hf_rotary_params(model.config)
    assert layers[0].rotary_dim == {"phi": 8, "gpt_neox": 4}.get(kind, 16) == p["rotary_dim"]
    assert layers[0].n_kv_heads == {"llama": 2, "mistral": 2, "qwen2": 1}.get(kind, 4)
    stats = capture_statistics(lambda ids: model(ids, use_cache=False), layers, batches, progress=False)
    direct = [_direct(model, ids) for ids in batches]
    for li, s in enumerate(stats):
        q, k, qr, kr = (torch.cat([d[li][j] for d in direct]) for j in range(4))
        for got, x, xr in ((s.q, q, qr), (s.k, k, kr)):
            assert got.count == 44
            torch.testing.assert_close(got.mean(), x.mean(0), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got.channel_summary()["max_abs"], x.abs().amax(0), rtol=1e-5, atol=1e-6)
            # our rotation (θ from hybrid.rotary.inv_freq, half layout) reproduces HF's rotated q and k
            torch.testing.assert_close(got.channel_summary()["max_abs_rotated"], xr.abs().amax(0), rtol=1e-5,
                                       atol=1e-5)
    result = analyze(stats, p_max)
    assert result.phi.shape == (2, 4, p["rotary_dim"] // 2)


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                                     {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0}])
def test_frequencies_after_scaling_match_hf(scaling):
    kw = dict(COMMON, rope_scaling=scaling) if scaling else COMMON
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    layers, _ = hf_rotary_layers(model)
    torch.testing.assert_close(layers[0].theta.float(), model.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)


def test_sliding_windows_are_read_from_the_config():
    """Mistral windows every layer; Qwen2 only with use_sliding_window, from max_window_layers on; Llama never."""
    mistral = transformers.MistralConfig(num_key_value_heads=2, **dict(COMMON, num_hidden_layers=3), sliding_window=8)
    assert hf_sliding_windows(mistral, 3) == [8, 8, 8]
    assert hf_sliding_windows(transformers.MistralConfig(sliding_window=None, **COMMON), 2) == [None, None]
    qwen2 = transformers.Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=1, **COMMON)
    assert hf_sliding_windows(qwen2, 2) == [None, 8]
    assert hf_sliding_windows(transformers.Qwen2Config(sliding_window=8, **COMMON), 2) == [None, None]
    assert hf_sliding_windows(transformers.LlamaConfig(**COMMON), 2) == [None, None]


def test_a_sliding_window_model_is_analysed_over_its_window():
    """A one-layer Mistral with sliding_window 8: its outputs at m depend on the tokens m − 7 … m only (HF's own
    mask, checked here), so its bounds use p_max = 8, not max_position_embeddings 40."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(num_key_value_heads=2, sliding_window=8, **dict(COMMON, num_hidden_layers=1))
    model = transformers.MistralForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (1, 12))
    changed = ids.clone()
    changed[0, 2] = (ids[0, 2] + 1) % VOCAB
    with torch.no_grad():
        diff = (model(changed, use_cache=False).logits - model(ids, use_cache=False).logits).abs().amax(-1)[0]
    assert bool((diff[2:10] > 0).all()) and bool((diff[10:] == 0).all())  # m − 2 < 8 sees it, m − 2 >= 8 not
    layers, p_max = hf_rotary_layers(model)
    assert p_max == 40 and [layer.window for layer in layers] == [8]
    result = analyze(capture_statistics(lambda x: model(x, use_cache=False), layers, [ids], progress=False), p_max)
    assert result.layer_p_max == [8]
    expected = result.theta * 8 < 2 * torch.pi
    assert bool((expected != (result.theta * 40 < 2 * torch.pi)).any())  # the case tells the two p_max apart
    assert torch.equal(result.under_upper_bound, expected)
    torch.testing.assert_close(result.lower_bound, torch.pi + 8 * result.theta / 2)


def test_unknown_architectures_are_refused():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB))
    with pytest.raises(ValueError, match="model: expected a causal LM of type"):
        hf_rotary_layers(model)


def test_missing_hub_model_fails_with_one_line_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as err:
        load_hf_causal_lm("no-such-owner/no-such-model")
    message = str(err.value)
    assert "\n" not in message and "no-such-owner/no-such-model" in message and "HF_HUB_OFFLINE" in message


def test_local_directory_round_trip(tmp_path):
    model = _build("phi")
    model.save_pretrained(tmp_path / "phi")
    loaded, tokenizer = load_hf_causal_lm(str(tmp_path / "phi"))
    assert tokenizer is None
    ids = torch.randint(0, VOCAB, (1, 7))
    torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits)


def test_model_loading_reads_the_model_offline_flags(monkeypatch, tmp_path):
    """The loader asks the one hub probe (train/data/sources.py) about models: TRANSFORMERS_OFFLINE counts there,
    HF_DATASETS_OFFLINE only for datasets."""
    from hybrid.train.data.sources import hub_offline_reason

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused, whatever the network
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="TRANSFORMERS_OFFLINE"):
        load_hf_causal_lm("no-such-owner/no-such-model")
    assert "127.0.0.1:9" in hub_offline_reason(what="dataset")  # not an offline flag for datasets
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert "HF_DATASETS_OFFLINE" in hub_offline_reason(what="dataset")
    with pytest.raises(ValueError, match=r"what: expected one of \('dataset', 'model'\), got 'tokenizer'"):
        hub_offline_reason(what="tokenizer")
