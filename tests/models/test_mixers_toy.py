"""A new mixer is one file and one table row: a toy mixer defined here (its options dataclass and its module, as
docs/extending.md shows) plus one row in the mixer table give a model that runs in every mode, a config section
that round-trips, and the state and recompute choices its options declare."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import pytest
import torch
from torch import nn

import hybrid.models.lm as lm_module
from hybrid.batch_state import TensorState
from hybrid.checks import check_number
from hybrid.kernels.varlen import host_offsets
from hybrid.mixer import Mixer
from hybrid.models import HybridConfig, HybridLM
from hybrid.models.decoding.speculative import draft_from_layers
from hybrid.models.generation import generate
from hybrid.models.mixers import MIXERS, MixerRow

VOCAB = 23


# --------------------------------------------------------------------------- the new file: hybrid/toy.py


@dataclass(frozen=True)
class ToyConfig:
    """The toy's options. decay: how much of the running sum each token keeps, in [0, 1)."""

    decay: float = 0.5

    def __post_init__(self):
        check_number("decay", self.decay, low=0, high=1, high_open=True)

    @property
    def state_grows(self) -> bool:
        return False  # one running sum, whatever the length

    @property
    def cheap_to_recompute(self) -> bool:
        return True  # O(T·d) per call

    def check_with(self, *, n_heads, head_dim, rotary) -> None:
        pass  # no condition on the stack's shape: the toy has no heads and no rotary


@dataclass
class ToyState(TensorState):
    """Batch-first tensors, never written in place: TensorState gives nbytes, clone, cat, select, put, fork and
    rewind (the decode-state API: ragged batches, continuous batching, speculative rollback)."""

    s: torch.Tensor  # (B, d_model): the running sum after the tokens seen


class ToyMixer(Mixer):
    """A decaying running sum: s_t = decay · s_{t−1} + W_in x_t, y_t = W_out s_t."""

    Config = ToyConfig

    def __init__(self, d_model, n_heads, head_dim=None, *, rotary=None, norm_eps=1e-6, config=None, **options):
        super().__init__(d_model, n_heads, head_dim, rotary=rotary, norm_eps=norm_eps, config=config, **options)
        self.in_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)  # scaled by the model's init (Mixer.init_weights)

    def init_state(self, batch_size, device=None, dtype=None) -> ToyState:
        return ToyState(torch.zeros(batch_size, self.d_model, device=device, dtype=dtype))

    def forward(self, x, state=None, *, offset=0, cu_seqlens=None, output_final_state=True):
        """x (B, T, d_model): s = L v + decay^(t+1) s_0 with L[t, j] = decay^(t−j) for j ≤ t (parallel form).
        The toy is position-free: it ignores `offset`, the position of x's first token (an int, or `(B,)` per-row
        positions in a ragged batch)."""
        if cu_seqlens is not None:  # a packed batch (1, total_T, d): each sequence on its own
            bounds = host_offsets(cu_seqlens)  # a tensor, or the model's checked PackedOffsets
            states = state or [None] * (len(bounds) - 1)
            outs = [self(x[:, a:b], st) for (a, b), st in zip(pairwise(bounds), states)]
            return torch.cat([y for y, _ in outs], dim=1), ([st for _, st in outs] if output_final_state else None)
        B, T, _ = x.shape
        s0 = x.new_zeros(B, self.d_model) if state is None else state.s.to(x.dtype)
        t = torch.arange(T, device=x.device)
        gaps = (t[:, None] - t[None, :]).to(x.dtype)  # (T, T)
        L = torch.where(gaps >= 0, self.config.decay ** gaps.clamp_min(0), 0.0)
        s = L @ self.in_proj(x) + (self.config.decay ** (t + 1).to(x.dtype))[:, None] * s0[:, None]  # (B, T, d)
        return self.out_proj(s), (ToyState(s[:, -1]) if output_final_state else None)

    def step(self, x, state=None, offset=0):
        """x (B, d_model): one token (at position `offset`, unused)."""
        s = self.in_proj(x) if state is None else self.config.decay * state.s.to(x.dtype) + self.in_proj(x)
        return self.out_proj(s), ToyState(s)


# --------------------------------------------------------------------------- the new row: models/mixers.py


@pytest.fixture
def toy_row(monkeypatch):
    monkeypatch.setitem(MIXERS, "T", MixerRow("toy", ToyMixer))


def config_of(**overrides) -> HybridConfig:
    fields = dict(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=3, pattern="TRA", dtype="float64")
    return HybridConfig(**{**fields, **overrides})


# --------------------------------------------------------------------------- the checks


def test_a_model_with_the_toy_agrees_across_modes(toy_row):
    torch.manual_seed(0)
    model = HybridLM(config_of(**{"toy.decay": 0.75})).eval()
    assert isinstance(model.blocks[0].mixer, ToyMixer) and model.blocks[0].mixer.config.decay == 0.75
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel, state = model(ids)
        chunked, _ = model(ids, mode="chunked", chunk_size=4)
        recurrent, _ = model(ids, mode="recurrent")
        rest, _ = model(ids[:, 6:], state=model(ids[:, :6])[1])  # continuing a state
    for other in (chunked, recurrent, rest):
        torch.testing.assert_close(other[:, -rest.shape[1]:], parallel[:, -rest.shape[1]:], rtol=1e-10, atol=1e-10)
    assert isinstance(state.layers[0], ToyState) and state.clone().layers[0] is state.layers[0]


def test_its_config_section_round_trips(toy_row):
    config = config_of(toy={"decay": 0.25})
    assert config.toy == ToyConfig(decay=0.25) and config.section("toy") is config.toy
    assert config.to_dict()["toy"] == {"decay": 0.25}
    assert HybridConfig.from_dict(config.to_dict()) == config
    assert config.replace(**{"toy.decay": 0.5}).toy.decay == 0.5
    assert HybridConfig().toy == ToyConfig()  # every table row has a section, filled with defaults
    assert "toy.decay" in HybridConfig.field_names()
    with pytest.raises(ValueError, match=r"^toy.decay: expected a number in \[0, 1\), got 2.0$"):
        config_of(**{"toy.decay": 2.0})
    with pytest.raises(ValueError, match=r"^toy.decay: expected a number in \[0, 1\), got 1.0$"):
        config_of(toy={"decay": 1.0})


def recomputed_mixers(model: HybridLM, monkeypatch) -> list[str]:
    """The mixers whose blocks a training forward runs under activation checkpointing."""
    seen = []
    original = lm_module.checkpoint
    monkeypatch.setattr(lm_module, "checkpoint",
                        lambda block, *a, **k: seen.append(type(block.mixer).__name__) or original(block, *a, **k))
    model.train()(torch.randint(0, VOCAB, (1, 5)), output_final_state=False)
    return seen


def test_state_and_recompute_follow_its_declarations(toy_row, monkeypatch):
    assert config_of(pattern="T").state_is_fixed
    assert not config_of(pattern="TA").state_is_fixed  # global attention grows
    assert config_of(pattern="TA", window=4).state_is_fixed
    model = HybridLM(config_of(pattern="TA", n_layers=2, recompute="linear"))
    assert recomputed_mixers(model, monkeypatch) == ["ToyMixer"]  # cheap to recompute; global attention is not
    monkeypatch.setattr(ToyConfig, "state_grows", property(lambda self: True))
    monkeypatch.setattr(ToyConfig, "cheap_to_recompute", property(lambda self: False))
    assert not config_of(pattern="T").state_is_fixed
    model = HybridLM(config_of(pattern="TA", n_layers=2, recompute="linear", window=4))
    assert recomputed_mixers(model, monkeypatch) == ["Attention"]


def test_the_toy_decodes_ragged_batches_and_speculatively(toy_row):
    """Its state API is all a mixer needs for prompts of any lengths in one batch and for speculative decoding."""
    torch.manual_seed(0)
    model = HybridLM(config_of(pattern="TA", n_layers=4, window=3)).eval()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (1, 5, 3)]
    alone = [generate(model, p[None], 6, temperature=0)[0] for p in prompts]
    assert [t.tolist() for t in generate(model, prompts, 6, temperature=0)] == [a.tolist() for a in alone]
    draft = draft_from_layers(model, 2)
    assert [t.tolist() for t in generate(model, prompts, 6, temperature=0, draft=draft, lookahead=2)] == \
        [a.tolist() for a in alone]
