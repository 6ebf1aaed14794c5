"""`HybridLM.forward(ids, shard=…)` in one process: the one-rank shard gives the plain forward's logits, and what
has no context-parallel path is refused in one line. (The ranks' numbers: tests/kernels/context_parallel.)"""
import pytest
import torch

from hybrid.kernels.context_parallel import shard_sequence
from hybrid.mixer import Mixer
from hybrid.models import HybridConfig, HybridLM

CONFIG = dict(vocab_size=40, d_model=16, n_layers=3, n_heads=2)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return HybridLM(HybridConfig.preset("hybrid", "tiny", window=5, **CONFIG))


@pytest.mark.parametrize("cu", [None, [0, 3, 9, 10, 14]])
def test_one_rank_shard_is_the_plain_forward(model, cu, one_torch_thread):
    cu = None if cu is None else torch.tensor(cu)
    ids = torch.randint(0, 40, (1 if cu is not None else 2, 14))
    want, _ = model(ids, cu_seqlens=cu, output_final_state=False)
    got, state = model(ids, shard=shard_sequence(14, cu_seqlens=cu), output_final_state=False)
    assert state is None and torch.equal(got, want)


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="chunked"), r"mode: expected 'parallel' with shard= \(context parallelism\), got 'chunked'"),
    (dict(chunk_size=4), r"chunk_size: expected None with shard= \(the parallel mode\), got 4"),
    (dict(output_final_state=True), r"output_final_state: expected False with shard="),
    (dict(cu_seqlens=torch.tensor([0, 14])), r"cu_seqlens: expected None with shard= \(the shard holds"),
])
def test_refused_calls(model, kwargs, message):
    kwargs = {"output_final_state": False, **kwargs}
    with pytest.raises(ValueError, match="^" + message):
        model(torch.zeros(2, 14, dtype=torch.long), shard=shard_sequence(14), **kwargs)


def test_refused_state_and_shape(model):
    with pytest.raises(ValueError, match=r"^state: expected None with shard= \(each sequence starts fresh\), "
                                         r"got HybridState$"):
        model(torch.zeros(2, 14, dtype=torch.long), state=model.init_state(2), shard=shard_sequence(14),
              output_final_state=False)
    packed = shard_sequence(14, cu_seqlens=torch.tensor([0, 5, 14]))
    with pytest.raises(ValueError, match=r"^input_ids: expected this rank's shard of shape \(1, 14\) "):
        model(torch.zeros(2, 14, dtype=torch.long), shard=packed, output_final_state=False)


def test_a_mixer_without_a_context_parallel_path_is_refused(model, monkeypatch):
    mixer = model.blocks[1].mixer
    monkeypatch.setattr(mixer, "check_shard", lambda: Mixer.check_shard(mixer))
    with pytest.raises(ValueError, match=r"^shard: expected a mixer with a context-parallel path, got VORecurrence"):
        model(torch.zeros(2, 14, dtype=torch.long), shard=shard_sequence(14), output_final_state=False)


def test_a_length_dependent_rotary_scaling_is_refused():
    config = HybridConfig.preset("transformer", "tiny", rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                                      "original_max_position_embeddings": 8},
                                 **CONFIG)
    with pytest.raises(ValueError, match=r"^rotary.scaling: expected a schedule that does not depend on the "
                                         r"sequence length with shard="):
        HybridLM(config)(torch.zeros(1, 14, dtype=torch.long), shard=shard_sequence(14), output_final_state=False)


def test_mixer_level_refusals():
    from hybrid import VORecurrence
    layer = VORecurrence(16, 2)
    x = torch.zeros(1, 6, 16)
    with pytest.raises(ValueError, match=r"^output_final_state: expected False with shard="):
        layer(x, shard=shard_sequence(6))
    with pytest.raises(ValueError, match=r"^state: expected None with shard="):
        layer(x, layer.init_state(1), shard=shard_sequence(6), output_final_state=False)
