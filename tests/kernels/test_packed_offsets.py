"""The op contract's packed offsets, checked once: ``PackedOffsets`` (hybrid.kernels.varlen) carries a batch's offsets
on the device and on the host from where the model checks them to every layer and op, which take it as it is; the
references are drop-ins for their ops (the same arguments); the decay has one name in every op."""
import pytest
import torch

from hybrid.kernels import (complex_scan, complex_scan_reference, retention_chunkwise, retention_reference, vo_gla,
                            vo_gla_reference)
from hybrid.kernels.varlen import PackedOffsets, packed_offsets, whole_rows
from hybrid.models import HybridConfig, HybridLM

CU = [0, 5, 6, 29]  # a document of one token, and offsets off every power of two


@pytest.fixture
def reads(monkeypatch):
    """Counts the device-to-host reads of a tensor's values (``tolist``, ``item``) while a test runs."""
    counted = {"n": 0}
    for name in ("tolist", "item"):
        real = getattr(torch.Tensor, name)

        def counting(self, *args, _real=real, **kwargs):
            counted["n"] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counted


@pytest.mark.parametrize("pattern", ["RRAM", "GGAM"])
def test_a_training_step_reads_the_offsets_back_once(reads, one_torch_thread, pattern):
    """Every mixer (R with its conv and scan, windowed A, M, G with its conv and chunk grid) and the model take the
    offsets checked once where the model receives the batch: one read back in a training step's forward and
    backward, whatever the depth."""
    config = HybridConfig(vocab_size=40, d_model=16, n_layers=6, n_heads=2, pattern=pattern, window=4,
                          tie_embeddings=False, **{"gla.tile_size": 4})
    torch.manual_seed(0)
    model = HybridLM(config).train()
    ids = torch.randint(0, 40, (1, CU[-1]))
    cu = torch.tensor(CU)
    reads["n"] = 0
    logits, _ = model(ids, cu_seqlens=cu, output_final_state=False)
    logits.square().mean().backward()
    assert reads["n"] == 1
    reads["n"] = 0
    checked = packed_offsets(cu, CU[-1], ids.device, batch=1)
    assert reads["n"] == 1 and checked.bounds == tuple(CU) and checked.max_len == 23
    again, _ = model(ids, cu_seqlens=checked, output_final_state=False)
    assert reads["n"] == 1  # already checked: nothing more is read
    assert torch.equal(again, logits)


def test_checked_offsets_give_the_ops_the_same_numbers(one_torch_thread):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, CU[-1], 3, 6, generator=g, dtype=torch.float64)
    ld = -torch.rand(1, CU[-1], 3, 3, generator=g, dtype=torch.float64)
    th = torch.randn(1, CU[-1], 3, 3, generator=g, dtype=torch.float64)
    s0 = torch.randn(3, 3, 6, generator=g, dtype=torch.float64)
    cu = torch.tensor(CU)
    checked = packed_offsets(cu, CU[-1], x.device)
    for backend in ("torch", "cpu", "reference"):
        a = complex_scan(x, ld, th, s0, output_final_state=True, cu_seqlens=cu, backend=backend)
        b = complex_scan(x, ld, th, s0, output_final_state=True, cu_seqlens=checked, backend=backend)
        assert all(torch.equal(p, q) for p, q in zip(a, b)), backend


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_vo_gla_takes_checked_offsets_and_reads_nothing_back(reads, one_torch_thread, backend):
    """vo_gla given a ``PackedOffsets``: the numbers and gradients of the tensor, and its chunk grid laid out from the
    host copy (tiles of 4 over documents of 5, 1 and 23 tokens), so no value is read back (a sync per G layer on a
    GPU before)."""
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(1, CU[-1], 2, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(1, CU[-1], 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    ld = (-torch.rand(1, CU[-1], 2, generator=g, dtype=torch.float64)).requires_grad_()
    th = torch.randn(1, CU[-1], 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    s0 = torch.randn(3, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor(CU)
    checked = packed_offsets(cu, CU[-1], q.device, batch=1)
    outs = []
    for offsets in (cu, checked):
        reads["n"] = 0
        o, final = vo_gla(q, k, v, ld, th, s0, output_final_state=True, cu_seqlens=offsets, tile_size=4,
                          backend=backend, check_values=False)
        if offsets is checked:
            assert reads["n"] == 0
        outs.append((o, final, *torch.autograd.grad(o.sin().sum() + final.square().sum(), (q, k, v, ld, th, s0))))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    want = vo_gla_reference(q, k, v, ld, th, s0, output_final_state=True, cu_seqlens=cu)
    for a, b in zip(outs[1][:2], want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_one_sequence_per_row_offsets_are_made_on_the_device():
    """The unpacked retention and G ops lay out one sequence per row from ``[0, T]`` made by a kernel (a list
    copied to a GPU waits for the stream)."""
    for T in (1, 2, 37):
        assert torch.equal(whole_rows(T, "cpu"), torch.tensor([0, T]))


def test_offsets_of_another_batch_are_refused_in_one_line():
    checked = PackedOffsets.from_bounds([0, 3, 7], device="cpu")
    x = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected offsets of 8 tokens on cpu, got offsets of 7 on cpu$"):
        complex_scan(x, torch.zeros(2, 2), torch.zeros(2, 2), cu_seqlens=checked)


def test_the_scan_reference_is_a_drop_in_for_the_op(one_torch_thread):
    """``complex_scan_reference`` takes ``initial_state``, ``output_final_state`` and ``cu_seqlens`` as the op does,
    and gives its numbers (float64, packed, with initial states, gradients included)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, CU[-1], 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    ld = (-torch.rand(1, CU[-1], 2, 2, generator=g, dtype=torch.float64)).requires_grad_()
    th = torch.randn(2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    s0 = torch.randn(3, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor(CU)
    outs = {}
    for name, fn in (("op", lambda *a, **k: complex_scan(*a, backend="torch", **k)), ("reference", complex_scan_reference)):
        y, final = fn(x, ld, th, s0, output_final_state=True, cu_seqlens=cu)
        grads = torch.autograd.grad(y.sin().sum() + final.square().sum(), (x, ld, th, s0))
        outs[name] = (y, final, *grads)
    for a, b in zip(outs["op"], outs["reference"]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    y, none = complex_scan_reference(x, ld, th, s0, cu_seqlens=cu)
    assert none is None and torch.equal(y, outs["reference"][0])


@pytest.mark.parametrize("shape", [(CU[-1], 2, 2), (CU[-1], 1, 2), (CU[-1], 2, 1)], ids=["T,H,P", "T,1,P", "T,H,1"])
def test_the_scan_reference_takes_per_token_values_in_any_broadcastable_shape(one_torch_thread, shape):
    """A per-token decay and angle without the batch axis (``(T, H, P)`` broadcasts to ``(1, T, H, P)``), packed:
    the op's numbers (each sequence's own time steps, not the first sequence's)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, CU[-1], 2, 4, generator=g, dtype=torch.float64)
    ld = -torch.rand(shape, generator=g, dtype=torch.float64)
    th = torch.randn(shape, generator=g, dtype=torch.float64)
    cu = torch.tensor(CU)
    want = complex_scan(x, ld, th, output_final_state=True, cu_seqlens=cu, backend="torch")
    got = complex_scan_reference(x, ld, th, output_final_state=True, cu_seqlens=cu)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_every_op_calls_the_decay_log_decay_and_retention_keeps_its_old_keyword():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 7, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    decay = -torch.rand(2, generator=g, dtype=torch.float64)
    want, _ = retention_reference(q, k, v, log_decay=decay)
    with pytest.warns(DeprecationWarning, match="log_gamma is now log_decay"):
        old, _ = retention_chunkwise(q, k, v, log_gamma=decay)
    torch.testing.assert_close(old, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="expected log_decay only"):
        retention_chunkwise(q, k, v, decay, log_gamma=decay)
