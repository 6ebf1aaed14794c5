"""Decoding outside the model (models/generation.py): ``generate`` and its ``HybridLM.generate`` caller — greedy
and sampled continuations in every mode, EOS, the vocabulary limit, the decode loop's one-token calls,
``TokenPicker``, and one-line errors."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import HybridConfig
from hybrid.models.generation import PREFILL_MODES, TokenPicker, generate

VOCAB = 61
PRESET_NAMES = ("transformer", "retnet", "vo-rnn", "hybrid")
PRESET_CONFIGS = [HybridConfig.preset(name, "tiny", d_model=24, n_heads=2, n_layers=3, vocab_size=VOCAB,
                                      window=(5 if name == "hybrid" else None)) for name in PRESET_NAMES]


@pytest.mark.parametrize("config", PRESET_CONFIGS, ids=PRESET_NAMES)
@pytest.mark.parametrize("prefill", ["parallel", "chunked"])
def test_greedy_recurrent_generation_equals_argmax_of_parallel_forwards(config, prefill, model_of, ids_of):
    model = model_of(config)
    prompt = ids_of(2, 6, 12)
    out = model.generate(prompt, 12, mode="recurrent", prefill=prefill, temperature=0, chunk_size=4)
    sequence = prompt
    with torch.no_grad():
        for _ in range(12):
            logits, _ = model(sequence)
            sequence = torch.cat([sequence, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, sequence)
    assert torch.equal(model.generate(prompt, 12, mode="parallel", temperature=0), sequence)


def test_sampled_generation_is_reproducible_and_modes_agree(model_of, ids_of):
    model = model_of(PRESET_CONFIGS[3])
    prompt = ids_of(3, 4, 13)
    outs = [
        model.generate(prompt, 10, mode=mode, temperature=0.8, top_k=20, top_p=0.9,
                       generator=torch.Generator().manual_seed(5))
        for mode in ("recurrent", "parallel", "chunked")
    ]
    assert outs[0].shape == (3, 14)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_eos_stops_and_pads(model_of, ids_of):
    model = model_of(PRESET_CONFIGS[2])
    prompt = ids_of(2, 3, 14)
    greedy = model.generate(prompt, 8, temperature=0)
    eos = int(greedy[0, 5])  # a token the first sequence produces
    out = model.generate(prompt, 8, temperature=0, eos_token_id=eos)
    first = (out[0, 3:] == eos).nonzero()[0].item()
    assert (out[0, 3 + first:] == eos).all()
    assert torch.equal(out[:, : 3 + first + 1], greedy[:, : 3 + first + 1])


@pytest.mark.parametrize("mode, sampling", [
    ("recurrent", dict()), ("parallel", dict()), ("recurrent", dict(temperature=0)), ("recurrent", dict(top_k=40)),
    ("recurrent", dict(top_p=0.95)), ("recurrent", dict(temperature=2.0, top_k=5, top_p=0.5)),
], ids=["default", "default-parallel", "greedy", "top_k", "top_p", "all"])
def test_generation_never_emits_padding_ids(mode, sampling, model_of):
    """An untrained model whose padding rows are the most likely tokens: generation (the default temperature
    included) never produces an id >= vocab_limit, for many seeds."""
    config = HybridConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, pattern="RA", window=8)
    model = model_of(config)
    limit = 37
    with torch.no_grad():
        model.lm_head.weight[limit:] *= 50  # tied with the embedding: the padding rows dominate the logits
    prompt = torch.randint(0, limit, (3, 4), generator=torch.Generator().manual_seed(0))
    unmasked = model.generate(prompt, 6, mode=mode, generator=torch.Generator().manual_seed(0), **sampling)
    assert int(unmasked[:, 4:].max()) >= limit  # without the limit, padding ids are sampled
    for seed in range(8):
        out = model.generate(prompt, 6, mode=mode, generator=torch.Generator().manual_seed(seed),
                             vocab_limit=limit, **sampling)
        assert out.shape == (3, 10) and int(out[:, 4:].max()) < limit


def test_zero_new_tokens(model_of, ids_of):
    model = model_of(PRESET_CONFIGS[3])
    prompt = ids_of(2, 3, 15)
    assert torch.equal(model.generate(prompt, 0), prompt)


def test_the_model_method_is_a_thin_caller(model_of, ids_of):
    model = model_of(PRESET_CONFIGS[3])
    prompt = ids_of(2, 4, 16)
    for kwargs in (dict(temperature=0), dict(temperature=0.9, top_k=7), dict(mode="chunked", chunk_size=3)):
        ours = generate(model, prompt, 5, generator=torch.Generator().manual_seed(1), **kwargs)
        theirs = model.generate(prompt, 5, generator=torch.Generator().manual_seed(1), **kwargs)
        assert torch.equal(ours, theirs), kwargs


@pytest.mark.parametrize("prefill", PREFILL_MODES)
def test_recurrent_mode_prefills_once_then_feeds_one_token_a_call(prefill, monkeypatch, model_of, ids_of):
    """One token continuing a state is the model's decode step: after the prompt, every call gets one token
    (none for the last token chosen)."""
    model = model_of(PRESET_CONFIGS[3])
    widths, forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda ids, *a, **k: widths.append(ids.shape[1]) or forward(ids, *a, **k))
    generate(model, ids_of(2, 6, 17), 4, prefill=prefill, chunk_size=4, temperature=0)
    assert widths == [6, 1, 1, 1]
    widths.clear()
    generate(model, ids_of(2, 6, 17), 3, mode="parallel", temperature=0)  # recomputes the whole sequence
    assert widths == [6, 7, 8]


def test_token_picker_keeps_the_tokens_and_repeats_eos():
    logits = torch.full((3, 5), -10.0)
    pick = TokenPicker(3, "cpu", temperature=0, top_k=None, top_p=None, generator=None, eos_token_id=4,
                       vocab_limit=None)
    assert not pick.all_finished
    logits[:, 2], logits[0, 4] = 0.0, 10.0  # greedy: row 0 chooses EOS, rows 1 and 2 token 2
    assert pick(logits).tolist() == [4, 2, 2] and pick.finished.tolist() == [True, False, False]
    logits[0, 4], logits[1, 4], logits[0, 1] = -10.0, 10.0, 10.0  # row 0 would choose 1, row 1 chooses EOS
    assert pick(logits).tolist() == [4, 4, 2] and not pick.all_finished
    logits[2, 4] = 10.0
    assert pick(logits).tolist() == [4, 4, 4] and pick.all_finished
    assert [t.tolist() for t in pick.tokens] == [[4, 2, 2], [4, 4, 2], [4, 4, 4]]
    no_eos = TokenPicker(2, "cpu", temperature=0, top_k=None, top_p=None, generator=None, eos_token_id=None,
                         vocab_limit=3)
    assert no_eos(torch.tensor([[0.0, 1.0, 2.0, 9.0], [3.0, 0.0, 0.0, 9.0]])).tolist() == [2, 0]  # id 3 is padding
    assert not no_eos.all_finished


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), -1), r"max_new_tokens: expected an int >= 0"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, prefill="recurrent"), r"prefill: expected 'parallel' or 'chunked'"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=-1), r"temperature: expected a number >= 0"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, top_k=0), r"top_k: expected a positive int"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, top_p=1.5), r"top_p: expected a number in \(0, 1\]"),
        (lambda m: m.generate(torch.zeros(1, 0, dtype=torch.long), 2), r"input_ids: expected a prompt of at least one token"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=float("nan")), r"temperature: expected a number >= 0, got nan"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=float("inf")), r"temperature: expected a number >= 0, got inf"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, eos_token_id=999), r"eos_token_id: expected an int >= 0 and <= 60 or None, got 999"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, eos_token_id=-1), r"eos_token_id: expected an int >= 0 and <= 60 or None, got -1"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, eos_token_id=50, vocab_limit=40), r"eos_token_id: expected an int >= 0 and <= 39 or None, got 50"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, vocab_limit=VOCAB + 1), r"vocab_limit: expected an int >= 1 and <= 61"),
        (lambda m: m.generate(torch.zeros(1, 3, dtype=torch.long), 2, mode="fast"), r"^mode: expected one of"),
        (lambda m: generate(m, torch.zeros(1, 3), 2), r"^input_ids: expected an int64 tensor"),
    ],
)
def test_generate_errors(call, match, model_of):
    model = model_of(PRESET_CONFIGS[3])
    with pytest.raises(ValueError, match=match):
        call(model)
