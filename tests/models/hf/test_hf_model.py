"""HybridHFConfig / HybridForCausalLM / HybridCache against HybridLM itself (transformers, offline, tiny models)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

from hybrid.models import HybridConfig, HybridLM  # noqa: E402
from hybrid.models.hf import HybridCache, HybridForCausalLM, HybridHFConfig  # noqa: E402
from hybrid.models.hf._compat import GENERATE_CACHE_KWARG  # noqa: E402
from hybrid.models.hf.cache import select_rows  # noqa: E402

V = 53
TINY = dict(d_model=32, n_layers=3, n_heads=2, vocab_size=V)
# every preset; the hybrid's window (3) is shorter than the prompts; one GQA + CARoPE + untied variant
CASES = {
    "hybrid": HybridConfig.preset("hybrid", **TINY, window=3),
    "transformer": HybridConfig.preset("transformer", **TINY),
    "retnet": HybridConfig.preset("retnet", **TINY),
    "vo-rnn": HybridConfig.preset("vo-rnn", **TINY),
    "hybrid-gqa-carope-untied": HybridConfig.preset("hybrid", **{**TINY, "n_heads": 4}, window=4, n_kv_heads=2,
                                                    carope=True, tie_embeddings=False),
}


def make(name, seed=0):
    torch.manual_seed(seed)
    return HybridForCausalLM(HybridHFConfig(CASES[name])).eval()


def ids_for(B, T, seed=1):
    return torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- config

def test_config_wraps_hybrid_config_losslessly(tmp_path):
    cfg = CASES["hybrid-gqa-carope-untied"].replace(rope_base=5000.0, meta={"preset": "hybrid", "note": [1, 2]})
    hf = HybridHFConfig(cfg)
    assert hf.to_hybrid_config() == cfg
    assert HybridHFConfig(cfg.to_dict()).to_hybrid_config() == cfg
    assert (hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.tie_word_embeddings) == (V, 32, 3, False)
    hf.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).to_hybrid_config() == cfg
    scaled = HybridConfig.preset("transformer", **TINY, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                      "original_max_position_embeddings": 16})
    scaled_hf = HybridHFConfig(scaled)
    scaled_hf.save_pretrained(tmp_path / "s")
    assert HybridHFConfig.from_pretrained(tmp_path / "s").to_hybrid_config() == scaled


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="hybrid: expected a HybridConfig"):
        HybridHFConfig(hybrid=3)
    with pytest.raises(ValueError, match="n_heads"):
        HybridHFConfig({"d_model": 30, "n_heads": 4})


# ---------------------------------------------------------------------------------------------- weights

@pytest.mark.parametrize("name", list(CASES))
def test_save_and_auto_from_pretrained_give_the_same_logits(name, tmp_path):
    model = make(name)
    ids = ids_for(2, 9)
    ours, _ = model.model(ids)
    assert torch.equal(model(ids).logits, ours)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is HybridForCausalLM
    assert torch.equal(loaded(ids).logits, ours)
    tied = CASES[name].tie_embeddings
    assert (loaded.model.lm_head.weight is loaded.model.embed.weight) == tied
    assert torch.equal(loaded.model.lm_head.weight, model.model.lm_head.weight)
    assert type(AutoModel.from_pretrained(tmp_path)) is HybridForCausalLM


def test_from_pretrained_refuses_a_checkpoint_missing_a_weight(tmp_path):
    from safetensors.torch import load_file, save_file

    make("vo-rnn").save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.blocks.1.mlp.w_up.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"checkpoint: expected every weight.*'model.blocks.1.mlp.w_up.weight'"):
        HybridForCausalLM.from_pretrained(tmp_path)


def test_loss_from_labels_is_next_token_cross_entropy():
    model = make("hybrid")
    ids = ids_for(2, 8)
    labels = ids.clone()
    labels[0, 5] = -100
    out = model(ids, labels=labels)
    logits = model.model(ids)[0].double()
    keep = labels[:, 1:] != -100
    expected = F.cross_entropy(logits[:, :-1][keep], labels[:, 1:][keep])
    torch.testing.assert_close(out.loss.double(), expected, rtol=1e-6, atol=0)
    out.loss.backward()
    assert model.model.embed.weight.grad is not None


# ---------------------------------------------------------------------------------------------- generate

@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generate_equals_hybridlm_recurrent(name):
    model = make(name)
    ids = ids_for(2, 7)  # longer than the hybrid's window
    ours = model.model.generate(ids, 6, mode="recurrent", temperature=0)
    theirs = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert theirs.tolist() == ours.tolist()


@pytest.mark.parametrize("name", ["hybrid", "transformer"])
def test_sampling_generate_equals_hybridlm_recurrent(name):
    model = make(name)
    ids = ids_for(1, 5)
    for kwargs, ours_kwargs in (({"top_k": None}, {}), ({"temperature": 0.7, "top_k": 5}, {"temperature": 0.7, "top_k": 5})):
        torch.manual_seed(11)
        theirs = model.generate(ids, max_new_tokens=8, do_sample=True, top_p=None, pad_token_id=0, **kwargs)
        torch.manual_seed(11)
        ours = model.model.generate(ids, 8, mode="recurrent", **ours_kwargs)
        assert theirs.tolist() == ours.tolist()


PRESETS = ["hybrid", "transformer", "retnet", "vo-rnn"]


@pytest.mark.parametrize("name", PRESETS)
def test_beam_search_with_cache_equals_beam_search_recomputing(name):
    """Reordered recurrent states (reorder_cache) give the beams of full recomputation (no cache)."""
    model = make(name)
    ids = ids_for(2, 7)
    kw = dict(max_new_tokens=5, do_sample=False, num_beams=2, pad_token_id=0)
    if name == "hybrid":
        kw["num_return_sequences"] = 2
    cached = model.generate(ids, **kw)
    recomputed = model.generate(ids, use_cache=False, **kw)
    assert cached.tolist() == recomputed.tolist()


def left_padded(rows):
    T = max(r.shape[1] for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - r.shape[1]:] = r[0]
        mask[i, T - r.shape[1]:] = 1
    return ids, mask


@pytest.mark.parametrize("name", PRESETS)
def test_left_padding_gives_the_unpadded_rows(name):
    model = make(name)
    rows = [ids_for(1, 7, seed=2), ids_for(1, 4, seed=3), ids_for(1, 7, seed=4)]
    ids, mask = left_padded(rows)
    logits = model(ids, attention_mask=mask).logits
    for i, r in enumerate(rows):
        n = r.shape[1]
        torch.testing.assert_close(logits[i, -n:], model.model(r)[0][0], rtol=1e-6, atol=1e-6)
        assert not logits[i, : 7 - n].any()  # zeros at pads
    out = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    for i, r in enumerate(rows):
        assert out[i, 7:].tolist() == model.model.generate(r, 4, temperature=0)[0, r.shape[1]:].tolist()
    if name != "hybrid":  # beams over padded rows: once (the slowest test otherwise)
        return
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, num_beams=2, pad_token_id=0)
    assert model.generate(ids, **kw).tolist() == model.generate(ids, use_cache=False, **kw).tolist()


def test_cache_memory_is_flat_for_a_windowed_hybrid_and_grows_for_global_attention():
    sizes = {}
    for name in ("hybrid", "transformer"):
        model = make(name)
        for n in (4, 16):
            cache = HybridCache()
            out = model.generate(ids_for(2, 6), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                 return_dict_in_generate=True, **{GENERATE_CACHE_KWARG: cache})
            assert getattr(out, GENERATE_CACHE_KWARG) is cache and cache.get_seq_length() == 6 + n - 1
            sizes[name, n] = cache.nbytes
    assert sizes["hybrid", 4] == sizes["hybrid", 16] > 0
    assert sizes["transformer", 16] > sizes["transformer", 4]


@pytest.mark.parametrize("beams", [1, 2])
def test_generate_feeds_only_new_tokens_once_the_prompt_is_cached(beams, monkeypatch):
    """generate prefills the prompt, then runs one token a step: a release that renames the cache keyword (5.2x:
    `past_key_values` → `cache`) must not make every step recompute the whole sequence."""
    model = make("hybrid")
    widths = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, input_ids=None, **kw: widths.append(input_ids.shape[1])
                        or forward(self, input_ids, **kw))
    model.generate(ids_for(2, 6), max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=beams, pad_token_id=0)
    assert widths == [6, 1, 1, 1]


def test_cache_row_operations_gather_every_state_tensor():
    model = make("hybrid-gqa-carope-untied")
    ids = ids_for(3, 5)
    cache = HybridCache()
    model(ids, past_key_values=cache)
    cache.batch_repeat_interleave(2)  # rows 0 0 1 1 2 2
    cache.batch_select_indices(torch.tensor([5, 0, 3]))  # rows 2 0 1
    cache.reorder_cache(torch.tensor([2, 2, 0]))  # rows 1 1 2
    nxt = ids_for(3, 1, seed=9)
    logits = model(nxt, past_key_values=cache).logits[:, -1]
    order = torch.tensor([1, 1, 2])
    expected = model.model(torch.cat([ids[order], nxt], 1))[0][:, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    _, state = model.model(ids)
    picked = select_rows(state, torch.tensor([2]))
    assert picked.layers[0].scan.shape[0] == 1 and state.layers[0].scan.shape[0] == 3


def test_forward_rejects_bad_inputs():
    model = make("vo-rnn")
    ids = ids_for(2, 4)
    with pytest.raises(ValueError, match="inputs_embeds: expected None"):
        model(ids, inputs_embeds=torch.zeros(2, 4, 32))
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(2, 4\)"):
        model(ids, attention_mask=torch.ones(2, 7))
    with pytest.raises(ValueError, match="past_key_values: expected a HybridCache"):
        model(ids, past_key_values=object())


# ---------------------------------------------------------------------------------------------- isolation

def _run(code: str, env_extra=None) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_trust_remote_code_opens_a_saved_model_without_importing_us_first(tmp_path):
    model = make("hybrid")
    model.save_pretrained(tmp_path / "m")
    ids = ids_for(1, 6)
    torch.save({"ids": ids, "logits": model.model(ids)[0]}, tmp_path / "ref.pt")
    out = _run(
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r}, trust_remote_code=True).eval()\n"
        f"ref = torch.load({str(tmp_path / 'ref.pt')!r})\n"
        "print(type(m).__name__, torch.equal(m(ref['ids']).logits, ref['logits']))\n",
        {"HF_MODULES_CACHE": str(tmp_path / "modules")},
    )
    assert out.split() == ["HybridForCausalLM", "True"]


def test_the_core_library_never_imports_transformers():
    out = _run("import sys, hybrid, hybrid.models, hybrid.train, hybrid.kernels\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'lm_eval')))")
    assert out.strip() == "[]"
