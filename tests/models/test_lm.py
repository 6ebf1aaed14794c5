"""HybridLM: the three modes agree, states continue across every handoff, generation, gradients."""
from __future__ import annotations

import random

import pytest
import torch

from hybrid.attention import AttentionState
from hybrid.models import HybridConfig, HybridLM, HybridState

VOCAB = 61


def random_config(rng: random.Random) -> HybridConfig:
    """A small random config exercising the options of every mixer."""
    n_heads = rng.choice([1, 2, 3])
    head_dim = rng.choice([4, 6, 8])
    kv = rng.choice([None, 1]) if n_heads > 1 else None
    placement = rng.choice(["qk", "vo", "qkvo", "q", "k", "v", "o", "qkv", "none"])
    shared = placement in ("qkvo", "qkv", "none") and rng.random() < 0.4
    carope = rng.random() < 0.25 and placement != "none"
    return HybridConfig(
        vocab_size=VOCAB,
        d_model=n_heads * head_dim + rng.choice([0, 2]),
        n_heads=n_heads,
        head_dim=head_dim,
        n_layers=rng.choice([2, 3, 4]),
        pattern="".join(rng.choice("RAM") for _ in range(rng.choice([1, 2, 3]))),
        n_kv_heads=kv,
        window=rng.choice([None, 3, 7]),
        shared_kv=shared,
        rope_placement=placement,
        rope_layout=rng.choice(["interleaved", "half"]),
        carope=carope,
        rnn_selective=rng.random() < 0.5,
        rnn_phase=rng.choice([None, "learned", "carope", "data"]),
        rnn_phase_map=rng.choice(["pi-sigmoid", "2pi-tanh"]),
        retention_chunk=rng.choice([3, 7, 64]),
    )


RANDOM_CONFIGS = [random_config(random.Random(seed)) for seed in range(10)]
PRESET_CONFIGS = [
    HybridConfig.preset(name, "tiny", d_model=24, n_heads=2, n_layers=3, vocab_size=VOCAB, window=(5 if name == "hybrid" else None))
    for name in ("transformer", "retnet", "vo-rnn", "hybrid")
]
# retention in tiles of 4 tokens (the default tile, 64, exceeds the test sequences)
TILED_RETNET = HybridConfig.preset("retnet", "tiny", d_model=24, n_heads=2, n_layers=2, vocab_size=VOCAB,
                                   retention_chunk=4, meta={"preset": "retnet-tiles-of-4"})
ALL_CONFIGS = PRESET_CONFIGS + RANDOM_CONFIGS + [TILED_RETNET]
IDS = [c.meta.get("preset", f"random-{c.pattern}-{c.rope_placement}") for c in ALL_CONFIGS]


def model_of(config: HybridConfig, seed: int = 0) -> HybridLM:
    torch.manual_seed(seed)
    model = HybridLM(config).eval()
    with torch.no_grad():  # non-trivial gains and biases, so that every parameter matters in the comparisons
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model


def ids_of(B, T, seed):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_logits_close(actual, expected, what):
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    assert err <= 1e-4 * scale, f"{what}: max error {err:.3g} > 1e-4 × logit scale {scale:.3g}"


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=IDS)
def test_three_modes_agree(config):
    model = model_of(config)
    ids = ids_of(2, 23, 1)
    with torch.no_grad():
        parallel, _ = model(ids, mode="parallel")
        chunked, _ = model(ids, mode="chunked", chunk_size=5)  # 5 does not divide 23
        recurrent, _ = model(ids, mode="recurrent")
    assert parallel.shape == (2, 23, VOCAB)
    assert_logits_close(chunked, parallel, "chunked vs parallel")
    assert_logits_close(recurrent, parallel, "recurrent vs parallel")


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=IDS)
def test_every_handoff_continues_the_sequence(config):
    model = model_of(config)
    ids = ids_of(2, 26, 2)
    with torch.no_grad():
        full, full_state = model(ids)
        # parallel → recurrent → chunked → parallel → recurrent
        plan = [("parallel", 0, 7), ("recurrent", 7, 11), ("chunked", 11, 19), ("parallel", 19, 24), ("recurrent", 24, 26)]
        state, pieces = None, []
        for mode, a, b in plan:
            logits, state = model(ids[:, a:b], mode=mode, state=state, chunk_size=3)
            pieces.append(logits)
    assert_logits_close(torch.cat(pieces, 1), full, "handoffs")
    assert state.offset == full_state.offset == 26
    assert state.nbytes == full_state.nbytes


def test_windowed_state_is_fixed_and_global_state_grows():
    windowed = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB, window=16)
    assert windowed.state_is_fixed
    model = model_of(windowed)
    with torch.no_grad():
        _, s64 = model(ids_of(1, 64, 3))
        _, s4k = model(ids_of(1, 4096, 4))
        _, s4k1 = model(ids_of(1, 1, 5), mode="recurrent", state=s4k)
    assert s64.nbytes == s4k.nbytes == s4k1.nbytes > 0
    transformer = HybridConfig.preset("transformer", "tiny", d_model=16, n_heads=2, n_layers=2, vocab_size=VOCAB)
    assert not transformer.state_is_fixed
    model = model_of(transformer)
    with torch.no_grad():
        _, g64 = model(ids_of(1, 64, 6))
        _, g128 = model(ids_of(1, 128, 7))
    assert g128.nbytes == 2 * g64.nbytes


def shifted_state(model: HybridLM, batch: int, offset: int) -> HybridState:
    """A state at position ``offset`` with nothing cached: the same tokens, every position shifted."""
    state = model.init_state(batch)
    state.layers = [AttentionState(k=None, v=None, offset=offset, length=0) for _ in state.layers]
    state.offset = offset
    return state


@pytest.mark.parametrize("placement,relative", [
    ("qk", True), ("vo", True), ("qkvo", True), ("none", True),
    ("q", False), ("k", False), ("v", False), ("o", False), ("qkv", False),
])
def test_position_shift_through_an_offset_state(placement, relative):
    config = HybridConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, pattern="A", rope_placement=placement)
    model = model_of(config)
    with torch.no_grad():  # sharpen attention: at init (std 0.02) it is nearly uniform, position-blind
        for block in model.blocks:
            block.mixer.in_proj.weight.mul_(30.0)
    ids = ids_of(2, 9, 8)
    with torch.no_grad():
        base, _ = model(ids)
        shifted, _ = model(ids, state=shifted_state(model, 2, 37))
    if relative:
        assert_logits_close(shifted, base, f"{placement} shifted by 37")
    else:
        assert (shifted - base).abs().max() > 1e-3 * base.abs().max(), f"{placement} should depend on absolute position"


def test_shared_kv_halves_the_cache():
    kw = dict(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, pattern="A", rope_placement="qkvo")
    shared, unshared = model_of(HybridConfig(shared_kv=True, **kw)), model_of(HybridConfig(**kw))
    with torch.no_grad():
        _, s = shared(ids_of(1, 10, 9))
        _, u = unshared(ids_of(1, 10, 9))
    assert 2 * s.nbytes == u.nbytes


@pytest.mark.parametrize("config", PRESET_CONFIGS + RANDOM_CONFIGS[:4], ids=IDS[:8])
def test_gradients_reach_every_parameter(config):
    model = model_of(config).train()
    logits, _ = model(ids_of(2, 12, 10))
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids_of(2, 12, 11).flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"no gradient for {name}"


@pytest.mark.parametrize("config", PRESET_CONFIGS, ids=IDS[:4])
@pytest.mark.parametrize("prefill", ["parallel", "chunked"])
def test_greedy_recurrent_generation_equals_argmax_of_parallel_forwards(config, prefill):
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


def test_sampled_generation_is_reproducible_and_modes_agree():
    model = model_of(PRESET_CONFIGS[3])
    prompt = ids_of(3, 4, 13)
    outs = [
        model.generate(prompt, 10, mode=mode, temperature=0.8, top_k=20, top_p=0.9,
                       generator=torch.Generator().manual_seed(5))
        for mode in ("recurrent", "parallel", "chunked")
    ]
    assert outs[0].shape == (3, 14)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_eos_stops_and_pads():
    model = model_of(PRESET_CONFIGS[2])
    prompt = ids_of(2, 3, 14)
    greedy = model.generate(prompt, 8, temperature=0)
    eos = int(greedy[0, 5])  # a token the first sequence produces
    out = model.generate(prompt, 8, temperature=0, eos_token_id=eos)
    first = (out[0, 3:] == eos).nonzero()[0].item()
    assert (out[0, 3 + first:] == eos).all()
    assert torch.equal(out[:, : 3 + first + 1], greedy[:, : 3 + first + 1])


def test_empty_input_and_zero_new_tokens():
    model = model_of(PRESET_CONFIGS[3])
    logits, state = model(torch.zeros(2, 0, dtype=torch.long))
    assert logits.shape == (2, 0, VOCAB) and state.offset == 0
    prompt = ids_of(2, 3, 15)
    assert torch.equal(model.generate(prompt, 0), prompt)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m: m(torch.zeros(2, 3)), r"input_ids: expected an int64 tensor"),
        (lambda m: m(torch.zeros(3, dtype=torch.long)), r"input_ids: expected shape \(B, T\)"),
        (lambda m: m(torch.full((1, 3), VOCAB)), r"input_ids: expected token ids in \[0, 61\), got values in \[61, 61\]"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), mode="fast"), r"mode: expected one of"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), mode="chunked", chunk_size=0), r"chunk_size: expected a positive int"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), state="s"), r"state: expected a HybridState"),
        (lambda m: m(torch.zeros(1, 3, dtype=torch.long), state=HybridState(layers=[])), r"state: expected 3 layer states, got 0"),
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
        (lambda m: m.step(torch.tensor([VOCAB])), r"token_ids: expected token ids in \[0, 61\), got values in \[61, 61\]"),
        (lambda m: m.step(torch.tensor([-1])), r"token_ids: expected token ids in \[0, 61\), got values in \[-1, -1\]"),
        (lambda m: m.step(torch.tensor([1.0])), r"token_ids: expected an int64 tensor of shape \(B,\), got torch.float32"),
        (lambda m: m.step(torch.zeros(1, 1, dtype=torch.long)), r"token_ids: expected shape \(B,\), got \(1, 1\)"),
        (lambda m: HybridLM({"d_model": 8}), r"config: expected a HybridConfig"),
    ],
)
def test_value_errors(call, match):
    model = model_of(PRESET_CONFIGS[3])
    with pytest.raises(ValueError, match=match):
        call(model)


def test_bfloat16_model_runs_in_every_mode():
    config = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB, dtype="bfloat16")
    model = model_of(config)
    ids = ids_of(1, 9, 16)
    with torch.no_grad():
        p, _ = model(ids)
        r, _ = model(ids, mode="recurrent")
    assert p.dtype == torch.bfloat16 and torch.isfinite(p).all()
    assert (r.float() - p.float()).abs().max() <= 0.05 * p.float().abs().max()


@pytest.mark.parametrize("mode, sampling", [
    ("recurrent", dict()), ("parallel", dict()), ("recurrent", dict(temperature=0)), ("recurrent", dict(top_k=40)),
    ("recurrent", dict(top_p=0.95)), ("recurrent", dict(temperature=2.0, top_k=5, top_p=0.5)),
], ids=["default", "default-parallel", "greedy", "top_k", "top_p", "all"])
def test_generation_never_emits_padding_ids(mode, sampling):
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


def test_sample_next_masks_padding_ids_in_every_path():
    from hybrid.models.sampling import mask_padding, sample_next

    logits = torch.zeros(4, 10)
    logits[:, 7:] = 100.0  # the padding ids would win every draw
    for kwargs in (dict(temperature=0), dict(), dict(top_k=3), dict(top_p=0.9), dict(top_k=2, top_p=0.5)):
        for seed in range(10):
            ids = sample_next(logits, generator=torch.Generator().manual_seed(seed), vocab_limit=7, **kwargs)
            assert int(ids.max()) < 7, kwargs
    assert torch.equal(mask_padding(logits, None), logits) and torch.equal(mask_padding(logits, 10), logits)
