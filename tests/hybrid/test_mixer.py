"""The mixer contract (hybrid/mixer.py): one constructor, forward/step/init_state signature for every mixer, options
resolved and checked once, the declarations the model reads, the caller's position (`check_offset`), the init hook."""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from hybrid import (Attention, AttentionConfig, AttentionState, GLAConfig, GLAState, MultiScaleRetention,
                    RecurrenceConfig, RecurrenceState, RetentionConfig, RetentionState, RotaryConfig,
                    VOGatedLinearAttention, VORecurrence)
from hybrid.mixer import FixedStateOptions, Mixer, MixerState, check_offset, resolve_config

MIXERS = [VORecurrence, Attention, MultiScaleRetention, VOGatedLinearAttention]


@pytest.mark.parametrize("cls", MIXERS)
def test_init_state_signature_is_common(cls):
    params = list(inspect.signature(cls.init_state).parameters.values())
    assert [(p.name, p.default) for p in params] == [
        ("self", inspect.Parameter.empty), ("batch_size", inspect.Parameter.empty), ("device", None), ("dtype", None)]


@pytest.mark.parametrize("cls", MIXERS)
def test_constructor_is_common(cls):
    params = list(inspect.signature(cls.__init__).parameters.values())[:7]
    positional, keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    assert [(p.name, p.kind) for p in params] == [
        ("self", positional), ("d_model", positional), ("n_heads", positional), ("head_dim", positional),
        ("rotary", keyword), ("norm_eps", keyword), ("config", keyword)]
    config = cls.Config()
    assert cls(16, 2, config=config).config is config
    assert cls(16, 2).config == config  # options default to the Config's defaults
    with pytest.raises(ValueError, match=r"config: expected either config or options \['bogus'\], got both"):
        cls(16, 2, config=config, bogus=1)
    with pytest.raises(ValueError, match=r"bogus: expected an option of .*Config"):
        cls(16, 2, bogus=1)
    with pytest.raises(ValueError, match=r"rotary: expected a RotaryConfig or None, got dict"):
        cls(16, 2, rotary={"base": 500.0})


@pytest.mark.parametrize("cls", MIXERS)
def test_forward_and_step_take_the_position_from_the_caller(cls):
    """forward(x, state=None, *, offset=0, cu_seqlens=None, output_final_state=True, shard=None), step(x, state=None,
    offset=0): the caller keeps the position (HybridState.offset) and passes it; no state holds one. (shard: the
    context-parallel path, whose shard holds the positions.)"""
    empty, positional, keyword = (inspect.Parameter.empty, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  inspect.Parameter.KEYWORD_ONLY)
    forward = inspect.signature(cls.forward).parameters.values()
    assert [(p.name, p.kind, p.default) for p in forward][1:] == [
        ("x", positional, empty), ("state", positional, None), ("offset", keyword, 0), ("cu_seqlens", keyword, None),
        ("output_final_state", keyword, True), ("shard", keyword, None)]
    step = inspect.signature(cls.step).parameters.values()
    assert [(p.name, p.default) for p in step][1:] == [("x", empty), ("state", None), ("offset", 0)]
    state_cls = {VORecurrence: RecurrenceState, Attention: AttentionState, MultiScaleRetention: RetentionState,
                 VOGatedLinearAttention: GLAState}[cls]
    assert "offset" not in {f.name for f in dataclasses.fields(state_cls)}


def test_options_declare_what_the_model_needs():
    """state_grows: only global attention; cheap_to_recompute: R, M and windowed attention."""
    cases = [(RecurrenceConfig(), False, True), (RetentionConfig(), False, True), (GLAConfig(), False, True),
             (AttentionConfig(), True, False), (AttentionConfig(window=8), False, True)]
    for options, grows, cheap in cases:
        assert (options.state_grows, options.cheap_to_recompute) == (grows, cheap), options
    assert issubclass(RecurrenceConfig, FixedStateOptions) and issubclass(RetentionConfig, FixedStateOptions)
    assert (FixedStateOptions.state_grows, FixedStateOptions.cheap_to_recompute) == (False, True)


def test_a_float64_input_to_float32_weights_is_one_line():
    """Either convert the module (float64 runs, for reference checks) or get a one-line error naming x."""
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for mixer in (VORecurrence(16, 2), Attention(16, 2), MultiScaleRetention(16, 2), VOGatedLinearAttention(16, 2)):
        with pytest.raises(ValueError, match=r"^x: expected dtype float32 \(the module's parameters; .*got float64$"):
            mixer(x, None)
        with pytest.raises(ValueError, match=r"^x: expected dtype float32"):
            mixer.step(x[:, 0], None)
        y, _ = mixer.double()(x, None)
        assert y.dtype == torch.float64
    with pytest.raises(ValueError, match=r"^base: expected a number > 1, got 0.5$"):
        VORecurrence(16, 2, rotary=RotaryConfig(base=0.5))


@pytest.mark.parametrize("cls", MIXERS)
def test_states_follow_the_protocol(cls):
    """Every mixer's state has nbytes, clone() and cat; a plain object does not pass for one."""
    mixer = cls(16, 2)
    _, state = mixer(torch.randn(3, 4, 16))
    assert isinstance(state, MixerState) and state.nbytes > 0
    assert type(state).cat([state.clone(), state]).nbytes == 2 * state.nbytes
    assert not isinstance(object(), MixerState)


# ------------------------------------------------------------------------------------------ check_offset


def test_check_offset_takes_a_position_or_one_per_sequence():
    assert check_offset(0) == 0 and check_offset(7) == 7 and check_offset(np.int64(3)) == 3
    assert check_offset(0, 3) == [0, 0, 0]  # 0: every packed sequence fresh
    assert check_offset([4, 0, 2], 3) == [4, 0, 2] and check_offset((1, 2), 2) == [1, 2]


@pytest.mark.parametrize("offset,n,match", [
    (-1, None, r"^offset: expected an int >= 0, got -1$"),
    (True, None, r"^offset: expected an int >= 0, got True$"),
    (1.0, None, r"^offset: expected an int >= 0, got 1.0$"),
    (2, 3, r"^offset: expected 0 or a list of N=3 positions with cu_seqlens, got 2$"),
    ([1, 2], 3, r"^offset: expected 0 or a list of N=3 positions with cu_seqlens, got a list of 2$"),
    ([1, -2], 2, r"^offset: expected an int >= 0, got -2$"),
])
def test_check_offset_errors(offset, n, match):
    with pytest.raises(ValueError, match=match):
        check_offset(offset, n)


# ------------------------------------------------------------------------------ resolve_config and Mixer


CHECKED = []  # the (n_heads, head_dim, rotary) each Plain.Config.check_with saw


@dataclass(frozen=True)
class PlainConfig(FixedStateOptions):
    width: int = 3

    def check_with(self, *, n_heads: int, head_dim: int, rotary: RotaryConfig) -> None:
        CHECKED.append((n_heads, head_dim, rotary))


class Plain(Mixer):
    """The least a mixer is: a Config, and an `out_proj` for the init hook."""

    Config = PlainConfig

    def __init__(self, d_model, n_heads, head_dim=None, **kw):
        super().__init__(d_model, n_heads, head_dim, **kw)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)


def test_resolve_config_takes_a_config_or_its_fields():
    config = PlainConfig(width=5)
    assert resolve_config(PlainConfig, config, {}) is config
    assert resolve_config(PlainConfig, None, {"width": 7}) == PlainConfig(width=7)
    assert resolve_config(PlainConfig, None, {}) == PlainConfig()
    with pytest.raises(ValueError, match=r"^config: expected either config or options \['width'\], got both$"):
        resolve_config(PlainConfig, config, {"width": 7})
    with pytest.raises(ValueError, match=r"^config: expected a PlainConfig, got AttentionConfig$"):
        resolve_config(PlainConfig, AttentionConfig(), {})
    with pytest.raises(ValueError, match=r"^depth: expected an option of PlainConfig \(one of \['width'\]\), got an "
                                         r"unknown name$"):
        resolve_config(PlainConfig, None, {"depth": 2})


def test_the_base_resolves_checks_and_holds_the_shape():
    CHECKED.clear()
    rotary = RotaryConfig(base=500.0)
    m = Plain(12, 3, rotary=rotary, norm_eps=1e-5, width=4)
    assert (m.d_model, m.n_heads, m.head_dim, m.norm_eps) == (12, 3, 4, 1e-5)
    assert m.config == PlainConfig(width=4) and m.rotary_config is rotary
    assert CHECKED == [(3, 4, rotary)]  # the options checked once, against the stack's shape
    assert Plain(12, 3, head_dim=6).head_dim == 6 and Plain(12, 3).rotary_config == RotaryConfig()
    assert [name for name, _ in Plain(12, 3).named_parameters()] == ["out_proj.weight"]  # the base adds none
    for kw, match in ((dict(d_model=12, n_heads=5), r"^n_heads: expected a divisor of d_model=12"),
                      (dict(d_model=12, n_heads=3, norm_eps=-1.0), r"^norm_eps: expected a number >= 0, got -1.0$"),
                      (dict(d_model=12, n_heads=3, rotary="rope"),
                       r"^rotary: expected a RotaryConfig or None, got str$")):
        with pytest.raises(ValueError, match=match):
            Plain(**kw)


def test_init_weights_draws_the_output_projection_from_depth_std():
    torch.manual_seed(0)
    m = Plain(256, 4)
    m.init_weights(std=0.02, depth_std=0.0)
    assert not m.out_proj.weight.any()
    m.init_weights(std=0.02, depth_std=0.5)
    assert abs(m.out_proj.weight.std().item() - 0.5) < 0.01 and abs(m.out_proj.weight.mean().item()) < 0.01
