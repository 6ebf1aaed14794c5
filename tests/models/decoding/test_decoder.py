"""Continuous batching (models/decoding/decoder.py): every request's tokens are those of decoding it alone with its
seed, whatever max_batch and whatever requests share its batch; slots are refilled and the batch shrinks; one-line
errors name the request."""
from __future__ import annotations

import random

import pytest
import torch

from hybrid.models import HybridConfig
from hybrid.models.decoding.decoder import Decoder, Request, generate_many
from hybrid.kv_cache import RowKVCache
from hybrid.models.generation import generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 31
TINY = dict(d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB)
CASES = {
    "hybrid": HybridConfig.preset("hybrid", "tiny", **TINY, window=4),
    "transformer": HybridConfig.preset("transformer", "tiny", **TINY),
    "retnet": HybridConfig.preset("retnet", "tiny", **TINY),
}


def mixed_requests(n: int, seed: int) -> list[Request]:
    """Prompts of 1 … 13 tokens, 0 … 8 new tokens, greedy and sampled rows (top-k, top-p), own seeds or none,
    stop tokens or none."""
    rng = random.Random(seed)
    return [Request(prompt=[rng.randrange(VOCAB) for _ in range(rng.randint(1, 13))], max_new_tokens=rng.randint(0, 8),
                    temperature=rng.choice([0, 0.8, 1.5]), top_k=rng.choice([None, 6]), top_p=rng.choice([None, 0.9]),
                    seed=rng.randrange(1000) if i % 3 else None, stop_token=rng.choice([None, 2, 5]))
            for i in range(n)]


def alone(model, request: Request, seed: int) -> torch.Tensor:
    """The request decoded by itself: generate on its prompt with its seed, cut after its stop token."""
    prompt = torch.tensor(request.prompt)[None]
    out = generate(model, prompt, request.max_new_tokens, temperature=request.temperature, top_k=request.top_k,
                   top_p=request.top_p, generator=torch.Generator().manual_seed(seed),
                   eos_token_id=request.stop_token)[0, prompt.shape[1]:]
    hits = (out == request.stop_token).nonzero() if request.stop_token is not None else []
    return out[: int(hits[0]) + 1] if len(hits) else out


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_equal_each_request_decoded_alone(name, float64_model_of):
    model = float64_model_of(CASES[name])
    requests = mixed_requests(12, seed=len(name))
    expected = [alone(model, r, r.seed if r.seed is not None else 7 + i) for i, r in enumerate(requests)]
    for max_batch in (1, 3, 8):
        outputs = generate_many(model, requests, max_batch=max_batch, seed=7)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            assert torch.equal(got, want), f"{name}, max_batch {max_batch}, request {i}: {got.tolist()} != {want.tolist()}"


def test_rows_sharing_their_options_draw_together_as_each_alone(float64_model_of):
    """Six requests of two option sets (and two greedy ones) in one batch: each set's rows draw from one batched
    distribution and one race (``draw_rows``), each from its own seed, and every request's tokens are still its
    own decoded alone."""
    model = float64_model_of(CASES["hybrid"])
    g = torch.Generator().manual_seed(12)
    options = [dict(temperature=0.9, top_k=7), dict(temperature=1.3, top_p=0.8), dict(temperature=0)] * 3
    requests = [Request(prompt=torch.randint(0, VOCAB, (3 + i % 4,), generator=g).tolist(), max_new_tokens=9,
                        seed=100 + i, **option) for i, option in enumerate(options)]
    outputs = generate_many(model, requests, max_batch=9)
    for i, (got, request) in enumerate(zip(outputs, requests)):
        assert torch.equal(got, alone(model, request, request.seed)), i


@pytest.mark.parametrize("name", ["hybrid", "transformer"])
def test_compiled_decode_steps_give_the_eager_outputs(name, float64_model_of, graph_recorder):
    """``compile``: the decode steps under torch.compile(model, dynamic=True) (a tracing backend here; Inductor in
    tests/models/test_generation_compile.py): the same tokens bit for bit, with no graph break, while rows join,
    finish and the batch shrinks, and a bounded number of graphs (the batch is a symbolic size)."""
    torch.compiler.reset()
    model = float64_model_of(CASES[name])
    counting = graph_recorder()
    graphs = counting.graphs

    requests = mixed_requests(10, seed=3)
    want = generate_many(model, requests, max_batch=4, seed=7)
    got = generate_many(model, requests, max_batch=4, seed=7, compile={"backend": counting, "fullgraph": True})
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert 1 <= len(graphs) <= 4, len(graphs)  # batches of 4 … 2 rows share one symbolic graph; 1 row specialises
    torch.compiler.reset()


@pytest.mark.parametrize("compile_", [False, "traced-graph"])
def test_a_long_stream_attends_over_its_live_rows_only(compile_, monkeypatch, float64_model_of):
    """A global cache's span, the slots each step attends over, is its longest row's length, counted on the host:
    a finished request's tokens leave it. Before, it grew by every step of the stream (303 slots for rows of at
    most 7 entries after 300 steps), and with graphs the capacity doubled again and again, a recording each time."""
    model = float64_model_of(CASES["transformer"])
    rng = random.Random(4)
    requests = [Request(prompt=[rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))],
                        max_new_tokens=rng.randint(1, 5), temperature=0) for _ in range(40)]
    want = [alone(model, r, 0) for r in requests]
    seen = []  # (span, longest row) at each eager step's attention over a global cache
    attend = RowKVCache.attend

    def spying(self, k, v, offset):
        if self.window is None and not self.fixed:
            seen.append((self.span, int(self.lengths.max())))
        return attend(self, k, v, offset)
    monkeypatch.setattr(RowKVCache, "attend", spying)
    decoder = Decoder(model, max_batch=3, compile=compile_)
    got = {done.index: done.tokens for done in decoder.run(requests)}
    assert [got[i].tolist() for i in range(len(requests))] == [w.tolist() for w in want]
    if compile_:  # a graph per batch size (3, 2, 1) at most: none recorded again at a larger capacity
        assert decoder.step.counts["recorded"] <= 3, decoder.step.counts
    else:
        assert len(seen) > 100 and all(span == longest for span, longest in seen), seen


def test_slots_are_refilled_and_the_batch_shrinks(monkeypatch, model_of):
    """Up to max_batch rows per decode step; a finished row's slot takes the next request (prefilled packed, put
    into the slot); with the stream drained the batch shrinks to its live rows."""
    model = model_of(CASES["hybrid"])
    requests = [Request(prompt=[1, 2, 3][: 1 + i % 3], max_new_tokens=n, temperature=0)
                for i, n in enumerate([2, 14, 3, 1, 6, 2, 4])]
    widths, puts = [], []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, *a, **k: (widths.append(ids.shape) if k.get("state") is not None
                                                                 else None) or forward(ids, *a, **k))
    from hybrid.models import HybridState
    put = HybridState.put
    monkeypatch.setattr(HybridState, "put", lambda self, rows, src: puts.append(rows.tolist()) or put(self, rows, src))
    done = list(Decoder(model, max_batch=3).run(requests))
    assert sorted(c.index for c in done) == list(range(7))
    assert [c.tokens.numel() for c in sorted(done, key=lambda c: c.index)] == [2, 14, 3, 1, 6, 2, 4]
    assert all(shape[0] <= 3 and shape[1] == 1 for shape in widths)  # decode steps only, at most 3 rows
    assert puts and all(len(rows) >= 1 for rows in puts)  # requests entered running batches
    assert widths[-1][0] == 1  # the last request alone, after the batch shrank
    assert all(c.finished >= c.started for c in done)


@pytest.mark.parametrize("request_, match", [
    (Request(prompt=[], max_new_tokens=2), r"^requests\[1\]\.prompt: expected a prompt of at least one token"),
    (Request(prompt=[1], max_new_tokens=-1), r"^requests\[1\]\.max_new_tokens: expected an int >= 0, got -1$"),
    (Request(prompt=[1], max_new_tokens=2, top_p=2.0), r"^requests\[1\]\.top_p: expected a number in \(0, 1\]"),
    (Request(prompt=[1], max_new_tokens=2, stop_token=VOCAB), r"^requests\[1\]\.stop_token: expected an int >= 0"),
    ("text", r"^requests\[1\]: expected a Request, got str$"),
    (Request(prompt="abc", max_new_tokens=2), r"^requests\[1\]\.prompt: expected a sequence of token ids, got a str "
                                              r"\(encode text with a tokenizer first\)$"),
    (Request(prompt=[1.7, 2.9], max_new_tokens=2),
     r"^requests\[1\]\.prompt: expected a sequence of int token ids, got torch.float32 values$"),
    (Request(prompt=torch.tensor([1.0, 2.0]), max_new_tokens=2),
     r"^requests\[1\]\.prompt: expected an int64 tensor of shape \(T,\), got torch.float32$"),
    (Request(prompt=[[1, 2]], max_new_tokens=2),
     r"^requests\[1\]\.prompt: expected a 1-D sequence of token ids, got shape \(1, 2\)$"),
])
def test_bad_requests_are_one_line_errors_naming_the_request(request_, match, model_of):
    model = model_of(CASES["retnet"])
    with pytest.raises(ValueError, match=match):
        generate_many(model, [Request(prompt=[1, 2], max_new_tokens=1), request_])
    with pytest.raises(ValueError, match=r"^max_batch: expected an int >= 1, got 0$"):
        Decoder(model, max_batch=0)


def test_a_prompt_of_any_int_form_is_its_ids(model_of):
    model = model_of(CASES["retnet"])
    prompt = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(9))
    want = generate(model, prompt[None], 4, temperature=0)[0, 6:]
    for form in (prompt.tolist(), prompt.int(), prompt):
        (got,) = generate_many(model, [Request(prompt=form, max_new_tokens=4, temperature=0)])
        assert torch.equal(got, want), form
