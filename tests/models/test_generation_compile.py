"""``generate(..., compile=...)``: the decode steps under ``torch.compile(model, dynamic=True)``, the prefill eager.

The tokens are the eager decoder's (greedy, float64 models: bit for bit), for one batch and for prompts of
different lengths (a ragged batch), with no graph break (``fullgraph``) and a bounded number of graphs, which a
second call reuses. One run through Inductor itself, what ``compile=True`` uses. And the one-line refusals."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.models.generation import generate

CASES = {"transformer": ("transformer", {}), "hybrid": ("hybrid", {"window": 8})}  # global; R with a window


def tiny(case: str, dtype=torch.float64) -> HybridLM:
    preset, overrides = CASES[case]
    torch.manual_seed(0)
    config = HybridConfig.preset(preset, "tiny", d_model=32, n_layers=3, n_heads=2, vocab_size=64, **overrides)
    return HybridLM(config).to(dtype).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_decode_steps_give_the_eager_tokens(case, one_torch_thread, graph_recorder):
    torch.compiler.reset()
    model = tiny(case)
    counting = graph_recorder()
    graphs = counting.graphs

    options = {"backend": counting, "fullgraph": True}
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (2, 13), generator=g)
    want = generate(model, ids, 9, temperature=0)
    assert torch.equal(generate(model, ids, 9, temperature=0, compile=options), want)
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in (4, 11, 7)]
    want_rows = generate(model, prompts, 6, temperature=0)
    got_rows = generate(model, prompts, 6, temperature=0, compile=options)
    assert all(torch.equal(a, b) for a, b in zip(got_rows, want_rows))
    count = len(graphs)
    assert 1 <= count <= 4, count  # one batch and ragged rows: a graph or two each, symbolic from the start
    other = torch.randint(0, 64, (2, 17), generator=g)  # a new prompt length, a new call: the graphs serve
    assert torch.equal(generate(model, other, 5, temperature=0, compile=options),
                       generate(model, other, 5, temperature=0))
    assert len(graphs) == count
    torch.compiler.reset()


def test_inductor_decodes_as_eager(one_torch_thread):
    """``compile=True`` as a user runs it (Inductor, dynamic shapes), float32: the same greedy tokens. A counting
    backend runs no Inductor lowering, and Inductor has failed where Dynamo traced fine: global attention's decode
    step given SDPA no mask (one query over the cache; tried on 2026-11-27) compiled to a kernel calling an unbound
    size symbol, a layer's cached length (NameError; torch 2.13). This test fails on that change."""
    torch.compiler.reset()
    model = tiny("transformer", torch.float32)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(6))
    assert torch.equal(generate(model, ids, 6, temperature=0, compile=True), generate(model, ids, 6, temperature=0))
    torch.compiler.reset()


@pytest.mark.parametrize("kwargs, message", [
    (dict(compile="yes"), "compile: expected True, False, a dict of torch.compile options, or one of "
                            "['compiled-cuda-graph', 'cuda-graph', 'traced-graph'], got 'yes'"),
    (dict(compile=True, mode="parallel"),
     "compile: compiles the decode steps of mode 'recurrent' without a draft model, got mode 'parallel'"),
    (dict(compile=True, draft="DRAFT"),
     "compile: compiles the decode steps of mode 'recurrent' without a draft model, got mode 'recurrent' with a "
     "draft"),
])
def test_refusals_are_one_line(kwargs, message):
    model = tiny("transformer")
    if kwargs.get("draft") == "DRAFT":
        kwargs["draft"] = model
    with pytest.raises(ValueError) as err:
        generate(model, torch.zeros(1, 3, dtype=torch.long), 2, **kwargs)
    assert str(err.value) == message
