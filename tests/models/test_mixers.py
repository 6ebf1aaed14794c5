"""The mixer table (models/mixers.py): one row per pattern letter, building its class from its config section; the
mixers it builds continue packed sequences at one offset each."""
from __future__ import annotations

import pytest
import torch

from hybrid import Attention, MultiScaleRetention, VOGatedLinearAttention, VORecurrence
from hybrid.models import HybridConfig
from hybrid.models.mixers import MIXERS, build_mixer, mixer_row

VOCAB = 37


def test_one_row_per_letter_builds_its_class():
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=3, pattern="RAM", window=4,
                          rope_placement="qkvo", n_kv_heads=1)
    expected = {"R": ("recurrence", VORecurrence), "A": ("attention", Attention),
                "M": ("retention", MultiScaleRetention), "G": ("gla", VOGatedLinearAttention)}
    assert set(MIXERS) == set(expected)
    for letter, (name, cls) in expected.items():
        mixer = build_mixer(config, letter)
        assert type(mixer) is cls and (MIXERS[letter].name, MIXERS[letter].cls) == (name, cls)
        assert mixer.config is config.section(name) and isinstance(mixer.config, cls.Config)
        assert mixer.rotary_config is config.rotary
    attn = build_mixer(config, "A")
    assert (attn.window, attn.n_kv_heads, attn.placement.name) == (4, 1, "qkvo")  # the config reaches the mixer
    with pytest.raises(ValueError, match=r"pattern: expected a mixer letter from \['A', 'G', 'M', 'R'\], got 'X'"):
        build_mixer(config, "X")
    assert all(mixer_row(letter) is row for letter, row in MIXERS.items())
    with pytest.raises(ValueError, match=r"^pattern: expected a mixer letter from \['A', 'G', 'M', 'R'\], got 'r'$"):
        mixer_row("r")


@pytest.mark.parametrize("letter", list(MIXERS))
def test_packed_continuations_take_one_offset_per_sequence(letter):
    """With cu_seqlens, offset is a list of per-sequence positions: packed continuations equal separate ones."""
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=1, pattern=letter, window=4)
    torch.manual_seed(0)
    mixer = build_mixer(config, letter).double()
    g = torch.Generator().manual_seed(1)
    heads = [torch.randn(1, n, 12, generator=g, dtype=torch.float64) for n in (5, 3)]
    tails = [torch.randn(1, n, 12, generator=g, dtype=torch.float64) for n in (2, 4)]
    states = [mixer(h)[1] for h in heads]
    want = [mixer(t, s.clone(), offset=h.shape[1])[0] for h, t, s in zip(heads, tails, states)]
    got, _ = mixer(torch.cat(tails, 1), states, offset=[5, 3], cu_seqlens=torch.tensor([0, 2, 6]))
    torch.testing.assert_close(got, torch.cat(want, 1), rtol=1e-6, atol=1e-6)  # float32 cos/sin tables
