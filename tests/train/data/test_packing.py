"""The loader's packed offsets reach the model with their host values, so an eager step reads nothing back."""
import pytest
import torch

import hybrid.kernels.varlen as varlen
from hybrid.models import HybridConfig, HybridLM
from hybrid.train.data.packing import pack_documents, packed_on_device

EOS = 0


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, 40, (3, 23), generator=g)
    x[0, 5], x[1, 1], x[1, 17], x[2, 22] = EOS, EOS, EOS, EOS  # documents starting inside the windows
    return pack_documents(x, x.roll(-1, 1), EOS)


def test_eager_offsets_carry_their_host_values():
    _, _, cu = _batch(0)
    packed = packed_on_device(cu, torch.device("cpu"), compiled=False)
    assert isinstance(packed, varlen.PackedOffsets)
    assert packed.bounds == tuple(cu.tolist())
    assert packed.max_len == int((cu[1:] - cu[:-1]).max())
    assert torch.equal(packed.cu_seqlens, cu) and packed.cu_seqlens.dtype == torch.int64


def test_compiled_offsets_stay_a_tensor():
    """A host tuple would be a guard of the compiled graph that changes with every batch."""
    _, _, cu = _batch(1)
    out = packed_on_device(cu, torch.device("cpu"), compiled=True)
    assert isinstance(out, torch.Tensor) and torch.equal(out, cu)


def test_compiled_offsets_are_dynamic_in_their_count(graph_recorder):
    """The trainer's offsets make one graph serve every document count N: the first compile is already dynamic in
    N, so a batch with another N does not recompile (unmarked, the second call would: automatic dynamic shapes)."""
    torch.compiler.reset()
    counting = graph_recorder()
    graphs = counting.graphs

    lengths = torch.compile(lambda cu: cu[1:] - cu[:-1], backend=counting)
    for cu in (torch.tensor([0, 3, 9, 12]), torch.tensor([0, 1, 2, 7, 10, 12])):
        out = lengths(packed_on_device(cu, torch.device("cpu"), compiled=True))
        assert torch.equal(out, cu.diff())
    assert len(graphs) == 1
    torch.compiler.reset()


def test_model_reads_no_offsets_back_and_computes_the_same(monkeypatch):
    torch.manual_seed(0)
    model = HybridLM(HybridConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=3, pattern="RAM", window=4,
                                  init_std=0.5)).double().eval()
    x, _, cu = _batch(2)
    want, _ = model(x, cu_seqlens=cu, output_final_state=False)
    packed = packed_on_device(cu, torch.device("cpu"), compiled=False)

    def read_back(*args, **kwargs):
        raise AssertionError("the offsets were read back from the device")

    monkeypatch.setattr(varlen, "_checked", read_back)
    got, _ = model(x, cu_seqlens=packed, output_final_state=False)
    assert torch.equal(got, want)
    with pytest.raises(AssertionError, match="read back"):
        model(x, cu_seqlens=cu, output_final_state=False)  # the patch does catch a plain tensor's check
