"""Absolute position embeddings: the table, the config fields, and HybridLM's three modes with offsets."""
from __future__ import annotations

import math

import pytest
import torch

from hybrid.abs_pos import AbsolutePositions, sinusoidal_table
from hybrid.models import HybridConfig, HybridLM

VOCAB = 37


def config_of(abs_pos, pattern="RMA", **kw):
    return HybridConfig(vocab_size=VOCAB, d_model=18, n_heads=3, n_layers=3, pattern=pattern, window=5,
                        abs_pos=abs_pos, abs_pos_max_len=40 if abs_pos == "learned" else None, **kw)


def test_sinusoidal_table_is_vaswanis_formula():
    d, positions = 10, torch.tensor([0, 1, 7, 1000, 123457])
    table = sinusoidal_table(positions, d)
    for row, p in zip(table, positions.tolist()):
        for i in range(d // 2):
            w = 10000.0 ** (-2 * i / d)
            assert row[2 * i].item() == pytest.approx(math.sin(p * w), rel=1e-12, abs=1e-12)
            assert row[2 * i + 1].item() == pytest.approx(math.cos(p * w), rel=1e-12, abs=1e-12)


def test_sinusoids_have_the_token_embeddings_scale():
    config = config_of("sinusoidal")
    model = HybridLM(config)
    pos = model.abs_pos(0, 4096)
    rms = pos.pow(2).mean().sqrt().item()
    assert rms == pytest.approx(config.init_std, rel=0.02)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_three_modes_agree_and_positions_matter(kind):
    torch.manual_seed(0)
    model = HybridLM(config_of(kind)).eval()
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        parallel, _ = model(ids)
        chunked, _ = model(ids, mode="chunked", chunk_size=5)
        recurrent, _ = model(ids, mode="recurrent")
        head, state = model(ids[:, :9])  # parallel prefix, then a recurrent continuation at offset 9
        tail, _ = model(ids[:, 9:], mode="recurrent", state=state)
        no_pos = HybridLM(config_of(None))
        no_pos.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("abs_pos")})
        without, _ = no_pos.eval()(ids)
    scale = parallel.abs().max().item()
    for name, got in (("chunked", chunked), ("recurrent", recurrent), ("handoff", torch.cat([head, tail], 1))):
        err = (got - parallel).abs().max().item()
        assert err <= 1e-5 * scale, f"{name} vs parallel: {err:.3g}"
    assert (without - parallel).abs().max().item() > 1e-3 * scale  # the positions change the logits


def test_learned_positions_are_added_at_their_offsets():
    torch.manual_seed(1)
    model = HybridLM(config_of("learned", pattern="R"))
    ids = torch.randint(0, VOCAB, (1, 6))
    expected = model.embed(ids) + model.abs_pos.table.weight[10:16]
    _, state = model(torch.zeros(1, 10, dtype=torch.long))  # a state at offset 10
    seen = []  # what the first block receives: the embeddings plus positions 10 … 15
    hook = model.blocks[0].register_forward_pre_hook(lambda block, args: seen.append(args[0].detach()))
    model(ids, state=state)
    hook.remove()
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=0)


def test_learned_positions_stop_at_their_table():
    model = HybridLM(config_of("learned"))
    model(torch.zeros(1, 40, dtype=torch.long))  # the whole table
    with pytest.raises(ValueError, match=r"positions: learned absolute positions cover 0 … 39 .* up to 40"):
        model(torch.zeros(1, 41, dtype=torch.long))
    _, state = model(torch.zeros(1, 39, dtype=torch.long))
    with pytest.raises(ValueError, match="up to 40"):
        model.step(torch.zeros(1, dtype=torch.long), model.step(torch.zeros(1, dtype=torch.long), state)[1])


def test_parameter_counts_leave_out_the_position_table():
    learned, none = HybridLM(config_of("learned")), HybridLM(config_of(None))
    assert learned.num_parameters() == none.num_parameters() + 40 * 18
    assert learned.num_parameters(exclude_embeddings=True) == none.num_parameters(exclude_embeddings=True)
    assert HybridLM(config_of("sinusoidal")).num_parameters() == none.num_parameters()


@pytest.mark.parametrize("fields, message", [
    (dict(abs_pos="alibi"), r"abs_pos: expected None or one of \('learned', 'sinusoidal'\), got 'alibi'"),
    (dict(abs_pos="learned"), "abs_pos_max_len: abs_pos='learned' needs the table length"),
    (dict(abs_pos="learned", abs_pos_max_len=0), "abs_pos_max_len: expected a positive int, got 0"),
    (dict(abs_pos="sinusoidal", abs_pos_max_len=64), "abs_pos_max_len: only abs_pos='learned' has a table length"),
    (dict(abs_pos_max_len=64), "abs_pos_max_len: only abs_pos='learned'"),
])
def test_config_checks(fields, message):
    with pytest.raises(ValueError, match=message):
        HybridConfig(**fields)


def test_config_round_trip_and_limit():
    config = HybridConfig(abs_pos="learned", abs_pos_max_len=128)
    assert HybridConfig.from_dict(config.to_dict()) == config
    assert config.max_positions == 128
    assert HybridConfig(abs_pos="sinusoidal").max_positions is None
    with pytest.raises(ValueError, match="max_len: sinusoids have no length limit"):
        AbsolutePositions("sinusoidal", 8, max_len=3)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_vectors_at_positions_are_the_tables_rows(kind):
    """``at``: a ragged batch's positions, one a row, give the rows of ``forward``'s table (no host read off the
    CPU); past a learned table's end, the one-line error."""
    pos = AbsolutePositions(kind, 6, max_len=40 if kind == "learned" else None, scale=0.3)
    positions = torch.tensor([0, 17, 3, 39, 17])
    assert torch.equal(pos.at(positions), pos(0, 40)[positions])
    if kind == "learned":
        with pytest.raises(ValueError, match=r"^positions: learned absolute positions cover 0 … 39 \(abs_pos_max_len\), "
                                             r"got positions up to 40$"):
            pos.at(torch.tensor([2, 40]))
