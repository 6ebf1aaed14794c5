"""The decode step recorded once and replayed (models/decoding/graphed_step.py), through its CPU stand-in
("traced-graph": make_fx over the same memory, replayed as a CUDA graph would be; the CUDA graph itself is in
tests/cuda). Every replayed step's logits equal the eager step's in float64 for every mixer and option, across
a window's wrap and a global cache's regrowth; the returned state continues eagerly; generate and continuous
batching give the eager tokens; a step a CUDA graph cannot hold is refused in one line."""
from __future__ import annotations

import random

import pytest
import torch

from hybrid.models import HybridConfig
from hybrid.models.decoding.decoder import Decoder, Request, generate_many
from hybrid.models.decoding.graph_recorders import record_traced
from hybrid.models.decoding.graph_state import copy_into
from hybrid.models.decoding.graphed_step import GraphedStep
from hybrid.models.decoding.prompts import prefill
from hybrid.models.generation import generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 23
WINDOW = 4
TINY = dict(d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB)
CASES = {
    "transformer": HybridConfig.preset("transformer", "tiny", **TINY),
    "transformer-gqa-learned-positions": HybridConfig.preset(
        "transformer", "tiny", **{**TINY, "n_heads": 4}, n_kv_heads=2, abs_pos="learned", abs_pos_max_len=64),
    "hybrid-window": HybridConfig.preset("hybrid", "tiny", **TINY, window=WINDOW),
    "hybrid-carope-sinusoidal": HybridConfig.preset("hybrid", "tiny", **TINY, window=WINDOW, carope=True,
                                                    abs_pos="sinusoidal"),
    "hybrid-shared-kv-global": HybridConfig.preset("hybrid", "tiny", **TINY, window=None, shared_kv=True),
    "retnet": HybridConfig.preset("retnet", "tiny", **TINY),
    "vo-rnn-selective": HybridConfig.preset("vo-rnn", "tiny", **TINY, rnn_selective=True),
    "vo-gla": HybridConfig.preset("vo-gla", "tiny", **TINY),
    # frequencies that follow each row's total length, past L0 = 8 after a few steps (rows cross it at different steps)
    "transformer-dynamic-ntk": HybridConfig.preset("transformer", "tiny", **TINY, rope_scaling={
        "rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}),
    "hybrid-longrope": HybridConfig.preset("hybrid", "tiny", **TINY, window=WINDOW, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [1.0, 3.0, 5.0, 7.0],
        "factor": 4.0, "original_max_position_embeddings": 8}),
}
LENGTHS = [3, 9, 1, 6]  # ragged prompts: shorter and longer than the window
STEPS = 3 * WINDOW + 1  # past the window's wrap, and past a global cache's first capacity


def prompts_of(lengths, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("name", list(CASES))
def test_replayed_steps_equal_eager_steps(name, float64_model_of):
    model = float64_model_of(CASES[name])
    forced = torch.randint(0, VOCAB, (len(LENGTHS), STEPS + 2), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, state = prefill(model, prompts_of(LENGTHS, seed=0))
        eager_state = state.clone()
        step = GraphedStep(model, "traced")
        for t in range(STEPS):
            want, eager_state = model(forced[:, t:t + 1], state=eager_state)
            got, state = step(forced[:, t:t + 1], state=state)
            err = (got - want).abs().max().item()
            assert err <= 1e-12 * want.abs().max().item(), f"{name}, step {t}: max error {err:.3g}"
        # the returned state is an ordinary one: it continues eagerly, and as a chunk
        for t in (STEPS, STEPS + 1):
            want, eager_state = model(forced[:, t:t + 1], state=eager_state)
            got, state = model(forced[:, t:t + 1], state=state)
            assert (got - want).abs().max().item() <= 1e-12 * want.abs().max().item(), f"{name}: eager after"
    assert step.counts["replayed"] == STEPS and step.counts["eager"] == 0
    grows = "transformer" in name or "global" in name  # the default capacity, twice the longest, is outgrown
    assert (step.counts["recorded"] >= 2) == grows, step.counts
    assert len(step.graphs) == 1  # one batch size: an outgrown capacity's graph is dropped


def test_one_position_prompts_take_one_eager_step_then_replay(float64_model_of):
    model = float64_model_of(CASES["hybrid-window"])
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    want = generate(model, ids, 9, temperature=0)
    step = GraphedStep(model, "traced")
    with torch.no_grad():
        logits, state = model(ids)
        tokens = [logits[:, -1].argmax(-1)]
        for _ in range(8):
            logits, state = step(tokens[-1][:, None], state=state)
            tokens.append(logits[:, -1].argmax(-1))
    assert torch.equal(torch.cat([ids, torch.stack(tokens, 1)], 1), want)
    assert step.counts == {"eager": 1, "recorded": 1, "loaded": 0, "replayed": 7}
    assert torch.equal(generate(model, ids, 9, temperature=0, compile="traced-graph"), want)


@pytest.mark.parametrize("name", ["transformer", "hybrid-shared-kv-global"])
def test_rows_put_into_a_returned_state_copy_the_rows_not_the_cache(name, float64_model_of, monkeypatch):
    """Continuous batching writes a joining request's rows into the state a replay returned (its global cache,
    in place) and steps again: the step loads that state into its graph without cloning it, copying the rows'
    new states and lengths but not the cache, and computes the eager step."""
    from hybrid.models.decoding import graphed_step

    model = float64_model_of(CASES[name])
    forced = torch.randint(0, VOCAB, (3, 6), generator=torch.Generator().manual_seed(8))
    copied = []  # the static tensors written by a copy

    def counting_copy_into(static, given):
        copied.extend(s for s, g in zip(static, given) if not graphed_step.same_memory(s, g))
        return copy_into(static, given)

    with torch.no_grad():
        _, state = prefill(model, prompts_of([5, 8, 3], seed=0))
        eager_state = state.clone()
        step = GraphedStep(model, "traced", capacity=32)
        for t in range(3):
            _, eager_state = model(forced[:, t:t + 1], state=eager_state)
            _, state = step(forced[:, t:t + 1], state=state)
        _, joining = prefill(model, prompts_of([6], seed=9))
        rows = torch.tensor([1])
        state, eager_state = state.put(rows, joining), eager_state.put(rows, joining.clone())
        caches = [layer.cache for layer in state.layers if getattr(layer, "cache", None) is not None]
        buffers = {t.data_ptr() for cache in caches for t in (cache.k, cache.v) if t is not None}
        monkeypatch.setattr(graphed_step, "copy_into", counting_copy_into)
        for t in range(3, 6):
            want, eager_state = model(forced[:, t:t + 1], state=eager_state)
            got, state = step(forced[:, t:t + 1], state=state)
            assert (got - want).abs().max().item() <= 1e-12 * want.abs().max().item(), f"{name}, step {t}"
    assert step.counts["loaded"] == 1 and step.counts["recorded"] == 1, step.counts
    assert caches and buffers and copied  # lengths, positions and recurrent states: not the cache's buffers
    assert not [t for t in copied if t.data_ptr() in buffers], [tuple(t.shape) for t in copied]


def test_a_global_cache_is_recorded_at_the_capacity_asked_for(float64_model_of):
    """generate asks for the prompt plus the new tokens; the eager step into the rows form grew the buffer
    geometrically (to twice the prompt), and the graph reads exactly the capacity asked for."""
    model = float64_model_of(CASES["transformer"])
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(6))
    step = GraphedStep(model, "traced", capacity=13 + 5)
    with torch.no_grad():
        logits, state = model(ids)
        for _ in range(4):
            logits, state = step(logits[:, -1:].argmax(-1), state=state)
    (graph,) = step.graphs.values()
    assert graph.capacity == 18 and step.counts["recorded"] == 1
    assert {layer.cache.k.shape[1] for layer in state.layers} == {18}


@pytest.mark.parametrize("name", ["transformer", "hybrid-window", "transformer-dynamic-ntk"])
def test_generate_and_continuous_batching_give_the_eager_tokens(name, model_of):
    model = model_of(CASES[name])
    prompts = prompts_of([5, 2, 8], seed=4)
    want = generate(model, prompts, 6, temperature=0)
    got = generate(model, prompts, 6, temperature=0, compile="traced-graph")
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    # requests join and leave: rows put into the graph's own state, the batch shrinking to fewer rows
    rng = random.Random(5)
    requests = [Request(prompt=[rng.randrange(VOCAB) for _ in range(rng.randint(1, 11))],
                        max_new_tokens=rng.randint(1, 9), temperature=rng.choice([0, 0.7, 1.0]),
                        stop_token=rng.choice([None, 3]), seed=i) for i in range(9)]
    want = generate_many(model, requests, max_batch=3)
    decoder = Decoder(model, max_batch=3, compile="traced-graph")
    got = {done.index: done.tokens for done in decoder.run(requests)}
    assert [got[i].tolist() for i in range(len(requests))] == [w.tolist() for w in want]
    counts = decoder.step.counts  # a request joining copies the batch into its graph, which has room
    assert counts["loaded"] >= counts["recorded"] - 1, counts


@pytest.mark.parametrize("name", ["transformer", "hybrid-shared-kv-global", "hybrid-window"])
def test_a_graphed_batch_grows_past_its_first_admission(name, model_of):
    """A request for no new token is answered at once and takes no slot, so the first admission fills fewer rows
    than ``max_batch``; the next request then grows the batch from the graph's own state, whose global cache
    attends over its whole fixed buffer (only its first ``span`` slots are entries: copying the buffer failed)."""
    model = model_of(CASES[name])
    requests = [Request(prompt=[1, 2, 3], max_new_tokens=0), Request(prompt=[4, 5], max_new_tokens=3, temperature=0),
                Request(prompt=[6], max_new_tokens=4, temperature=0),
                Request(prompt=[7, 8, 9, 10, 11], max_new_tokens=3, temperature=0)]
    want = generate_many(model, requests, max_batch=3)
    got = generate_many(model, requests, max_batch=3, compile="traced-graph")
    assert [g.tolist() for g in got] == [w.tolist() for w in want] and want[0].numel() == 0


def test_a_draining_graphed_batch_shrinks_to_powers_of_two(model_of):
    """With graphs, a shrinking batch keeps free rows up to a power of two: every step's batch is max_batch or a
    power of two, where eager continuous batching shrinks to its live rows (6, 3, 1 here), so a second run of the
    same requests records no graph; the tokens are eager continuous batching's."""
    model = model_of(CASES["hybrid-window"])
    requests = [Request(prompt=[1 + i % 5] * (1 + i % 4), max_new_tokens=n, temperature=0)
                for i, n in enumerate(range(2, 13))]

    def batch_sizes(decoder):
        sizes, step = [], decoder.step
        decoder.step = lambda token, state: sizes.append(token.shape[0]) or step(token, state=state)
        got = {done.index: done.tokens.tolist() for done in decoder.run(requests)}
        decoder.step = step
        return [got[i] for i in range(len(requests))], sizes

    want, eager_sizes = batch_sizes(Decoder(model, max_batch=6))
    assert 3 in eager_sizes, eager_sizes  # the drain meets a batch that is not a power of two
    decoder = Decoder(model, max_batch=6, compile="traced-graph")
    got, sizes = batch_sizes(decoder)
    assert got == want
    assert set(sizes) == {6, 4, 2, 1}, sizes
    recorded = decoder.step.counts["recorded"]
    assert batch_sizes(decoder)[0] == want and decoder.step.counts["recorded"] == recorded


@pytest.mark.parametrize("name, steps", [("hybrid-window", STEPS), ("vo-gla", STEPS), ("transformer", 6)])
def test_compiled_replays_equal_eager_steps(name, steps, float64_model_of):
    """The step as torch.compile runs it (``compiled=True``: what a CUDA graph then records), through its CPU
    stand-in: every replay equals the eager step in float64, and a layout compiles once, however many tokens follow
    (a global cache's host span, which its stand-in replays read, recompiles it: fewer steps there)."""
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    counters.clear()
    model = float64_model_of(CASES[name])
    forced = torch.randint(0, VOCAB, (len(LENGTHS), steps), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, state = prefill(model, prompts_of(LENGTHS, seed=0))
        eager_state = state.clone()
        step = GraphedStep(model, "rerun", compiled=True)
        for t in range(steps):
            want, eager_state = model(forced[:, t:t + 1], state=eager_state)
            got, state = step(forced[:, t:t + 1], state=state)
            err = (got - want).abs().max().item()
            assert err <= 1e-12 * want.abs().max().item(), f"{name}, step {t}: max error {err:.3g}"
    assert step.counts["replayed"] == steps and counters["stats"]["unique_graphs"] >= 1
    if name != "transformer":
        assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"], dict(counters["recompiles"])
    torch.compiler.reset()


def test_every_layout_records_a_compiled_step_past_dynamos_recompile_limit(model_of):
    """Nine batch sizes, nine layouts: each compiles the model's step anew (dynamic=False), one more than Dynamo's
    default limit, past which it would run eagerly without a word and the graph would hold the eager kernels
    (Dynamo's eager backend here: the trace is what counts)."""
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    counters.clear()
    model = model_of(HybridConfig.preset("transformer", "tiny", **{**TINY, "n_layers": 1}))  # a short trace
    step = GraphedStep(model, "rerun", compiled={"backend": "eager"})
    with torch.no_grad():
        for batch in range(2, 11):  # (one prompt alone would take an eager step: no ragged rows to record)
            _, state = prefill(model, prompts_of([3 + b % 4 for b in range(batch)], seed=batch))
            want, _ = model(torch.ones(batch, 1, dtype=torch.long), state=state.clone())
            got, _ = step(torch.ones(batch, 1, dtype=torch.long), state=state)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert step.counts["recorded"] == 9 and counters["stats"]["unique_graphs"] == 9, dict(counters["stats"])
    torch.compiler.reset()


def test_a_compiled_step_needs_a_recorder_that_can_hold_it(model_of):
    model = model_of(CASES["hybrid-window"])
    with pytest.raises(ValueError, match=r"^compiled: expected the 'cuda' or 'rerun' recorder \(make_fx, the "
                                         r"'traced' stand-in, does not trace a torch.compile'd step\), got recorder "
                                         r"'traced'$"):
        GraphedStep(model, "traced", compiled=True)
    with pytest.raises(ValueError, match=r"^compiled: expected True, False or a dict of torch.compile options, "
                                         r"got 'yes'$"):
        GraphedStep(model, "rerun", compiled="yes")


def test_a_step_a_cuda_graph_cannot_hold_is_refused():
    x = torch.arange(4.0)
    with pytest.raises(ValueError, match=r"reads a tensor back to the host \(a sync\)"):
        record_traced(lambda: x.add_(float(x.sum())), [x])
    with pytest.raises(ValueError, match="builds a tensor from host data"):
        record_traced(lambda: x.add_(torch.tensor([1.0, 2.0, 3.0, 4.0])), [x])
    with pytest.raises(ValueError, match="data-dependent shape"):
        record_traced(lambda: x[:1].copy_((x > 1).nonzero()[:1, 0].double()), [x])
    assert torch.equal(x, torch.arange(4.0))  # refused or recorded, the tensors are left as they were


def test_recording_leaves_the_tensors_and_each_replay_runs_the_step():
    x, y = torch.arange(3.0), torch.ones(3)

    def run():
        z = x * 2 + y  # an intermediate, recomputed by each replay
        y.copy_(z)
        x.add_(1)

    replay = record_traced(run, [x, y])
    assert torch.equal(x, torch.arange(3.0)) and torch.equal(y, torch.ones(3))
    replay()
    replay()
    assert torch.equal(x, torch.arange(3.0) + 2) and torch.equal(y, torch.tensor([3.0, 7.0, 11.0]))


def test_cuda_graph_needs_a_cuda_model(model_of):
    model = model_of(CASES["hybrid-window"])
    with pytest.raises(ValueError, match="needs the model on a CUDA device, got one on cpu"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 2, compile="cuda-graph")
    with pytest.raises(ValueError, match="needs the model on a CUDA device, got one on cpu"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 2, compile="compiled-cuda-graph")
    with pytest.raises(ValueError, match=r"expected True, False, a dict of torch.compile options, or one of "
                                         r"\['compiled-cuda-graph', 'cuda-graph', 'traced-graph'\], got 'graph'"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 2, compile="graph")
