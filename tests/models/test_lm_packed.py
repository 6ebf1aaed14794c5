"""HybridLM on packed sequences (``cu_seqlens``): packed equals separate, in every mode, with states and gradients.

Every model runs in float64, so "equal" means equal to float64 rounding (relative 1e-9 of the logit scale).
"""
from __future__ import annotations

import random

import pytest
import torch

from hybrid.models import HybridConfig

VOCAB = 37


def random_config(rng: random.Random) -> HybridConfig:
    """A small random config over the options that touch positions and states."""
    n_heads = rng.choice([1, 2])
    head_dim = rng.choice([4, 6])
    placement = rng.choice(["qk", "vo", "qkvo", "q", "o", "qkv"])
    abs_pos = rng.choice([None, "sinusoidal", "learned"])
    return HybridConfig(
        vocab_size=VOCAB, d_model=n_heads * head_dim + rng.choice([0, 2]), n_heads=n_heads, head_dim=head_dim,
        n_layers=rng.choice([2, 3]), pattern="".join(rng.choice("RAM") for _ in range(rng.choice([2, 3]))),
        n_kv_heads=rng.choice([None, 1]) if n_heads > 1 else None, window=rng.choice([None, 3, 5]),
        rope_placement=placement, rope_layout=rng.choice(["interleaved", "half"]),
        carope=rng.random() < 0.25, rnn_selective=rng.random() < 0.5,
        rnn_phase=rng.choice([None, "learned", "carope", "data"]), retention_chunk=rng.choice([3, 4, 64]),
        abs_pos=abs_pos, abs_pos_max_len=64 if abs_pos == "learned" else None,
    )


CONFIGS = [HybridConfig.preset(name, "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB,
                               window=(4 if name == "hybrid" else None))
           for name in ("transformer", "retnet", "vo-rnn", "hybrid")]
CONFIGS += [random_config(random.Random(seed)) for seed in range(8)]
IDS = [c.meta.get("preset", f"random{i}-{c.pattern}-w{c.window}") for i, c in enumerate(CONFIGS)]


def lengths_around(edges: list[int], rng: random.Random, n_docs: int) -> list[int]:
    """Document lengths with boundaries at, one before and one after the given edges, plus 1s and 2s."""
    lengths = [1, 2]
    for e in edges:
        lengths += [e, e - 1 if e > 1 else 1, e + 1]
    lengths += [rng.randint(1, 9) for _ in range(n_docs)]
    rng.shuffle(lengths)
    return lengths


def cu_of(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())


def assert_close(actual, expected, what, rel=1e-9):
    scale = max(expected.abs().max().item(), 1e-30)
    err = (actual - expected).abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel:g} × scale {scale:.3g}"


def separate(model, ids, cu, **kw):
    bounds = cu.tolist()
    out = [model(ids[:, a:b], **kw) for a, b in zip(bounds, bounds[1:])]
    return torch.cat([o[0] for o in out], dim=1), [o[1] for o in out]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_packed_equals_separate_in_every_mode(config, one_torch_thread, float64_model_of):
    rng = random.Random(len(config.pattern))
    model = float64_model_of(config)
    lengths = lengths_around([4], rng, 2)  # with chunks of 3, 4 and 5: document edges at, before and after chunk edges
    cu = cu_of(lengths)
    ids = torch.randint(0, VOCAB, (1, int(cu[-1])), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, expected_states = separate(model, ids, cu)
        parallel, states = model(ids, cu_seqlens=cu)
        assert_close(parallel, expected, "parallel")
        for chunk in (3, 4, 5):  # chunk edges at, before and after document edges
            chunked, chunk_states = model(ids, mode="chunked", chunk_size=chunk, cu_seqlens=cu)
            assert_close(chunked, expected, f"chunked({chunk})")
        recurrent, rec_states = model(ids, mode="recurrent", cu_seqlens=cu)
        assert_close(recurrent, expected, "recurrent")
        quiet, none = model(ids, cu_seqlens=cu, output_final_state=False)
        assert none is None
        assert_close(quiet, expected, "output_final_state=False")
        # every mode's per-sequence states continue each sequence as its own state does
        more = torch.randint(0, VOCAB, (1, 3), generator=torch.Generator().manual_seed(2))
        for name, got in (("parallel", states), ("chunked", chunk_states), ("recurrent", rec_states)):
            assert len(got) == len(lengths) and [s.offset for s in got] == lengths
            for n in (0, len(lengths) // 2, len(lengths) - 1):
                want, _ = model(more, state=expected_states[n].clone())
                have, _ = model(more, state=got[n].clone())
                assert_close(have, want, f"{name} state of sequence {n}")


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_packed_continues_per_sequence_states(config, one_torch_thread, float64_model_of):
    """Packed prefixes, then packed continuations from the per-sequence states (chunked prefill of a batch)."""
    rng = random.Random(7)
    model = float64_model_of(config, seed=1)
    firsts = [rng.randint(1, 7) for _ in range(5)]
    seconds = [rng.randint(1, 7) for _ in range(5)]
    full = [a + b for a, b in zip(firsts, seconds)]
    docs = [torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(10 + i)) for i, n in enumerate(full)]
    with torch.no_grad():
        expected = [model(d)[0] for d in docs]
        head = torch.cat([d[:, :a] for d, a in zip(docs, firsts)], dim=1)
        tail = torch.cat([d[:, a:] for d, a in zip(docs, firsts)], dim=1)
        _, states = model(head, cu_seqlens=cu_of(firsts))
        states[2] = None  # a sequence may also start afresh: its tail is then a document of its own
        for mode in ("parallel", "chunked", "recurrent"):
            logits, _ = model(tail, mode=mode, chunk_size=4, cu_seqlens=cu_of(seconds),
                              state=[None if s is None else s.clone() for s in states])
            bounds = cu_of(seconds).tolist()
            for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
                want = model(docs[n][:, firsts[n]:])[0] if n == 2 else expected[n][:, firsts[n]:]
                assert_close(logits[:, a:b], want, f"{mode}: continuation of sequence {n}")


@pytest.mark.parametrize("config", CONFIGS[:4] + CONFIGS[6:8], ids=IDS[:4] + IDS[6:8])
def test_packed_gradients_equal_separate(config, one_torch_thread, float64_model_of):
    model = float64_model_of(config, seed=2).train()
    lengths = [1, 5, 2, 4, 3]
    cu = cu_of(lengths)
    ids = torch.randint(0, VOCAB, (1, int(cu[-1])), generator=torch.Generator().manual_seed(3))
    weights = torch.randn(1, int(cu[-1]), VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    logits, _ = model(ids, cu_seqlens=cu, output_final_state=False)
    packed = torch.autograd.grad((logits * weights).sum(), list(model.parameters()), allow_unused=True)
    sep, _ = separate(model, ids, cu, output_final_state=False)
    alone = torch.autograd.grad((sep * weights).sum(), list(model.parameters()), allow_unused=True)
    for (name, _), g, h in zip(model.named_parameters(), packed, alone):
        if g is None or h is None:
            assert g is None and h is None, name
            continue
        assert_close(g, h, f"grad of {name}", rel=1e-8)


def test_the_loaders_windows_reach_the_scan_as_rows(one_torch_thread, float64_model_of, monkeypatch):
    """A training batch packed by documents (``pack_documents``, handed over as the trainer does) reaches every R
    layer's scan as one row per window, not one row of the whole batch (B times the GPU kernel's parallelism);
    logits and gradients are those of the same batch run as one row."""
    from hybrid.kernels.complex_scan import interface
    from hybrid.kernels.varlen import PackedOffsets
    from hybrid.train.data.packing import pack_documents, packed_on_device

    model = float64_model_of(CONFIGS[3], seed=5).train()  # the hybrid: R, A with a window
    B, L, eos = 3, 11, 0
    x = torch.randint(1, VOCAB, (B, L), generator=torch.Generator().manual_seed(6))
    x[0, 4], x[2, 1], x[2, 7] = eos, eos, eos  # documents inside the windows too
    ids, _, cu = pack_documents(x, x, eos)
    offsets = packed_on_device(cu, torch.device("cpu"), compiled=False)
    one_row = PackedOffsets(offsets.cu_seqlens, offsets.bounds, offsets.max_len)  # row_len unknown
    weights = torch.randn(1, B * L, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    seen = []
    real_scan = interface._scan
    monkeypatch.setattr(interface, "_scan", lambda v, *a: seen.append(tuple(v.shape[:2])) or real_scan(v, *a))
    results = []
    for given in (offsets, one_row):
        logits, _ = model(ids, cu_seqlens=given, output_final_state=False)
        results.append((logits, torch.autograd.grad((logits * weights).sum(), list(model.parameters()))))
    n_r = 2  # RRA: two R layers
    assert offsets.row_len == L and seen == [(B, L)] * n_r + [(1, B * L)] * n_r
    (rows_logits, rows_grads), (row_logits, row_grads) = results
    assert_close(rows_logits, row_logits, "logits", rel=1e-12)
    for (name, _), g, h in zip(model.named_parameters(), rows_grads, row_grads):
        assert_close(g, h, f"grad of {name}", rel=1e-12)


def test_padding_document_changes_nothing_else(one_torch_thread, float64_model_of):
    """A document of padding (any tokens) between two others leaves their logits and gradients as they were."""
    config = CONFIGS[3]  # the hybrid: R, A with a window
    model = float64_model_of(config, seed=3).train()
    a, b = torch.randint(0, VOCAB, (1, 6)), torch.randint(0, VOCAB, (1, 5))
    for pad in (torch.zeros(1, 4, dtype=torch.long), torch.randint(0, VOCAB, (1, 9))):
        ids = torch.cat([a, pad, b], dim=1)
        cu = cu_of([6, pad.shape[1], 5])
        logits, _ = model(ids, cu_seqlens=cu, output_final_state=False)
        real = torch.cat([logits[:, :6], logits[:, 6 + pad.shape[1]:]], dim=1)
        grads = torch.autograd.grad(real.square().sum(), list(model.parameters()))
        ref, _ = model(torch.cat([a, b], dim=1), cu_seqlens=cu_of([6, 5]), output_final_state=False)
        ref_grads = torch.autograd.grad(ref.square().sum(), list(model.parameters()))
        assert_close(real, ref, "logits beside a padding document")
        for g, h in zip(grads, ref_grads):
            assert_close(g, h, "gradients beside a padding document", rel=1e-8)


@pytest.mark.parametrize("bad,message", [
    (torch.tensor([1, 5, 10]), "cu_seqlens: expected offsets starting at 0"),
    (torch.tensor([0, 6, 5, 10]), "cu_seqlens: expected strictly increasing"),
    (torch.tensor([0, 5, 9]), "cu_seqlens: expected offsets ending at total_T=10"),
    (torch.tensor([0.0, 5.0, 10.0]), "cu_seqlens: expected an int64"),
    (torch.tensor([[0, 5, 10]]), "cu_seqlens: expected a 1-D tensor"),
    ([0, 5, 10], "cu_seqlens: expected a LongTensor"),
])
def test_bad_cu_seqlens_is_one_line(bad, message, float64_model_of):
    model = float64_model_of(CONFIGS[3])
    with pytest.raises(ValueError) as info:
        model(torch.zeros(1, 10, dtype=torch.long), cu_seqlens=bad)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_packed_batch_must_be_one_row(float64_model_of):
    model = float64_model_of(CONFIGS[3])
    with pytest.raises(ValueError, match="^cu_seqlens: expected a packed batch of shape \\(1, total_T, …\\), got batch size 2$"):
        model(torch.zeros(2, 10, dtype=torch.long), cu_seqlens=torch.tensor([0, 5, 10]))


@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[3], CONFIGS[4]], ids=[IDS[1], IDS[3], IDS[4]])
def test_chunked_prefill_at_every_chunk_length(config, one_torch_thread, float64_model_of):
    """fla #1140: chunked prefill equals one full pass at every chunk length, and so do the per-sequence
    final states (each continues its sequence as the full pass's state does)."""
    model = float64_model_of(config, seed=4)
    lengths = [2, 1, 6, 3, 5]
    cu = cu_of(lengths)
    ids = torch.randint(0, VOCAB, (1, int(cu[-1])), generator=torch.Generator().manual_seed(8))
    more = torch.randint(0, VOCAB, (1, 2), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        full, full_states = model(ids, cu_seqlens=cu)
        want = [model(more, state=s.clone())[0] for s in full_states]
        for chunk in range(1, int(cu[-1]) + 1):
            logits, states = model(ids, mode="chunked", chunk_size=chunk, cu_seqlens=cu)
            assert_close(logits, full, f"chunk {chunk}")
            for n, s in enumerate(states):
                assert s.offset == lengths[n]
                assert_close(model(more, state=s.clone())[0], want[n], f"chunk {chunk}: state of sequence {n}")


def test_per_sequence_states_must_match_the_sequences(float64_model_of):
    model = float64_model_of(CONFIGS[3])
    ids = torch.zeros(1, 10, dtype=torch.long)
    with pytest.raises(ValueError, match="^state: expected None or a list of N=2 per-sequence HybridStates with "
                                         "cu_seqlens, got a list of 3$"):
        model(ids, cu_seqlens=torch.tensor([0, 5, 10]), state=[None, None, None])
    with pytest.raises(ValueError, match="^state: expected a HybridState or None, got int$"):
        model(ids, cu_seqlens=torch.tensor([0, 5, 10]), state=[None, 3])


def test_learned_positions_serve_a_packed_batch_longer_than_their_table(one_torch_thread, float64_model_of):
    """Every document fits the table (max_len 8) while the batch (22 tokens) does not: packed equals separate;
    a document longer than the table is still refused, naming the position."""
    config = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB, window=4,
                                 abs_pos="learned", abs_pos_max_len=8)
    model = float64_model_of(config)
    cu = cu_of([8, 5, 1, 8])
    ids = torch.randint(0, VOCAB, (1, int(cu[-1])), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, _ = separate(model, ids, cu)
        assert_close(model(ids, cu_seqlens=cu)[0], expected, "parallel")
        assert_close(model(ids, mode="chunked", chunk_size=5, cu_seqlens=cu)[0], expected, "chunked(5)")
        with pytest.raises(ValueError, match=r"^positions: learned absolute positions cover 0 … 7 \(abs_pos_max_len\), "
                                             r"got positions up to 8$"):
            model(ids[:, :10], cu_seqlens=cu_of([9, 1]))
