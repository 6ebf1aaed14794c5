"""Prompts of any lengths as one batch (models/decoding/prompts.py, generate with a list or a padded batch): every
preset, a window shorter and longer than the prompts, prompt lengths 1 … 3 × window; each row's logits and greedy
tokens equal its prompt decoded alone. HybridState's row operations at the model level; the input forms."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import HybridConfig, HybridState
from hybrid.models.decoding.prompts import prefill, prompt_list
from hybrid.models.generation import generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 29
WINDOW = 4
LENGTHS = [1, 2, WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW, 3 * WINDOW]  # 1 … 3 × window
TINY = dict(d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB)
CASES = {
    "transformer": HybridConfig.preset("transformer", "tiny", **TINY),
    "retnet": HybridConfig.preset("retnet", "tiny", **TINY),
    "vo-rnn": HybridConfig.preset("vo-rnn", "tiny", **TINY, rnn_selective=True),
    "hybrid-window-shorter": HybridConfig.preset("hybrid", "tiny", **TINY, window=WINDOW),
    "hybrid-window-longer": HybridConfig.preset("hybrid", "tiny", **TINY, window=4 * WINDOW),
    "hybrid-gqa-carope-sinusoidal": HybridConfig.preset("hybrid", "tiny", **{**TINY, "n_heads": 4}, window=WINDOW,
                                                        n_kv_heads=2, carope=True, abs_pos="sinusoidal"),
    "transformer-learned-positions": HybridConfig.preset("transformer", "tiny", **TINY, abs_pos="learned",
                                                         abs_pos_max_len=32),
}


def prompts_of(lengths, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]


def close(got, want, what: str) -> None:
    err = (got - want).abs().max().item()
    assert err <= 1e-9 * want.abs().max().item(), f"{what}: max error {err:.3g}"


@pytest.mark.parametrize("name", list(CASES))
def test_each_row_of_a_ragged_batch_decodes_as_alone(name, float64_model_of):
    model = float64_model_of(CASES[name])
    prompts = prompts_of(LENGTHS)
    forced = torch.randint(0, VOCAB, (len(prompts), 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first, state = prefill(model, prompts)  # one packed forward
        assert state.ragged and state.offset.tolist() == LENGTHS
        steps = [first[:, None]]
        for t in range(3):  # decode steps, one forward for the batch
            logits, state = model(forced[:, t:t + 1], state=state)
            steps.append(logits)
        logits, state = model(forced[:, 3:], state=state, mode="chunked", chunk_size=1)  # and a chunk
        steps.append(logits)
        got = torch.cat(steps, dim=1)  # (B, 6, V): after the prompt, then after each forced token
        for b, p in enumerate(prompts):
            want, _ = model(torch.cat([p, forced[b]])[None])
            close(got[b], want[0, len(p) - 1:], f"{name}, prompt of {len(p)}")
    tokens = generate(model, prompts, 6, temperature=0)
    for b, p in enumerate(prompts):
        assert torch.equal(tokens[b], generate(model, p[None], 6, temperature=0)[0]), f"{name}, prompt of {len(p)}"


@pytest.mark.parametrize("with_eos", [False, True])
def test_a_seeded_ragged_batch_samples_the_same_tokens_in_every_mode(with_eos, float64_model_of):
    """The recomputing modes pick the rows' tokens together, as the recurrent loop does: the same seeded tokens,
    ragged or not (each row decoded on its own, one after another, drew from the generator in another order)."""
    model = float64_model_of(CASES["hybrid-window-shorter"])
    equal, ragged = prompts_of([5, 5, 5], seed=1), prompts_of([2, 7, 5], seed=1)

    def sample(prompts, mode, eos=None):
        return generate(model, prompts, 6, mode=mode, temperature=0.9, eos_token_id=eos,
                        generator=torch.Generator().manual_seed(3))
    eos = int(sample(torch.stack(equal), "recurrent")[0, 6]) if with_eos else None  # row 0 ends at its 2nd token
    want = sample(torch.stack(equal), "recurrent", eos)
    for mode in ("recurrent", "parallel", "chunked"):
        assert torch.equal(sample(torch.stack(equal), mode, eos), want), mode
        rows = sample(equal, mode, eos)  # each row cut after its eos; the padded batch repeats eos past it
        assert len(rows[0]) == (7 if with_eos else 11)
        assert torch.equal(torch.stack([torch.cat([r, r.new_full((11 - len(r),), eos or 0)]) for r in rows]), want)
        assert [r.tolist() for r in sample(ragged, mode, eos)] == [r.tolist() for r in sample(ragged, "recurrent", eos)]


def test_padded_batches_and_lists_give_the_same_rows(float64_model_of):
    model = float64_model_of(CASES["hybrid-window-shorter"])
    prompts = prompts_of([3, 9, 1, 6], seed=2)
    T = max(len(p) for p in prompts)
    left, right = torch.zeros(4, T, dtype=torch.long), torch.zeros(4, T, dtype=torch.long)
    mask = torch.zeros(4, T, dtype=torch.long)
    for b, p in enumerate(prompts):
        left[b, T - len(p):], right[b, :len(p)], mask[b, T - len(p):] = p, p, 1
    want = generate(model, prompts, 5, temperature=0, chunk_size=2, prefill="chunked")
    for got in (generate(model, left, 5, temperature=0, attention_mask=mask),
                generate(model, right, 5, temperature=0, lengths=[len(p) for p in prompts]),
                generate(model, [p.tolist() for p in prompts], 5, temperature=0)):
        assert [g.tolist() for g in got] == [w.tolist() for w in want]
    # equal lengths keep one position for the batch; eos ends each row on its own
    same = generate(model, prompts_of([5, 5], seed=3), 4, temperature=0)
    assert all(len(s) == 9 for s in same)
    eos = int(want[1][9])  # the first token prompt 1 produces
    stopped = generate(model, prompts, 5, temperature=0, eos_token_id=eos)
    assert stopped[1].tolist() == want[1][:10].tolist()


def test_a_slot_takes_a_new_prompt_and_rows_can_be_dropped(float64_model_of):
    """HybridState.put writes a prompt's state into a row of a running ragged batch; select keeps rows."""
    model = float64_model_of(CASES["hybrid-gqa-carope-sinusoidal"])
    prompts = prompts_of([2, 7, 4], seed=4)
    newcomer = prompts_of([9], seed=5)[0]
    with torch.no_grad():
        _, state = prefill(model, prompts)
        _, state = model(torch.tensor([[1], [2], [3]]), state=state)
        _, fresh = prefill(model, [newcomer])
        state = state.put(torch.tensor([1]), fresh)
        assert state.offset.tolist() == [3, 9, 5]
        state = state.select(torch.tensor([2, 1]))
        logits, _ = model(torch.tensor([[4], [5]]), state=state)
        want_0, _ = model(torch.cat([prompts[2], torch.tensor([3, 4])])[None])
        want_1, _ = model(torch.cat([newcomer, torch.tensor([5])])[None])
    close(logits[0, 0], want_0[0, -1], "kept row")
    close(logits[1, 0], want_1[0, -1], "new row")


@pytest.mark.parametrize("call, match", [
    (lambda m: generate(m, [], 2), r"^input_ids: expected a \(B, T\) tensor or a non-empty list of token sequences, "
                                   r"got an empty list$"),
    (lambda m: generate(m, [[1, 2], []], 2), r"^input_ids\[1\]: expected a prompt of at least one token"),
    (lambda m: generate(m, [[1, 99]], 2), r"^input_ids\[0\]: expected token ids in \[0, 29\), got values in \[1, 99\]$"),
    (lambda m: m.generate("abc", 2), r"^input_ids: expected a \(B, T\) tensor or a non-empty list of token sequences "
                                     r"\(token ids\), got a str \(encode text with a tokenizer first\)$"),
    (lambda m: generate(m, ["abc"], 2), r"^input_ids\[0\]: expected a sequence of token ids, got a str"),
    (lambda m: generate(m, [[1, 2], [1.7, 2.9]], 2),
     r"^input_ids\[1\]: expected a sequence of int token ids, got torch.float32 values$"),
    (lambda m: generate(m, [[True, False]], 2),
     r"^input_ids\[0\]: expected a sequence of int token ids, got torch.bool values$"),
    (lambda m: generate(m, [torch.tensor([1.7, 2.9])], 2),
     r"^input_ids\[0\]: expected an int64 tensor of shape \(T,\), got torch.float32$"),
    (lambda m: generate(m, [torch.tensor([1, 0]).bool()], 2),
     r"^input_ids\[0\]: expected an int64 tensor of shape \(T,\), got torch.bool$"),
    (lambda m: generate(m, torch.zeros(2, 3, dtype=torch.long), 2, attention_mask=torch.ones(2, 4)),
     r"^attention_mask: expected a \(B, T\) = \(2, 3\) tensor of 0 and 1, got \(2, 4\)$"),
    (lambda m: generate(m, torch.zeros(2, 3, dtype=torch.long), 2, lengths=[1, 4]),
     r"^lengths: expected 2 ints in \[0, 3\] \(each row's prompt length\), got \[1, 4\]$"),
    (lambda m: generate(m, [[1]], 2, attention_mask=torch.ones(1, 1)), r"^attention_mask: expected None with a list"),
    (lambda m: m(torch.zeros(2, 1, dtype=torch.long), state=HybridState(m.init_state(2).layers, torch.tensor([1, 2, 3]))),
     r"^state: expected per-row positions of shape \(2,\) \(one per input row\), got \(3,\)$"),
])
def test_input_errors_are_one_line(call, match, model_of):
    with pytest.raises(ValueError, match=match):
        call(model_of(CASES["hybrid-window-shorter"]))


def test_prompt_list_reads_every_form():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    assert [p.tolist() for p in prompt_list(ids, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]))] == [[5, 6], [7, 8, 9]]
    assert [p.tolist() for p in prompt_list(ids, lengths=torch.tensor([1, 3]))] == [[0], [7, 8, 9]]
    assert [p.tolist() for p in prompt_list([[1, 2], torch.tensor([3])])] == [[1, 2], [3]]
    ids = torch.randint(0, 100, (5,), generator=torch.Generator().manual_seed(4))
    for form in (ids.tolist(), ids.int(), ids.to(torch.int16), tuple(ids.tolist())):  # any ints, never truncated
        (got,) = prompt_list([form])
        assert got.dtype == torch.int64 and torch.equal(got, ids), form
