"""A model built on the meta device: ``to_empty`` and a state dict give the same numbers as the model it came from,
and ``init_weights()`` draws the same values as the constructor under the same seed."""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM

LONGROPE = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 16, "long_factor": [1.5 + 0.125 * i for i in range(16)]}

# every preset, and each option that holds a parameter or a buffer outside nn.Linear / nn.Embedding
CONFIGS = {
    "hybrid": ("hybrid", {}),
    "transformer": ("transformer", {}),
    "retnet": ("retnet", {}),
    "vo-rnn": ("vo-rnn", {}),
    "vo-gla": ("vo-gla", {}),
    "selective-hard": ("hybrid", {"recurrence.selective": True, "recurrence.selective_gate": "hardsigmoid"}),
    "learned-phase": ("vo-rnn", {"recurrence.phase": "learned", "recurrence.rotary_dim": 8}),
    "data-phase": ("vo-rnn", {"recurrence.phase": "data", "recurrence.phase_map": "real-sign"}),
    "carope": ("hybrid", {"rotary.carope": True}),
    "gla-static-learned": ("vo-gla", {"gla.decay": "static", "gla.phase": "learned", "gla.output_norm": False}),
    "gla-hard-data": ("vo-gla", {"gla.gate": "hardsigmoid", "gla.phase": "data"}),
    "longrope-untied": ("transformer", {"rotary.scaling": LONGROPE, "tie_embeddings": False}),
    "learned-positions": ("transformer", {"attention.placement": "none", "abs_pos": "learned",
                                          "abs_pos_max_len": 128}),
}


def config_of(name: str, **extra) -> HybridConfig:
    preset, overrides = CONFIGS[name]
    return HybridConfig.preset(preset, "tiny", **overrides, **extra)


def built_on_meta(config: HybridConfig) -> HybridLM:
    with torch.device("meta"):
        model = HybridLM(config)
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    return model.to_empty(device="cpu")


@pytest.mark.parametrize("name", CONFIGS)
def test_init_weights_after_meta_draws_what_the_constructor_draws(name):
    config = config_of(name)
    torch.manual_seed(11)
    direct = HybridLM(config)
    model = built_on_meta(config)
    torch.manual_seed(11)
    model.init_weights()
    expected = {**dict(direct.named_parameters()), **dict(direct.named_buffers())}
    got = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    if config.tie_embeddings:
        assert model.lm_head.weight is model.embed.weight
    ids = torch.randint(0, config.vocab_size, (2, 37))
    torch.testing.assert_close(model(ids)[0], direct(ids)[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["hybrid", "transformer", "vo-gla", "data-phase", "longrope-untied"])
def test_a_state_dict_loaded_after_meta_computes_as_its_source(name):
    """The buffers computed from the config (rotary frequencies, the schedule's angles) are in no state dict:
    ``to_empty`` writes them back."""
    config = config_of(name)
    torch.manual_seed(3)
    source = HybridLM(config).double()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the init, so a re-initialised parameter shows
    model = built_on_meta(config.replace(dtype="float64"))
    model.load_state_dict(source.state_dict())
    ids = torch.randint(0, config.vocab_size, (2, 150))  # past the longrope threshold (64)
    expected, state = source(ids)
    got, got_state = model(ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    step = torch.randint(0, config.vocab_size, (2, 1))
    torch.testing.assert_close(model(step, mode="recurrent", state=got_state)[0],
                               source(step, mode="recurrent", state=state)[0], rtol=0, atol=0)


def test_init_weights_after_meta_in_bfloat16_draws_what_the_constructor_draws():
    """A config's dtype: the constructor draws in float32 and casts; ``init_weights`` draws into the bfloat16
    parameters. Equal within bfloat16's rounding of the same draws, and the float32 buffers' values exact."""
    config = config_of("hybrid", dtype="bfloat16")
    torch.manual_seed(5)
    direct = HybridLM(config)
    model = built_on_meta(config)
    torch.manual_seed(5)
    model.init_weights()
    for (name, p), q in zip(direct.named_parameters(), model.parameters()):
        assert q.dtype == torch.bfloat16, name
        torch.testing.assert_close(q.float(), p.float(), rtol=2 ** -8, atol=0, msg=name)
    for (name, b), c in zip(direct.named_buffers(), model.buffers()):
        assert torch.equal(c, b), name


@pytest.mark.parametrize("name", ["vo-rnn", "vo-gla", "data-phase"])
def test_a_cast_to_bfloat16_and_back_leaves_the_computed_buffers_exact(name):
    """The schedule's angles came back from bfloat16 rounded (the R layers' scan then turned by other angles); now
    every cast writes them back from the host."""
    config = config_of(name)
    torch.manual_seed(2)
    model = HybridLM(config)
    before = {key: b.clone() for key, b in model.named_buffers()}
    model.to(torch.bfloat16).to(torch.float32)
    for key, b in model.named_buffers():
        assert b.dtype == before[key].dtype and torch.equal(b, before[key]), key


@pytest.mark.parametrize("name", CONFIGS)
def test_every_buffer_outside_the_state_dict_is_one_the_layers_write_back(name):
    """A non-persistent buffer registered any other way would be left uninitialised by ``to_empty`` (and so by
    every checkpoint load, which builds on the meta device: ``train/loop/saved_model.py``)."""
    model = HybridLM(config_of(name))
    outside = {key for key, _ in model.named_buffers()} - set(model.state_dict())
    written_back = {f"{prefix}.{key}" if prefix else key for prefix, module in model.named_modules()
                    for key in module.__dict__.get("_computed_buffers", {})}
    assert outside == written_back
