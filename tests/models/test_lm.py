"""HybridLM: the three modes agree, states continue across every handoff, gradients, one-line errors (its
``generate`` is tested with models/generation.py)."""
from __future__ import annotations

import random

import pytest
import torch

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


def assert_logits_close(actual, expected, what):
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    assert err <= 1e-4 * scale, f"{what}: max error {err:.3g} > 1e-4 × logit scale {scale:.3g}"


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=IDS)
def test_three_modes_agree(config, model_of, ids_of):
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
def test_every_handoff_continues_the_sequence(config, model_of, ids_of):
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


def test_windowed_state_is_fixed_and_global_state_grows(model_of, ids_of):
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
    """A state at position ``offset`` with nothing cached: the same tokens, every position shifted. The position
    is kept once, in the model's state; the layer states are fresh."""
    return HybridState(layers=model.init_state(batch).layers, offset=offset)


@pytest.mark.parametrize("placement,relative", [
    ("qk", True), ("vo", True), ("qkvo", True), ("none", True),
    ("q", False), ("k", False), ("v", False), ("o", False), ("qkv", False),
])
def test_position_shift_through_an_offset_state(placement, relative, model_of, ids_of):
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


def test_shared_kv_halves_the_cache(model_of, ids_of):
    kw = dict(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, pattern="A", rope_placement="qkvo")
    shared, unshared = model_of(HybridConfig(shared_kv=True, **kw)), model_of(HybridConfig(**kw))
    with torch.no_grad():
        _, s = shared(ids_of(1, 10, 9))
        _, u = unshared(ids_of(1, 10, 9))
    assert 2 * s.nbytes == u.nbytes


@pytest.mark.parametrize("config", PRESET_CONFIGS + RANDOM_CONFIGS[:4], ids=IDS[:8])
def test_gradients_reach_every_parameter(config, model_of, ids_of):
    model = model_of(config).train()
    logits, _ = model(ids_of(2, 12, 10))
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids_of(2, 12, 11).flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"no gradient for {name}"


def test_empty_input(model_of):
    model = model_of(PRESET_CONFIGS[3])
    logits, state = model(torch.zeros(2, 0, dtype=torch.long))
    assert logits.shape == (2, 0, VOCAB) and state.offset == 0


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
        (lambda m: m.step(torch.tensor([VOCAB])), r"token_ids: expected token ids in \[0, 61\), got values in \[61, 61\]"),
        (lambda m: m.step(torch.tensor([-1])), r"token_ids: expected token ids in \[0, 61\), got values in \[-1, -1\]"),
        (lambda m: m.step(torch.tensor([1.0])), r"token_ids: expected an int64 tensor of shape \(B,\), got torch.float32"),
        (lambda m: m.step(torch.zeros(1, 1, dtype=torch.long)), r"token_ids: expected shape \(B,\), got \(1, 1\)"),
        (lambda m: HybridLM({"d_model": 8}), r"config: expected a HybridConfig"),
    ],
)
def test_value_errors(call, match, model_of):
    model = model_of(PRESET_CONFIGS[3])
    with pytest.raises(ValueError, match=match):
        call(model)


def test_bfloat16_model_runs_in_every_mode(model_of, ids_of):
    config = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB, dtype="bfloat16")
    model = model_of(config)
    ids = ids_of(1, 9, 16)
    with torch.no_grad():
        p, _ = model(ids)
        r, _ = model(ids, mode="recurrent")
    assert p.dtype == torch.bfloat16 and torch.isfinite(p).all()
    assert (r.float() - p.float()).abs().max() <= 0.05 * p.float().abs().max()
