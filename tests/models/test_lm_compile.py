"""torch.compile(fullgraph=True) traces every preset with no graph break: the scan and retention are custom ops
(``hybrid::complex_scan``, ``hybrid::retention_chunkwise``) with fake implementations and autograd."""
from __future__ import annotations

import contextlib

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM

PRESETS = ["hybrid", "retnet", "vo-rnn", "transformer"]


def no_recompile():
    """A context in which a recompile raises (``torch.compiler.set_stance``, torch >= 2.6; older releases only
    check the results)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("fail_on_recompile") if set_stance is not None else contextlib.nullcontext()


@pytest.mark.parametrize("preset", PRESETS)
def test_fullgraph_compile_equals_eager(preset, one_torch_thread):
    torch.compiler.reset()
    extra = {"window": 8} if preset == "hybrid" else {}
    config = HybridConfig.preset(preset, "tiny", d_model=32, n_layers=3, n_heads=2, vocab_size=64,
                                 rnn_selective=preset == "vo-rnn", **extra)
    torch.manual_seed(0)
    model = HybridLM(config).double().train()  # float64: compiled and eager agree to its rounding
    ids = torch.randint(0, 64, (2, 37))

    def loss_of(fn):
        logits = fn(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        grads = torch.autograd.grad(loss, list(model.parameters()))
        return logits.detach(), grads

    # fullgraph=True raises on any graph break; aot_eager traces forward and backward like inductor does
    compiled = torch.compile(lambda x: model(x, output_final_state=False)[0], fullgraph=True, backend="aot_eager")
    got_logits, got_grads = loss_of(compiled)
    want_logits, want_grads = loss_of(lambda x: model(x, output_final_state=False)[0])
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-12, atol=1e-14)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-14)
    torch.compiler.reset()


@pytest.mark.parametrize("preset", ["hybrid", "transformer", "retnet"])
def test_fullgraph_compile_of_a_packed_batch(preset, one_torch_thread):
    """Packed training batches trace whole too, and new document offsets (same count) reuse the graph."""
    torch.compiler.reset()
    extra = {"window": 8} if preset == "hybrid" else {}
    config = HybridConfig.preset(preset, "tiny", d_model=32, n_layers=2, n_heads=2, vocab_size=64, **extra)
    torch.manual_seed(0)
    model = HybridLM(config).double().train()
    compiled = torch.compile(lambda x, cu: model(x, cu_seqlens=cu, output_final_state=False)[0], fullgraph=True,
                             backend="aot_eager")
    for i, cu in enumerate((torch.tensor([0, 5, 17, 40]), torch.tensor([0, 1, 30, 40]), torch.tensor([0, 12, 13, 40]))):
        ids = torch.randint(0, 64, (1, 40))
        # the second batch may compile once more (the offsets become dynamic); from the third on a recompile raises
        with no_recompile() if i == 2 else contextlib.nullcontext():
            got = compiled(ids, cu)
        want, _ = model(ids, cu_seqlens=cu, output_final_state=False)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    torch.compiler.reset()
