"""A compiled training step over packed batches builds a bounded number of graphs whatever the document count N.

The trainer packs documents: every micro-batch is one row with ``cu_seqlens`` ``(N+1,)``, N changing from batch to
batch. A model compiled whole gets the offsets as ``packed_on_device(..., compiled=True)`` gives them (the tensor,
marked as of a varying length); the trainer's ``--compile`` compiles each block (``CompiledBlocks``), and the
model hands them the same. Any Python value of N read on the no-state training path (a list of N offsets,
``max`` over them, a tuple of host offsets) would make Dynamo build one graph per N, until its recompile limit
sends the model back to eager. Here every mixer family runs six packed batches with N = 2 … 7, forward and
backward, under a counting backend: after the first batch no graph is added, and logits and gradients equal
the eager model's; with ``CompiledBlocks``, one graph per kind of block.
"""
from __future__ import annotations

import pytest
import torch

from hybrid.kernels.window_attention.flex import FLEX_AVAILABLE
from hybrid.models import CompiledBlocks, HybridConfig, HybridLM
from hybrid.train.data.packing import packed_on_device

T = 80
# preset, overrides; attention takes the "blocked" way on the CPU (the "auto" choice there)
CASES = {
    "transformer": ("transformer", {}),  # global attention
    "transformer-window": ("transformer", {"window": 8}),
    "hybrid": ("hybrid", {"window": 8, "n_layers": 3}),  # RRA: R (VO-RoPE recurrence) and windowed A
    "hybrid-selective": ("hybrid", {"window": 8, "n_layers": 3, "rnn_selective": True}),
    "retnet": ("retnet", {}),
    "vo-rnn": ("vo-rnn", {}),
    "vo-gla": ("vo-gla", {}),
}
# One graph for every N: cu_seqlens marked dynamic from the start, and no side effect while tracing (the rotary
# cos/sin rows are computed inside the graph, not stored in a cache that the next call's guards would see: that
# was a second graph at the second call). Before the fix every case with attention or retention built one graph
# per N (a list of N zero offsets, max() over it): 6 in these 6 batches. N = 1 would add one graph (Dynamo
# specializes a size-1 tensor, here the (N,) lengths); the trainer's rows hold at least batch_size windows, each
# its own sequence.
MOST_GRAPHS = 1


def packed_batches(n_batches: int, seed: int = 1, windows: int = 1):
    """``n_batches`` packed rows of T tokens, the k-th with N = 2 + k documents at random offsets; with ``windows``,
    the row is that many windows each starting a document (as the trainer packs: the scan runs them as rows), and
    N counts their starts too."""
    g = torch.Generator().manual_seed(seed)
    for k in range(n_batches):
        n = 2 + k
        cuts = set(torch.randperm(T - 1, generator=g)[: n - 1].add(1).tolist())
        cuts |= {w * (T // windows) for w in range(1, windows)}
        yield torch.randint(0, 64, (1, T), generator=g), torch.tensor([0, *sorted(cuts), T])


def compiled_with_a_count(case: str, window_backend: str, graph_recorder, scope: str = "model",
                          recompute: str = "none"):
    """The case's tiny model in float64 (compiled and eager agree to its rounding), its attention on
    ``window_backend``, compiled (``scope`` "model": whole; "blocks": ``CompiledBlocks``, the trainer's
    ``--compile``) with a backend that records each graph (and runs it as traced): ``(model, compiled, graphs)``."""
    preset, overrides = CASES[case]
    torch.compiler.reset()
    torch.manual_seed(0)
    config = HybridConfig.preset(preset, "tiny", **{"d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 64,
                                                    "recompute": recompute, **overrides})
    model = HybridLM(config).double()
    for block in model.blocks:
        if hasattr(block.mixer, "window_backend"):
            block.mixer.window_backend = window_backend
    counting = graph_recorder()
    graphs = counting.graphs

    if scope == "blocks":
        return model, CompiledBlocks(model, backend=counting), graphs
    return model, torch.compile(model, backend=counting), graphs


def loss_and_grads(model, forward, ids, cu):
    """The trainer's call (parallel mode, no state, offset 0, no state out) and its loss's gradients."""
    logits, state = forward(ids, cu_seqlens=cu, output_final_state=False)
    assert state is None
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    return logits.detach(), torch.autograd.grad(loss, list(model.parameters()))


def graphs_after_each_batch(model, compiled, graphs, traced_whole: bool, windows: int = 1) -> list[int]:
    """Six packed training batches (N = 2 … 7, ``windows`` as ``packed_batches``) through ``compiled``, the offsets
    as ``packed_on_device`` hands them to a model ``traced_whole`` or not; logits and gradients equal eager's each
    time; the graph count after each."""
    model.train()
    counts = []
    for ids, cu in packed_batches(6, windows=windows):
        offsets = packed_on_device(cu, ids.device, traced_whole)
        if windows > 1 and not traced_whole:
            assert offsets.row_len == T // windows
        got_logits, got_grads = loss_and_grads(model, compiled, ids, offsets)
        counts.append(len(graphs))
        want_logits, want_grads = loss_and_grads(model, model, ids, cu)
        torch.testing.assert_close(got_logits, want_logits, rtol=1e-12, atol=1e-12)
        for got, want in zip(got_grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    return counts


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_packed_training_builds_a_bounded_number_of_graphs(case, one_torch_thread, graph_recorder):
    model, compiled, graphs = compiled_with_a_count(case, "blocked", graph_recorder)
    counts = graphs_after_each_batch(model, compiled, graphs, traced_whole=True)
    assert counts[0] == counts[-1] <= MOST_GRAPHS, f"graphs after each batch (N = 2 … 7): {counts}"
    torch.compiler.reset()


@pytest.mark.parametrize("recompute", ["none", "all"])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_blocks_build_one_graph_per_kind_of_block(case, recompute, one_torch_thread, graph_recorder):
    """``CompiledBlocks`` (the trainer's ``--compile``), offsets as the trainer hands them over (with their host
    values): one graph for each kind of block (R, A, ...: Dynamo reuses a block's graph for every block of its
    kind), whatever N; logits and gradients equal eager, with activation checkpointing (``recompute="all"``: the
    compiled block runs again in backward) too. The batches are the trainer's: windows, each starting a document,
    which the R layers' scan runs as rows (the window length, the same in every batch, is in the graph)."""
    model, compiled, graphs = compiled_with_a_count(case, "blocked", graph_recorder, scope="blocks",
                                                    recompute=recompute)
    counts = graphs_after_each_batch(model, compiled, graphs, traced_whole=False, windows=2)
    kinds = len(set(model.config.layer_types))
    assert counts[0] == counts[-1] == kinds, f"graphs after each batch (N = 2 … 7): {counts}, {kinds} kinds"
    torch.compiler.reset()


@pytest.mark.skipif(not FLEX_AVAILABLE, reason="FlexAttention needs torch >= 2.5")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")  # eager, on the CPU
@pytest.mark.parametrize("scope", ["model", "blocks"])
@pytest.mark.parametrize("case", ["transformer", "transformer-window", "hybrid"])
def test_compiled_packed_flex_attention_builds_its_mask_outside_the_graph(case, scope, one_torch_thread,
                                                                          monkeypatch, graph_recorder):
    """The FlexAttention way (the GPU's) builds its document mask in a function torch.compile does not trace: one
    graph break per attention layer, whose resumed frame guards on no offset. Compiled, the model has the offset
    tensor alone, so the mask is built from it on the device, with no value read back (a host sync), once a step
    for every attention layer; eager, from the host values the model checked. ``CompiledBlocks`` gets the offsets
    with their host values, as the trainer hands them over, and its blocks the tensor alone: the same, with no
    read back either. Forward only: eager FlexAttention has no backward on the CPU."""
    from hybrid.kernels.window_attention import flex

    built = {"from host values": 0, "on the device": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            built[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(flex, "_document_block_mask", counted("from host values", flex._document_block_mask))
    monkeypatch.setattr(flex, "_document_mask", counted("on the device", flex._document_mask))
    model, compiled, graphs = compiled_with_a_count(case, "flex", graph_recorder, scope=scope)
    model.eval()
    counts = []
    with torch.no_grad():
        for ids, cu in packed_batches(6):
            before = dict(built)
            offsets = packed_on_device(cu, ids.device, compiled=scope == "model")
            got, _ = compiled(ids, cu_seqlens=offsets, output_final_state=False)
            assert built["from host values"] == before["from host values"]  # nothing read back
            assert built["on the device"] == before["on the device"] + 1  # one mask, every layer of the step
            counts.append(len(graphs))
            want, _ = model(ids, cu_seqlens=cu, output_final_state=False)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the first batch builds the graphs around each break, and no later batch adds one
    assert counts[0] == counts[-1], f"graphs after each batch (N = 2 … 7): {counts}"
    torch.compiler.reset()
