"""HybridForCausalLM against HybridLM itself: weights, loss, generate, padding, isolation (transformers, offline,
tiny models). Its config and cache: test_configuration.py, test_cache.py."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import AutoModel, AutoModelForCausalLM  # noqa: E402

from hybrid.models import HybridConfig  # noqa: E402
from hybrid.models.hf import HybridForCausalLM, HybridHFConfig  # noqa: E402

V = 53  # the vocabulary of conftest.py's tiny cases and ids_for prompts
# conftest.py's tiny_cases: every preset (the hybrid's window, 3, is shorter than the prompts), one GQA + CARoPE +
# untied variant
CASE_NAMES = ["hybrid", "transformer", "retnet", "vo-rnn", "hybrid-gqa-carope-untied"]


# ---------------------------------------------------------------------------------------------- config

# ---------------------------------------------------------------------------------------------- weights

@pytest.mark.parametrize("name", CASE_NAMES)
def test_save_and_auto_from_pretrained_give_the_same_logits(name, tmp_path, make, ids_for, tiny_cases):
    model = make(name)
    ids = ids_for(2, 9)
    ours, _ = model.model(ids)
    assert torch.equal(model(ids).logits, ours)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is HybridForCausalLM
    assert torch.equal(loaded(ids).logits, ours)
    tied = tiny_cases[name].tie_embeddings
    assert (loaded.model.lm_head.weight is loaded.model.embed.weight) == tied
    assert torch.equal(loaded.model.lm_head.weight, model.model.lm_head.weight)
    assert type(AutoModel.from_pretrained(tmp_path)) is HybridForCausalLM


@pytest.mark.parametrize("overrides", [{"preset": "vo-gla", "gla.phase": "data"},
                                       {"preset": "vo-rnn", "recurrence.phase": "learned", "recurrence.rotary_dim": 8},
                                       {"preset": "transformer", "rotary.scaling": {
                                           "rope_type": "dynamic", "factor": 2.0,
                                           "original_max_position_embeddings": 16}}],
                         ids=["gla-data-phase", "rnn-learned-phase", "dynamic-ntk"])
def test_from_pretrained_builds_on_the_meta_device_and_writes_the_computed_buffers_back(
        overrides, tmp_path, hf_model, ids_for, monkeypatch):
    """Nothing is allocated to build the model that the weights then replace; the buffers computed from the config
    (rotary frequencies, the schedule's angles, the data phase's start) are in no checkpoint and come back."""
    import hybrid.models.hf.modeling as modeling

    overrides = dict(overrides)
    config = HybridConfig.preset(overrides.pop("preset"), d_model=32, n_layers=2, n_heads=2, vocab_size=V,
                                 **overrides)
    model = hf_model(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the init, so a weight drawn again shows
    model.save_pretrained(tmp_path)
    built_on = []

    class Spy(modeling.HybridLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built_on.append(next(self.parameters()).device.type)

    monkeypatch.setattr(modeling, "HybridLM", Spy)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert built_on == ["meta"]
    ids = ids_for(2, 40)  # past the dynamic NTK threshold (16 positions)
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    for (name, b), c in zip(model.named_buffers(), loaded.buffers()):
        assert torch.equal(c, b), name


@pytest.mark.parametrize("asked", [{"dtype": torch.bfloat16}, {"torch_dtype": torch.float64}, {"dtype": "float16"}])
def test_from_pretrained_and_from_config_build_the_dtype_asked_for(asked, tmp_path, make, ids_for, tiny_cases):
    """transformers' ``dtype`` (and the older ``torch_dtype``) is honoured: the model is the HybridLM of that dtype
    with the saved weights cast, its config says so, and a save keeps it."""
    from hybrid.models import HybridLM
    from transformers import AutoConfig

    make("hybrid").save_pretrained(tmp_path / "f32")
    want = next(iter(asked.values()))
    want = getattr(torch, want) if isinstance(want, str) else want
    name = str(want).removeprefix("torch.")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "f32", **asked).eval()
    assert loaded.dtype == want and loaded.config.hybrid["dtype"] == name
    native = HybridLM(tiny_cases["hybrid"].replace(dtype=name)).eval()
    native.load_state_dict(make("hybrid").model.state_dict())
    ids = ids_for(2, 9)
    assert torch.equal(loaded(ids).logits, native(ids)[0])
    built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "f32"), **asked)
    assert built.dtype == want and built.config.hybrid["dtype"] == name
    loaded.save_pretrained(tmp_path / "again")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "again").dtype == want  # saved in it: loads in it


def test_a_model_cast_after_building_is_saved_and_loaded_in_its_dtype(tmp_path, make):
    model = make("vo-rnn").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.dtype == torch.bfloat16 and loaded.config.hybrid["dtype"] == "bfloat16"
    assert torch.equal(loaded.model.lm_head.weight, model.model.lm_head.weight)
    assert AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("name", ["hybrid", "hybrid-gqa-carope-untied"])
def test_resized_embeddings_take_the_new_ids_and_save(name, tmp_path, make, ids_for):
    model = make(name)
    ids = ids_for(2, 9)
    before = model(ids).logits
    model.resize_token_embeddings(V + 7)
    assert model.config.vocab_size == model.config.hybrid["vocab_size"] == model.model.config.vocab_size == V + 7
    assert model.model.lm_head.weight.shape[0] == V + 7
    torch.testing.assert_close(model(ids).logits[..., :V], before, rtol=0, atol=0)  # old rows kept
    new_ids = torch.cat([ids, torch.full((2, 1), V + 6)], dim=1)
    logits = model(new_ids).logits
    model.save_pretrained(tmp_path)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path)(new_ids).logits, logits)


def test_from_pretrained_refuses_a_checkpoint_missing_a_weight(tmp_path, make):
    from safetensors.torch import load_file, save_file

    make("vo-rnn").save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.blocks.1.mlp.w_up.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"checkpoint: expected every weight.*'model.blocks.1.mlp.w_up.weight'"):
        HybridForCausalLM.from_pretrained(tmp_path)


def test_loss_from_labels_is_next_token_cross_entropy(make, ids_for):
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


def test_an_accumulation_steps_losses_sum_to_its_token_mean(make, ids_for):
    """transformers' Trainer passes ``num_items_in_batch`` (the labelled tokens of the whole accumulation step) to a
    forward that takes ``**kwargs`` and then no longer divides by the accumulation steps: the micro-batches' losses
    must sum to the step's token mean (uneven micro-batches: the mean of their means would be another number)."""
    model = make("hybrid")
    ids = ids_for(4, 8)
    labels = ids.clone()
    labels[0, 3:] = -100
    whole = model(ids, labels=labels).loss
    items = (labels[:, 1:] != -100).sum()
    parts = [model(ids[i : i + 2], labels=labels[i : i + 2], num_items_in_batch=items).loss for i in (0, 2)]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-6, atol=0)
    means = [model(ids[i : i + 2], labels=labels[i : i + 2]).loss for i in (0, 2)]
    assert abs((means[0] + means[1]).item() / 2 - whole.item()) > 1e-3  # the case tells the two apart


# ---------------------------------------------------------------------------------------------- generate

@pytest.mark.parametrize("name", CASE_NAMES)
def test_greedy_generate_equals_hybridlm_recurrent(name, make, ids_for):
    model = make(name)
    ids = ids_for(2, 7)  # longer than the hybrid's window
    ours = model.model.generate(ids, 6, mode="recurrent", temperature=0)
    theirs = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert theirs.tolist() == ours.tolist()


def test_one_decode_route_for_hybridlm_and_the_wrapper(ids_for):
    """HybridLM.generate(mode="recurrent") and the wrapper's generate decode through one route (HybridLM.forward
    at T = 1 with a state is HybridLM.step): on a tiny random model with every mixer, greedy tokens agree, every
    decode step's logits are the very logits of HybridLM.step, and a left-padded batch decodes each row as alone."""
    torch.manual_seed(0)
    config = HybridConfig(vocab_size=V, d_model=32, n_heads=2, n_layers=3, pattern="RAM", window=3)
    model = HybridForCausalLM(HybridHFConfig(config)).eval()
    ids = ids_for(2, 7)
    ours = model.model.generate(ids, 6, mode="recurrent", temperature=0)
    theirs = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
                            return_dict_in_generate=True)
    assert theirs.sequences.tolist() == ours.tolist()
    with torch.no_grad():
        logits, state = model.model(ids)
        expected = [logits[:, -1]]
        for t in range(7, 12):
            logits, state = model.model.step(ours[:, t], state)
            expected.append(logits)
    assert len(theirs.logits) == len(expected)
    for step, (got, want) in enumerate(zip(theirs.logits, expected)):
        assert torch.equal(got, want), f"decode step {step}"
    rows = [ids_for(1, 7, seed=2), ids_for(1, 4, seed=3)]
    padded, mask = left_padded(rows)
    out = model.generate(padded, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    for i, r in enumerate(rows):
        assert out[i, 7:].tolist() == model.model.generate(r, 5, temperature=0)[0, r.shape[1]:].tolist()


@pytest.mark.parametrize("name", ["hybrid", "transformer"])
def test_sampling_generate_equals_hybridlm_recurrent(name, make, ids_for):
    model = make(name)
    ids = ids_for(1, 5)
    for kwargs, ours_kwargs in (({"top_k": None}, {}), ({"temperature": 0.7, "top_k": 5}, {"temperature": 0.7, "top_k": 5})):
        torch.manual_seed(11)
        theirs = model.generate(ids, max_new_tokens=8, do_sample=True, top_p=None, pad_token_id=0, **kwargs)
        torch.manual_seed(11)
        ours = model.model.generate(ids, 8, mode="recurrent", **ours_kwargs)
        assert theirs.tolist() == ours.tolist()


PRESETS = ["hybrid", "transformer", "retnet", "vo-rnn", "vo-gla"]


@pytest.mark.parametrize("name", PRESETS)
def test_beam_search_with_cache_equals_beam_search_recomputing(name, make, ids_for):
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
def test_left_padding_gives_the_unpadded_rows(name, make, ids_for):
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


@pytest.mark.parametrize("beams", [1, 2])
def test_generate_feeds_only_new_tokens_once_the_prompt_is_cached(beams, monkeypatch, make, ids_for):
    """generate prefills the prompt, then runs one token a step: a release that renames the cache keyword (5.2x:
    `past_key_values` → `cache`) must not make every step recompute the whole sequence."""
    model = make("hybrid")
    widths = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, input_ids=None, **kw: widths.append(input_ids.shape[1])
                        or forward(self, input_ids, **kw))
    model.generate(ids_for(2, 6), max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=beams, pad_token_id=0)
    assert widths == [6, 1, 1, 1]


def test_forward_rejects_bad_inputs(make, ids_for):
    model = make("vo-rnn")
    ids = ids_for(2, 4)
    with pytest.raises(ValueError, match="inputs_embeds: expected None"):
        model(ids, inputs_embeds=torch.zeros(2, 4, 32))
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(2, 4\)"):
        model(ids, attention_mask=torch.ones(2, 7))
    with pytest.raises(ValueError, match="past_key_values: expected a HybridCache"):
        model(ids, past_key_values=object())


def test_generate_refuses_a_cache_it_cannot_continue(make, ids_for):
    model = make("hybrid")
    done = model.generate(ids_for(1, 8), max_new_tokens=3, do_sample=False, pad_token_id=0,
                           return_dict_in_generate=True)
    cache = done.past_key_values if hasattr(done, "past_key_values") else done.cache
    with pytest.raises(ValueError, match=r"input_ids: expected the whole sequence so far, longer than the 10 columns"):
        model.generate(ids_for(1, 3), past_key_values=cache, max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(ValueError, match=r"past_key_values: expected a cache of 2 rows \(input_ids'\), got one of 1"):
        model(ids_for(2, 1), past_key_values=cache)


# ---------------------------------------------------------------------------------------------- isolation

def _run(code: str, env_extra=None) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_trust_remote_code_opens_a_saved_model_without_importing_us_first(tmp_path, make, ids_for):
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
