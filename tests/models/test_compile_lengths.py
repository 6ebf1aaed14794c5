"""A compiled model meets prompts of new lengths with at most one more graph, and no graph break.

Dynamo traces the first call with its shapes fixed, and at the first new length traces once more with the length
symbolic; that graph must then serve every later length. Anything that reads the length as a Python value in a
way that fixes it (a ``range`` over T, a Python bool of T handed to a kernel, a cache filled while tracing) costs
one graph per length, or breaks the graph, and after 8 lengths Dynamo runs the model eager. Whole model
(``torch.compile``) and per block (``CompiledBlocks``), every mixer family and the length-dependent rotary
schedules: prompts of 40, 45, 40, 57 and 33 tokens, then decode steps (whole model), of one batch and of a
ragged one; logits equal eager's in float64 at each call.
"""
from __future__ import annotations

import pytest
import torch

from hybrid.models import CompiledBlocks, HybridConfig, HybridLM

# Three or four of windowed attention's 16-token query blocks, none a multiple of 16: the blocked form's symbolic
# graph is guarded on whether T is a multiple (the padded blocks' output is then contiguous) and on whether it
# holds exactly two blocks, so each of those regimes takes one graph of its own (docs/training.md, "Compile").
LENGTHS = (40, 45, 40, 57, 33)
LONGROPE = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16,
            "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0], "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]}
CASES = {
    "transformer": ("transformer", {}),  # global attention: one causal SDPA call
    "transformer-window": ("transformer", {"window": 8}),
    "hybrid": ("hybrid", {"window": 8, "n_layers": 3}),
    "hybrid-selective": ("hybrid", {"window": 8, "n_layers": 3, "rnn_selective": True}),
    "retnet": ("retnet", {}),
    "vo-rnn": ("vo-rnn", {}),
    "vo-gla": ("vo-gla", {}),
    # every prompt longer than L0 = 16: the frequencies depend on the length (dynamic) or switch (longrope)
    "rope-dynamic": ("transformer", {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0,
                                                      "original_max_position_embeddings": 16}}),
    "rope-longrope": ("transformer", {"rope_scaling": LONGROPE}),
    "rope-yarn": ("transformer", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 16}}),
}


def model_and_counter(case: str, graph_recorder):
    preset, overrides = CASES[case]
    torch.compiler.reset()
    torch.manual_seed(0)
    config = HybridConfig.preset(preset, "tiny", **{"d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 64,
                                                    **overrides})
    counting = graph_recorder()
    graphs = counting.graphs

    return HybridLM(config).double().eval(), counting, graphs


@pytest.mark.parametrize("scope", ["model", "blocks"])
@pytest.mark.parametrize("case", list(CASES))
def test_new_prompt_lengths_reuse_the_symbolic_graph(case, scope, one_torch_thread, graph_recorder):
    model, counting, graphs = model_and_counter(case, graph_recorder)
    if scope == "blocks":
        compiled = CompiledBlocks(model, backend=counting, fullgraph=True)
    else:
        compiled = torch.compile(model, backend=counting, fullgraph=True)
    counts = []
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for T in LENGTHS:
            ids = torch.randint(0, 64, (2, T), generator=g)
            got, _ = compiled(ids)
            want, _ = model(ids)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            counts.append(len(graphs))
    kinds = len({type(block.mixer) for block in model.blocks}) if scope == "blocks" else 1
    assert counts == [kinds] + [2 * kinds] * (len(LENGTHS) - 1), f"graphs after each prompt ({LENGTHS}): {counts}"
    torch.compiler.reset()


@pytest.mark.parametrize("case", ["transformer", "hybrid", "vo-gla"])
def test_decode_steps_reuse_the_symbolic_graph(case, one_torch_thread, graph_recorder):
    """A prompt, then five decode steps: the first step traces the state's path, the second once more with the
    offset symbolic, and every later step reuses it."""
    model, counting, graphs = model_and_counter(case, graph_recorder)
    compiled = torch.compile(model, backend=counting, fullgraph=True)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 64, (2, 21), generator=g)
    with torch.no_grad():
        _, state = compiled(ids)
        _, want_state = model(ids)
        counts = []
        for _ in range(5):
            ids = torch.randint(0, 64, (2, 1), generator=g)
            got, state = compiled(ids, state=state)
            want, want_state = model(ids, state=want_state)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            counts.append(len(graphs))
    assert counts == [2, 3, 3, 3, 3], f"graphs after each step: {counts}"
    torch.compiler.reset()


@pytest.mark.parametrize("case", ["transformer-window", "hybrid", "retnet"])
def test_ragged_decode_steps_trace_whole(case, one_torch_thread, graph_recorder):
    """Decode steps of a ragged batch (every row at its own position, after an eager packed prefill of prompts of
    5, 17 and 9 tokens) trace whole, in at most two graphs for every step (the second with a size symbolic, as
    the hybrid's second step); logits equal eager's.
    The per-row positions' check read their values (a graph break under torch.compile), and the rotary rows
    their largest (a host sync per layer on a GPU)."""
    from hybrid.models.decoding.prompts import prefill

    model, counting, graphs = model_and_counter(case, graph_recorder)
    compiled = torch.compile(model, backend=counting, fullgraph=True)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in (5, 17, 9)]
    with torch.no_grad():
        logits, state = prefill(model, prompts)
        want_state = state.clone()
        assert state.ragged
        counts = []
        for _ in range(8):
            token = logits.argmax(-1)[:, None]  # (B, 1)
            logits, state = compiled(token, state=state)
            want, want_state = model(token, state=want_state)
            torch.testing.assert_close(logits, want, rtol=1e-12, atol=1e-12)
            logits = logits[:, -1]
            counts.append(len(graphs))
    assert counts[1] == counts[-1] <= 2, f"graphs after each step: {counts}"
    torch.compiler.reset()


def test_inductor_compiles_prompts_of_new_lengths(one_torch_thread):
    """The counting backend above runs no Inductor lowering, and Inductor has failed where Dynamo traced fine
    (tests/models/test_generation_compile.py: a decode step). Here Inductor itself on a 3-layer Transformer's
    prompts of two lengths, the second symbolic: float32 logits equal eager's to its rounding."""
    torch.compiler.reset()
    torch.manual_seed(0)
    config = HybridConfig.preset("transformer", "tiny", d_model=32, n_layers=3, n_heads=2, vocab_size=64)
    model = HybridLM(config).eval()
    compiled = torch.compile(model)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for T in (40, 45):
            ids = torch.randint(0, 64, (2, T), generator=g)
            torch.testing.assert_close(compiled(ids)[0], model(ids)[0], rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
